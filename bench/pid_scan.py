"""Cost of KIP-936 producer-id accounting: scanning a Produce request, observe() per id, memory per user.

    .venv/bin/python -m bench.pid_scan [--runs N]

Why these numbers: the scan runs on every Produce request of a user with a ``producer_ids_rate`` quota, on the
proxy's single event-loop thread, so its cost per request (and how it grows with partitions, not with bytes)
decides whether the quota is affordable; observe() runs once per distinct id per request; memory per user bounds
what a principal can make the proxy hold. Requests are built with kafka-python's own encoder and record builder
(16 records of 1 KiB per partition, idempotent, one producer id, as a Java producer with linger would send).
Each figure is the median over many timed calls (the machine may be shared; medians resist interference), and
kafka-python's full decode of the same request is shown for scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tracemalloc
import uuid

from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from protocol.record_batches import producer_ids
from quotas.producer_ids import ProducerIdTracker

TD = ProduceRequest.TopicProduceData
PD = TD.PartitionProduceData
RECORD = 1024
RECORDS_PER_PARTITION = 16


def _batch(pid: int) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 22, producer_id=pid, producer_epoch=0, base_sequence=0)
    for i in range(RECORDS_PER_PARTITION):
        b.append(1_700_000_000_000 + i, b"key-%d" % i, os.urandom(RECORD))
    b.close()
    return bytes(b.buffer())


def _request(version: int, partitions: int) -> bytes:
    batch = _batch(123_456)
    msg = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            TD(
                name="bench",
                topic_id=uuid.uuid4(),
                partition_data=[PD(index=p, records=batch) for p in range(partitions)],
            )
        ],
        version=version,
    )
    return bytes(msg.encode())


def _median_us(fn, runs: int, inner: int = 1) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner / 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; medians of {args.runs} runs\n")

    print("Producer-id scan per Produce request (16 x 1 KiB records per partition, one batch each)")
    cols = ("version", "partitions", "request KiB", "scan µs", "µs/partition", "full decode µs")
    print(" ".join(f"{c:>{w}}" for c, w in zip(cols, (7, 10, 11, 8, 12, 14), strict=True)))
    for version in (7, 11, 13):
        for parts in (1, 50):
            body = _request(version, parts)
            mv = memoryview(body)
            assert producer_ids(mv, version) == {123_456}
            scan = _median_us(lambda mv=mv, v=version: producer_ids(mv, v), args.runs, inner=10 if parts == 1 else 1)
            decode = _median_us(lambda b=body, v=version: ProduceRequest.decode(b, version=v), max(20, args.runs // 20))
            kib = len(body) / 1024
            print(f"{version:>7} {parts:>10} {kib:>11.0f} {scan:>8.1f} {scan / parts:>12.2f} {decode:>14.0f}")

    print("\nobserve() per id (default config)")
    t = ProducerIdTracker()
    for pid in range(500):
        t.observe("user", pid, 0)
    new_ids = iter(range(10**6, 10**9))
    known = _median_us(lambda: t.observe("user", 7, 1), args.runs, inner=20)
    fresh = _median_us(lambda: t.observe("fresh-user", next(new_ids), 1), min(args.runs, 25), inner=20)
    print(f"  known id: {known:.2f} µs    new id (written): {fresh:.2f} µs")

    print("\nMemory per user (default config: expected_ids=1000, false_positive_rate=0.01)")
    tracker = ProducerIdTracker()
    print(
        f"  bloom bits {tracker.bits}, hashes {tracker.hashes}, bit array {tracker.filter_bytes} B per filter, "
        f"bound {tracker.max_bytes_per_user} B of bit arrays per user"
    )
    users = 2000
    for filters, label in ((1, "one filter (first half window)"), (2, "two filters (steady state)")):
        tr = ProducerIdTracker()
        tracemalloc.start()
        names = [f"user-{u:06d}" for u in range(users)]
        base, _ = tracemalloc.get_traced_memory()  # the names are the caller's, not the tracker's
        for name in names:
            tr.observe(name, 1, 0)
        if filters == 2:  # the proxy's clock only moves forward: second round after half a window
            for name in names:
                tr.observe(name, 2, tr.config.window_ms // 2)
        used, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(
            f"  {label}: reported {tr.memory_bytes() / users:.0f} B/user, measured (tracemalloc, incl. Python "
            f"objects, dict and expiry queue) {(used - base) / users:.0f} B/user"
        )


if __name__ == "__main__":
    main()
