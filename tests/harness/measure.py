"""Measuring what the cluster received or served, never what a client says: the meters the quota tests and the
benchmarks share (``tests/integration/test_byte_rate_quota.py``, ``test_smooth_enforcement.py``, the fleet tests;
``bench.quota_fidelity``, ``bench.isolation``).

How a rate is measured:
  * Produce: the size of the partition's log segment files on the leader's disk (``*.log`` under the broker's
    ``log.dirs``, :func:`log_bytes`), sampled every 0.2 s (:class:`Sampler`). Kafka appends record batches
    exactly as the producer sent them, so the slope of that curve is the rate of record-batch bytes the cluster
    received.
  * Consume: the consumer group's committed offset, read from the cluster (OffsetFetch, straight to the brokers)
    every 0.2 s while the consumer auto-commits every 200 ms (:func:`committed_sampler`), turned into bytes with
    the partition's own batch index (:func:`batch_index`, parsed from the segment files: a fetch serves whole
    batches). Slope = batch bytes served per second.
  * The rate is the least-squares slope over the *steady* part of the run (:func:`steady_rate`). Excluded: the
    start, until the 1 s rate is first within [0.9, 1.3] × quota, plus 1 s. Kafka (and the proxy, which
    reproduces it) pads a young rate's window to (samples − 1) × window = 10 s, so a fresh client may first send
    ~10 s worth of quota at full speed; that burst is Kafka's design, not an error, and a sustained rate is what a
    quota promises. Also excluded: the last 0.5 s (the client winding down).
  * Protocol overhead: Produce is charged its request size (header + body), which is the batch bytes plus ~70 B
    per request with one partition (header, client id, acks, timeout, topic id, partition index, lengths, tags);
    that estimate × the number of batches appended is added back (:func:`produce_rate`, ``Rate.charged``). Fetch
    is charged its response size: batch bytes plus ~90 B per response, i.e. < 0.1 % with the 512 KiB partition
    fetches the consumers of :mod:`tests.harness.traffic` use, left out.

Below them, the arithmetic of samples and latencies (interpolated cumulative counts, whole 1-s slices,
percentiles) and the kernel's dirty page cache, which a benchmark waits on between phases.
"""

from __future__ import annotations

import bisect
import contextlib
import statistics
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.harness.cluster import KafkaCluster

MIB = 1024 * 1024
PRODUCE_REQUEST_OVERHEAD = 70  # bytes a one-partition Produce request adds to its record batch (see docstring)
SAMPLE_S = 0.2


# ------------------------------------------------------------------------------------------ cluster-side meters
def create_topic(cluster: KafkaCluster, topic: str, leaders: list[int]) -> None:
    """A topic with one partition per entry of ``leaders``, replication factor 1, partition i on broker leaders[i]."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=len(leaders), replica_assignment=[[b] for b in leaders])])[
        topic
    ].result(30)
    deadline = time.monotonic() + 30
    while len(topic_dirs(cluster, topic)) < len(leaders):
        if time.monotonic() > deadline:
            raise RuntimeError(f"partition directories of {topic} did not appear")
        time.sleep(0.1)


def topic_dirs(cluster: KafkaCluster, topic: str) -> list[Path]:
    """The partition directories of ``topic`` on every broker's disk, in partition order."""
    found = []
    for b in cluster.brokers:
        for d in (b.dir / "data").glob(f"{topic}-*"):
            if d.name.rpartition("-")[0] == topic and d.name.rpartition("-")[2].isdigit():
                found.append(d)
    return sorted(found, key=lambda d: int(d.name.rpartition("-")[2]))


def log_bytes(dirs: list[Path]) -> int:
    """Record-batch bytes stored in these partition directories (segment files are not preallocated)."""
    total = 0
    for d in dirs:
        for f in d.glob("*.log"):
            with contextlib.suppress(FileNotFoundError):
                total += f.stat().st_size
    return total


def batch_index(partition_dir: Path) -> tuple[list[int], list[int]]:
    """(last offset of each batch, cumulative bytes up to the end of that batch) for one partition."""
    last_offsets: list[int] = []
    ends: list[int] = []
    pos_total = 0
    for seg in sorted(partition_dir.glob("*.log")):
        data = seg.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            (delta,) = struct.unpack_from(">i", data, pos + 23)
            pos += 12 + length
            pos_total += 12 + length
            last_offsets.append(base + delta)
            ends.append(pos_total)
    return last_offsets, ends


def batches_between(index: tuple[list[int], list[int]], lo_bytes: float, hi_bytes: float) -> int:
    """How many batches end within (lo_bytes, hi_bytes]."""
    _, ends = index
    return bisect.bisect_right(ends, hi_bytes) - bisect.bisect_right(ends, lo_bytes)


def offset_to_bytes(index: tuple[list[int], list[int]], offset: int) -> int:
    """Bytes served once a consumer's position is ``offset``: every batch up to the one holding offset − 1."""
    if offset <= 0:
        return 0
    last_offsets, ends = index
    i = bisect.bisect_left(last_offsets, offset - 1)
    return ends[min(i, len(ends) - 1)]


def end_offsets(cluster: KafkaCluster, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "offsets-probe"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        c.close()


class Sampler:
    """Calls ``fn`` every ``interval`` seconds in a thread; ``samples`` holds (monotonic time, value)."""

    def __init__(
        self, fn: Callable[[], float | None], interval: float = SAMPLE_S, close: Callable[[], object] | None = None
    ) -> None:
        self.fn = fn
        self.interval = interval
        self._close = close
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            v = self.fn()
            if v is not None:
                self.samples.append((t, float(v)))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._close is not None:
            self._close()


def committed_sampler(cluster: KafkaCluster, group: str, topic: str, index) -> Sampler:
    """Bytes served to ``group`` on partition 0, from the offset it committed (asked of the cluster directly).

    Asked through a consumer of the group that never joins it (``committed`` needs no membership), not through
    the admin client: librdkafka's admin ``list_consumer_group_offsets`` crashed the process (SIGSEGV in
    ``rd_kafka_cgrp_op`` from ``rd_kafka_handle_OffsetFetch``, an admin client having no group handle) when asked
    on a cluster whose offsets topic was still loading, the first group of a fresh cluster."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})

    def read() -> float | None:
        try:
            tps = reader.committed([TopicPartition(topic, 0)], timeout=5)
        except Exception:  # noqa: BLE001 - the group's coordinator is not ready yet
            return None
        off = tps[0].offset if tps else -1
        return offset_to_bytes(index, off) if off >= 0 else None

    return Sampler(read, close=reader.close)


@dataclass
class Rate:
    """Steady rate from (time, cumulative bytes) samples."""

    rate: float  # bytes/s, least-squares slope over [t0, t1]
    t0: float  # seconds from the first sample
    t1: float
    burst_bytes: float  # bytes before t0
    windows: list[float] = field(default_factory=list)  # rate of each whole 5 s slice of [t0, t1]
    charged: float = 0.0  # rate plus the estimated protocol overhead (Produce only)

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def error(self, quota: float, charged: bool = False) -> float:
        return (self.charged if charged else self.rate) / quota - 1


def _slope(pts: list[tuple[float, float]]) -> float:
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (v - mv) for t, v in pts) / den if den else 0.0


def steady_rate(
    samples: list[tuple[float, float]], quota: float | None, settle_s: float = 1.0, tail_s: float = 0.5
) -> Rate:
    """Slope of the steady part: from when the 1 s rate is first within [0.9, 1.3] × quota (plus ``settle_s``) to
    ``tail_s`` before the last sample that moved. ``quota=None``: from the first movement (unthrottled)."""
    if len(samples) < 5:
        raise ValueError(f"too few samples ({len(samples)})")
    origin = samples[0][0]
    pts = [(t - origin, v) for t, v in samples]
    first_move = next((i for i in range(1, len(pts)) if pts[i][1] > pts[0][1]), 1) - 1
    last_move = max(i for i in range(len(pts)) if pts[i][1] < pts[-1][1] or i == 0) + 1
    end_t = pts[min(last_move, len(pts) - 1)][0] - tail_s
    start_t = pts[first_move][0]
    if quota is not None:
        # Steady from the first time the 1 s rate is within [0.9, 1.3] × quota: after a fast client's initial
        # burst has been paid for, or once a slow starter (a cold JVM, cold brokers) has come up to the quota.
        # A throttled client's saw-tooth can keep every 1 s rate outside that band for long on a loaded machine
        # (seen once: the first 21 s at 2.06 MiB/s on average for a 2 MiB/s quota); when 1 s windows leave less
        # than half of the run, 2 s windows, which average the saw-tooth, decide instead.
        times = [t for t, _ in pts]

        def first_in_band(span: float) -> float | None:
            for i in range(first_move, len(pts)):
                j = bisect.bisect_left(times, pts[i][0] + span)
                if j >= len(pts):
                    return None
                if 0.9 * quota <= (pts[j][1] - pts[i][1]) / (pts[j][0] - pts[i][0]) <= 1.3 * quota:
                    return pts[i][0] + settle_s
            return None

        found = first_in_band(1.0)
        if found is None or end_t - found < (end_t - start_t) / 2:
            wider = first_in_band(2.0)
            if wider is not None and (found is None or wider < found):
                found = wider
        if found is not None:
            start_t = found
    window = [(t, v) for t, v in pts if start_t <= t <= end_t]
    if len(window) < 5:
        raise ValueError(f"no steady interval: start {start_t:.1f}s end {end_t:.1f}s")
    rate = _slope(window)
    slices = []
    t = window[0][0]
    while t + 5 <= window[-1][0] + 1e-9:
        part = [(a, b) for a, b in window if t <= a <= t + 5]
        if len(part) >= 5:
            slices.append(_slope(part))
        t += 5
    return Rate(rate, window[0][0], window[-1][0], window[0][1] - pts[0][1], slices, rate)


def produce_rate(samples, quota: float | None, index_dir: Path | None = None, **kw) -> Rate:
    """Steady produce rate, with ``charged`` = batch bytes + PRODUCE_REQUEST_OVERHEAD per batch appended."""
    r = steady_rate(samples, quota, **kw)
    if index_dir is not None:  # cumulative log bytes are positions in the partition's log: count batches ending there
        origin = samples[0][0]
        lo = min(samples, key=lambda tv: abs(tv[0] - origin - r.t0))[1]
        hi = min(samples, key=lambda tv: abs(tv[0] - origin - r.t1))[1]
        n = batches_between(batch_index(index_dir), lo, hi)
        r.charged = r.rate + n * PRODUCE_REQUEST_OVERHEAD / max(r.seconds, 1e-9)
    return r


# ------------------------------------------------------------------------------------------ samples and latencies
def percentile(values: Sequence[float], q: float, *, empty: float | None = None) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default): the one
    percentile of the tests and benchmarks. No values give ``empty``, or a ValueError when that is None."""
    if not values:
        if empty is not None:
            return empty
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0-100")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def value_at(points: Sequence[tuple[float, float]], t: float) -> float:
    """A cumulative count at time ``t``, interpolated linearly between (time, value) samples sorted by time;
    clamped to the first/last sample outside them (nothing is known there, and a count does not run backwards)."""
    if not points:
        raise ValueError("no samples")
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t <= t1:
            return v1 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def slice_increments(
    points: Sequence[tuple[float, float]], start: float, end: float, width: float = 1.0
) -> list[float]:
    """The increase of a cumulative count in each whole ``width``-second slice of [start, end): a partial slice at
    the end is dropped (it would read as a slow second)."""
    out = []
    t = start
    while t + width <= end + 1e-9:
        out.append(value_at(points, t + width) - value_at(points, t))
        t += width
    return out


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(min, median, max)."""
    if not values:
        raise ValueError("spread of no values")
    return min(values), statistics.median(values), max(values)


def settled_latencies(rows: Sequence[Sequence[float]], start: float, end: float) -> list[float]:
    """Latencies (column 1) of the records sent (column 0) in [start, end)."""
    return [r[1] for r in rows if start <= r[0] < end]


def dirty_bytes(meminfo: str) -> int:
    """``Dirty`` + ``Writeback`` from /proc/meminfo's text, in bytes: page cache the kernel still has to write."""
    total = 0
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Dirty", "Writeback"):
            number, _, unit = rest.strip().partition(" ")
            total += int(number) * (1024 if unit.strip() == "kB" else 1)
    return total
