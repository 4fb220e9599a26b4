"""The harness every peer program of scripts/bench-peers.sh shares, and the
same one examples/bench_peers.rs follows on the crate's side.

A peer program defines

    def build(middleware: int, latency: float) -> Callable[[int], Awaitable[str]]

which returns an async function doing one whole run of the workload (model ->
tool -> model -> tool -> model on an in-process fake model that answers after
`latency` seconds, with `middleware` no-op middleware) and returning the final
answer, and calls `main(name, version, build)`.

The measurements, in this order, in one process:

1. `concurrent`: after a few warm-up runs, 1,000 runs at once on a model that
   answers after 50 ms; the wall time, and the peak resident memory over the
   resident memory before (VmHWM - VmRSS from /proc/self/status) per run. The
   peak is reset to the current resident memory (writing "5" to
   /proc/self/clear_refs) right before, so a higher peak of the imports or
   the warm-up cannot hide the runs' growth.
2. `per_run`: runs one after the other on a model that answers at once, with
   0 and with 8 middleware, alternating, in samples of at least 0.5 s; the
   median of the samples' mean time per run.

It prints one JSON object on stdout.
"""

import asyncio
import gc
import json
import statistics
import sys
import time
from typing import Awaitable, Callable

CONCURRENT = 1000
LATENCY = 0.05
MIDDLEWARE = 8
SAMPLES = 5
SAMPLE_SECONDS = 0.5
MODEL_CALLS = 3


def status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Resets VmHWM to the current VmRSS (Linux 4.0+): the peak from here on."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")


async def concurrent(build) -> dict:
    run = build(0, LATENCY)
    for i in range(10):
        assert await run(i) == "done"
    gc.collect()
    reset_peak()
    before = status_kb("VmRSS")
    start = time.perf_counter()
    answers = await asyncio.gather(*(run(i) for i in range(CONCURRENT)))
    wall = time.perf_counter() - start
    peak = status_kb("VmHWM")
    assert all(a == "done" for a in answers)
    return {
        "concurrent_runs": CONCURRENT,
        "model_latency_ms": LATENCY * 1000,
        "wall_ms": wall * 1000,
        "kb_per_run": (peak - before) / CONCURRENT,
    }


async def sample(run, seconds: float) -> float:
    """Mean seconds per run over at least `seconds`."""
    n = 0
    start = time.perf_counter()
    while True:
        for _ in range(10):
            await run(n)
            n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / n


async def per_run(build) -> dict:
    bare = build(0, 0.0)
    layered = build(MIDDLEWARE, 0.0)
    for run in (bare, layered):
        for i in range(50):
            assert await run(i) == "done"
    times = {0: [], MIDDLEWARE: []}
    for _ in range(SAMPLES):
        times[0].append(await sample(bare, SAMPLE_SECONDS))
        times[MIDDLEWARE].append(await sample(layered, SAMPLE_SECONDS))
    us0 = statistics.median(times[0]) * 1e6
    us8 = statistics.median(times[MIDDLEWARE]) * 1e6
    return {
        "us_per_run": us0,
        "us_per_run_8_middleware": us8,
        "us_per_middleware_per_model_call": (us8 - us0) / (MIDDLEWARE * MODEL_CALLS),
    }


def main(name: str, version: str, build: Callable[[int, float], Callable[[int], Awaitable[str]]], note: str) -> None:
    async def both() -> dict:
        result = {"peer": name, "version": version, "middleware": note}
        result.update(await concurrent(build))
        result.update(await per_run(build))
        return result

    json.dump(asyncio.run(both()), sys.stdout)
    print()
