"""Every walk over a client's bytes, fuzzed by the million in process (issue #35): real connections with the real
policy (every quota kind on, the topic guard on), stand-in sockets, no cluster.

    .venv/bin/python -m bench.fuzz_walks [--frames 3000000] [--seed 35] [--show 5]

The cases are ``tests/harness/fuzz_frames.py``'s: a request of every API kafka-python has a schema for, in every
version, naming a protected topic and a plain one; Produce with real record batches (one past the small-frame
size, read as a view); SASL handshakes and first tokens of every mechanism, raw tokens after a SaslHandshake v0.
First each case whole and cut at every offset, on a fresh connection and after the same request whole (the
memos of the last request's shape), in Kafka's enforcement and in smooth enforcement; then mutations, round-robin
over the cases and both modes, until ``--frames`` fuzzed frames have been read. Printed: fuzzed frames, the
connections closed (malformed), and what the contract forbids (ERROR or traceback lines, "cannot process",
event-loop errors such as a task destroyed while pending, tasks outliving their connection), with the first
``--show`` cases that broke it. Exit status 1 when anything did. The unit suite runs a share of the same
(``tests/unit/test_request_fuzz.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import subprocess
import time
from collections.abc import Iterator

from tests.harness.fuzz_frames import Case, Failure, FuzzRig, mutations, truncations, valid_cases


def _cases(valid: list[Case], rng: random.Random) -> Iterator[tuple[str, Case]]:
    """(phase, case): every case whole and cut at every offset, then mutations without end."""
    for case in valid:
        yield "whole", case
        for cut in truncations(case):
            yield "truncated", cut
    while True:
        for case in valid:
            for m in mutations(case, rng, 1):
                yield "mutated", m


async def _run(frames: int, seed: int, show: int) -> tuple[collections.Counter[str], list[str], float]:
    valid = valid_cases()
    counts: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    rigs = [FuzzRig(smooth=False), FuzzRig(smooth=True)]
    streams = [_cases(valid, random.Random(seed)), _cases(valid, random.Random(seed + 1))]
    t0 = time.monotonic()
    for rig in rigs:
        rig.__enter__()
    try:
        i = 0
        while counts["frames"] < frames:
            k = i % 2
            i += 1
            rig = rigs[k]
            phase, case = next(streams[k])
            try:
                await rig.run(case)
            except Failure as exc:
                counts["failures"] += 1
                if len(failures) < show:
                    failures.append(str(exc))
                rig.reset()
            counts["frames"] += 1
            counts[phase] += 1
            counts["frames incl. SASL steps and warm-ups"] += len(case.frames)
        for rig in rigs:
            try:
                await rig.settle()
            except Failure as exc:
                counts["failures"] += 1
                failures.append(str(exc))
    finally:
        for rig in rigs:
            rig.__exit__(None, None, None)
    counts["closed"] = sum(r.closed for r in rigs)
    return counts, failures, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=3_000_000, help="fuzzed frames to read (default 3,000,000)")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--show", type=int, default=5, help="failures to print")
    args = ap.parse_args(argv)
    counts, failures, elapsed = asyncio.run(_run(args.frames, args.seed, args.show))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"# bench.fuzz_walks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"`python -m bench.fuzz_walks --frames {args.frames} --seed {args.seed}`\n")
    print("| figure | value |")
    print("|---|---|")
    print(
        f"| fuzzed frames read (whole / truncated / mutated) | {counts['frames']:,} ({counts['whole']:,} / "
        f"{counts['truncated']:,} / {counts['mutated']:,}) |"
    )
    print(f"| frames incl. SASL steps and warm-ups | {counts['frames incl. SASL steps and warm-ups']:,} |")
    print(f"| connections closed as malformed | {counts['closed']:,} |")
    print(f"| frames per second | {counts['frames'] / elapsed:,.0f} |")
    print(f"| cases that broke the contract (traceback, ERROR, pending task, loop error) | {counts['failures']} |")
    for f in failures:
        print(f"\n    {f}")
    return 1 if counts["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
