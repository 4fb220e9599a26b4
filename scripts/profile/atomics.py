#!/usr/bin/env python3
"""Atomic read-modify-writes per run of one bench case, beside its instructions.

Callgrind counts instructions, and an atomic read-modify-write counts as
one, but on a shared VM one costs about as much as twenty plain ones (an
`Arc` clone and drop, two of them, about 16 ns). This runs a bench binary's
case twice under callgrind with per-instruction counts, matches them against
the binary's `lock`-prefixed and `xchg` instructions (from `objdump`), and
prints, per run: instructions, locked instructions, and the functions that
execute the locked ones.

    python3 scripts/profile/atomics.py target/release/deps/lifecycle-<hash> middleware_1
    python3 scripts/profile/atomics.py target/release/deps/layers-<hash> fallback --runs 2000 12000

The binary must run a case `BENCH_RUNS` times when `BENCH_CASE` names it, as
every bench in `benches/` does. Needs valgrind and objdump (binutils).
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile


def locked_addresses(binary):
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", binary],
        capture_output=True, text=True, check=True,
    ).stdout
    pattern = re.compile(r"^\s+([0-9a-f]+):\s+(lock |xchg)")
    return {int(m.group(1), 16) for m in map(pattern.match, out.splitlines()) if m}


def profile(binary, case, runs, out):
    env = dict(os.environ, BENCH_CASE=case, BENCH_RUNS=str(runs))
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}", binary],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
    )


def read(path, binary_name, locks):
    """(total instructions, locked instructions, locked ones by function)."""
    names, objects = {}, {}
    in_binary, function, address, skip = False, None, 0, False
    total, locked, by_function = 0, 0, collections.Counter()

    def named(table, line, prefix):
        m = re.match(prefix + r"=\((\d+)\)(?: (.*))?", line)
        if m and m.group(2):
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1)) if m else None

    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("summary:"):
            total = int(line.split()[1])
        elif line.startswith("ob="):
            obj = named(objects, line, "ob")
            in_binary = obj is not None and obj.endswith(binary_name)
        elif line.startswith("fn="):
            function = named(names, line, "fn")
        elif line.startswith("cfn="):
            named(names, line, "cfn")
        elif line.startswith("cob="):
            named(objects, line, "cob")
        elif line.startswith("calls="):
            skip = True  # the next cost line is the call's inclusive cost
        elif line and line[0] in "0123456789+-*":
            token = line.split()
            first = token[0]
            if first.startswith("0x"):
                address = int(first, 16)
            elif first.startswith("+"):
                address += int(first[1:], 0)
            elif first.startswith("-"):
                address -= int(first[1:], 0)
            if skip:
                skip = False
                continue
            if in_binary and len(token) >= 3 and address in locks:
                count = int(token[2])
                locked += count
                by_function[function] += count
    return total, locked, by_function


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("case")
    parser.add_argument("--runs", nargs=2, type=int, default=[100, 600], metavar=("FEW", "MANY"))
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    locks = locked_addresses(args.binary)
    name = os.path.basename(args.binary)
    few, many = args.runs
    with tempfile.TemporaryDirectory() as tmp:
        figures = []
        for runs in (few, many):
            out = os.path.join(tmp, f"cg-{runs}.out")
            profile(args.binary, args.case, runs, out)
            figures.append(read(out, name, locks))
    (t1, l1, f1), (t2, l2, f2) = figures
    span = many - few
    print(f"{args.case}: {(t2 - t1) / span:.0f} instructions, {(l2 - l1) / span:.1f} locked, per run")
    rows = sorted(((f2[k] - f1.get(k, 0)) / span, k) for k in f2)
    for per_run, function in reversed(rows[-args.top:]):
        if per_run >= 0.5:
            print(f"  {per_run:5.1f}  {function}")


if __name__ == "__main__":
    sys.exit(main())
