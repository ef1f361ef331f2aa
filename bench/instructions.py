"""Instructions per Produce round trip, counted by valgrind's callgrind: a load-independent figure.

Why: on this shared machine ``bench.request_cpu``'s CPU µs move by ±10 % with the load; a change worth 1 µs is
lost in that. Callgrind counts the instructions the interpreter executes, which do not depend on load. Each
side runs in two processes that differ only in the number of round trips (``--small`` and ``--large``, after
the same frames are built and the same warm-up), so startup, imports and frame building cancel out of the
difference. Slow (valgrind runs ~50x slower): about a minute per side.

    .venv/bin/python -m bench.instructions [--small 200] [--large 1200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile

from bench.produce_walk import EVERY_QUOTA
from tests.harness.connection_rig import ConnectionRig, produce_request, produce_response

SIDES = {"no quota": {}, "every quota, none binding": EVERY_QUOTA}


async def _run(quotas: dict, frames: int, run: int) -> None:
    h = ConnectionRig(quotas)
    built = [(produce_request(c), produce_response(c)) for c in range(1, frames + 1)]
    for c in range(1, 51):  # warm, as bench.request_cpu
        h.round_trip(c, *built[c - 1])
    for c in range(51, 51 + run):
        h.round_trip(c, *built[c - 1])
    h.conn.close()


def _count(side: str, frames: int, run: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                "-m",
                "bench.instructions",
                "--child",
                side,
                str(frames),
                str(run),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            check=True,
        )
    m = re.search(r"Collected : (\d+)", out.stderr)
    if m is None:
        raise SystemExit(f"callgrind printed no count:\n{out.stderr[-2000:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=1200)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        side, frames, run = args.child
        asyncio.run(_run(SIDES[side], int(frames), int(run)))
        return
    frames = 50 + args.large
    results = {}
    for side in SIDES:
        small, large = _count(side, frames, args.small), _count(side, frames, args.large)
        results[side] = (large - small) / (args.large - args.small)
    print_table(results, "instructions per Produce round trip")


def print_table(results: dict[str, float], what: str) -> None:
    """Per side (no quota first, every quota second) the count, as a markdown table, and their ratio."""
    print(f"| side | {what} |")
    print("|---|---:|")
    for side, n in results.items():
        print(f"| {side} | {n:,.0f} |")
    plain, quotas = results.values()
    print(f"quotas / plain: {quotas / plain:.3f}")


if __name__ == "__main__":
    main()
