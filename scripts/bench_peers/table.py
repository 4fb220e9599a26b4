"""Reads the JSON lines of the peer programs (the crate's first) on stdin and
prints one Markdown table: time per run, time per middleware per model call,
memory per concurrent run, the wall time of the concurrent runs, and each
peer's ratio to the crate."""

import json
import sys


def ratio(value: float, ours: float) -> str:
    if ours <= 0:
        return "–"
    return f"{value / ours:,.0f}×" if value / ours >= 10 else f"{value / ours:,.1f}×"


def per_middleware(row: dict, ours: dict, same: bool) -> str:
    value = row["us_per_middleware_per_model_call"]
    if value <= 0:
        # 8 middleware measured no slower than none: below the noise.
        return "within noise | –"
    if same:
        return f"{value:,.2f} | 1×"
    return f"{value:,.2f} | {ratio(value, ours['us_per_middleware_per_model_call'])}"


def main() -> None:
    rows = [json.loads(line) for line in sys.stdin if line.strip()]
    if not rows:
        sys.exit("no results")
    ours = rows[0]
    print(
        "| peer | version | µs / run (0 mw) | ratio | µs / run (8 mw) "
        "| µs / middleware / model call | ratio | KB / concurrent run | ratio "
        "| wall, 1,000 runs on a 50 ms model |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        same = row is ours
        print(
            f"| {row['peer']} | {row['version']} "
            f"| {row['us_per_run']:,.1f} | {'1×' if same else ratio(row['us_per_run'], ours['us_per_run'])} "
            f"| {row['us_per_run_8_middleware']:,.1f} "
            f"| {per_middleware(row, ours, same)} "
            f"| {row['kb_per_run']:,.1f} | {'1×' if same else ratio(row['kb_per_run'], ours['kb_per_run'])} "
            f"| {row['wall_ms']:,.0f} ms |"
        )
    print()
    for row in rows:
        print(f"- {row['peer']}: middleware = {row['middleware']}")


if __name__ == "__main__":
    main()
