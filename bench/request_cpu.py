"""The proxy's own CPU per Produce round trip, in process: no broker, no client, no kernel.

Why: on 2 shared cores the end-to-end figures of ``bench/run.py`` mix the proxy's CPU with the brokers' and the
clients'; this isolates the Python work the proxy does per request (frame split, header read, session, policy,
quota charges, response rewrite) on the real ``Connection`` with stand-in transports (``tests.harness.connection_rig``),
so a change to the per-request path can be measured to a microsecond. Sides interleave, rounds repeat, medians
and ranges are printed with the load average. ``--profile`` prints the top of a cProfile of the quotas side.

    .venv/bin/python -m bench.request_cpu [--requests N] [--rounds R] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import statistics
import time

from bench.produce_walk import EVERY_QUOTA
from tests.harness.connection_rig import ConnectionRig, produce_request, produce_response

SIDES = {"no quota": {}, "every quota, none binding": EVERY_QUOTA}


def run_side(quotas: dict, requests: int, records: int, prof: cProfile.Profile | None = None) -> float:
    """CPU µs per round trip over ``requests`` Produce requests (each a new batch, as a producer sends)."""
    return asyncio.run(_run_side(quotas, requests, records, prof))


async def _run_side(quotas: dict, requests: int, records: int, prof: cProfile.Profile | None) -> float:
    h = ConnectionRig(quotas, records=records)
    frames = [(produce_request(c, records), produce_response(c)) for c in range(1, requests + 1)]
    for c in range(1, 51):  # warm: per-version tables, first-time allocations
        h.round_trip(c, *frames[c - 1])
    gc.collect()
    gc.disable()
    try:
        if prof is not None:
            prof.enable()
        t0 = time.process_time()
        for c in range(51, requests + 1):
            h.round_trip(c, *frames[c - 1])
        t1 = time.process_time()
        if prof is not None:
            prof.disable()
    finally:
        gc.enable()
    h.conn.close()
    return (t1 - t0) / (requests - 50) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=1, help="records per Produce batch (1 KiB values)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    results: dict[str, list[float]] = {s: [] for s in SIDES}
    for r in range(args.rounds):
        order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
        for side in order:
            results[side].append(run_side(SIDES[side], args.requests, args.records))
    print(
        f"load average {os.getloadavg()[0]:.2f}; {args.rounds} interleaved rounds of {args.requests} Produce "
        f"round trips ({args.records} record(s) per batch)"
    )
    print("| side | CPU µs per round trip, median | range |")
    print("|---|---:|---|")
    for side, v in results.items():
        print(f"| {side} | {statistics.median(v):.1f} | {min(v):.1f}–{max(v):.1f} |")
    plain, quotas = (statistics.median(v) for v in results.values())
    print(f"quotas / plain: {quotas / plain:.3f}")
    if args.profile:
        prof = cProfile.Profile()
        run_side(EVERY_QUOTA, args.requests, args.records, prof)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
