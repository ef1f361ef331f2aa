"""Quota fidelity: the rate a byte-rate quota actually allows, measured from what the cluster received or served,
through the proxy and with the same quota set on the brokers themselves (no proxy), in one run.

    .venv/bin/python -m bench.quota_fidelity [--quota-mib 3] [--seconds 30] [--repeats 1] [--output PATH]

How the rate is measured (never from the client's own report):
  * Produce: the size of the partition's log segment files on the leader's disk (``*.log`` under the broker's
    ``log.dirs``), sampled every 0.2 s. Kafka appends record batches exactly as the producer sent them, so the
    slope of that curve is the rate of record-batch bytes the cluster received.
  * Consume: the consumer group's committed offset, read from the cluster (OffsetFetch, straight to the brokers)
    every 0.2 s while the consumer auto-commits every 200 ms, turned into bytes with the partition's own batch
    index (parsed from the segment files: a fetch serves whole batches). Slope = batch bytes served per second.
  * The rate is the least-squares slope over the *steady* part of the run. Excluded: the start, until the 1 s rate
    is first within [0.9, 1.3] × quota, plus 1 s. Kafka (and the proxy, which reproduces it) pads a young rate's window
    to (samples − 1) × window = 10 s, so a fresh client may first send ~10 s worth of quota at full speed; that
    burst is Kafka's design, not an error, and a sustained rate is what a quota promises. Also excluded: the
    last 0.5 s (the client winding down).
  * Protocol overhead: Produce is charged its request size (header + body), which is the batch bytes plus ~70 B
    per request with one partition (header, client id, acks, timeout, topic id, partition index, lengths, tags);
    that estimate × the number of batches appended is added back ("charged" column). Fetch is charged its
    response size: batch bytes plus ~90 B per response, i.e. < 0.1 % with the 512 KiB partition fetches used
    (max.partition.fetch.bytes; half the default, so the committed-offset curve has finer steps), left out.

The other half of issue 5's benchmark, all quotas configured but none binding (throughput ≥ 0.90 of direct),
is the ``quotas`` side of ``bench.run``: measured there next to the plain proxy, same warm brokers, same rounds.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import os
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import KafkaCluster
from tests.support import REPO, ProxyProcess

RECORD = 1024
MIB = 1024 * 1024
PERF_JVM = ("-Xmx512m",)
PRODUCE_REQUEST_OVERHEAD = 70  # bytes a one-partition Produce request adds to its record batch (see docstring)
FETCH_PARTITION_BYTES = 512 * 1024  # max.partition.fetch.bytes for both consumers (see docstring)
SAMPLE_S = 0.2


# ------------------------------------------------------------------------------------------ cluster-side meters
def create_topic(cluster: KafkaCluster, topic: str, leaders: list[int]) -> None:
    """A topic with one partition per entry of ``leaders``, replication factor 1, partition i on broker leaders[i]."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=len(leaders),
                                  replica_assignment=[[b] for b in leaders])])[topic].result(30)
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

    def __init__(self, fn: Callable[[], float | None], interval: float = SAMPLE_S) -> None:
        self.fn = fn
        self.interval = interval
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


def committed_sampler(cluster: KafkaCluster, group: str, topic: str, index) -> Sampler:
    """Bytes served to ``group`` on partition 0, from the offset it committed (asked of the cluster directly)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def read() -> float | None:
        try:
            fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])])
            tps = fut[group].result(5).topic_partitions
        except Exception:  # noqa: BLE001 - the group does not exist yet
            return None
        off = tps[0].offset if tps else -1
        return offset_to_bytes(index, off) if off >= 0 else None

    return Sampler(read)


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


def steady_rate(samples: list[tuple[float, float]], quota: float | None, settle_s: float = 1.0,
                tail_s: float = 0.5) -> Rate:
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


# ------------------------------------------------------------------------------------------ clients
_METRIC = re.compile(r"^([\w-]+):([\w-]+):\{([^}]*)\}\s*:\s*([-\d.NaE]+)\s*$", re.MULTILINE)


def java_metrics(text: str) -> dict[str, float]:
    """``--print-metrics`` output as {"group:name": value} (first client-level entry of each)."""
    out: dict[str, float] = {}
    for group, name, _tags, value in _METRIC.findall(text):
        with contextlib.suppress(ValueError):
            out.setdefault(f"{group}:{name}", float(value))
    return out


_ERRORS = re.compile(r"\b(ERROR|Exception|TimeoutException|timed out|NETWORK_EXCEPTION|Disconnected)\b")


def java_errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if _ERRORS.search(ln)]


def run_java(cluster: KafkaCluster, tool: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = cluster.tool_cmd(tool, *args, jvm_opts=PERF_JVM)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        raise RuntimeError(f"{tool} timed out after {timeout}s:\n{out[-2000:]}\n{err[-2000:]}") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def java_produce(cluster: KafkaCluster, bootstrap: str, topic: str, n: int, client_id: str) -> dict:
    """producer-perf-test, 1 KiB records, acks=all, as fast as it may (throughput -1), metrics printed."""
    p = run_java(cluster, "producer_perf", "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(n),
                 "--record-size", str(RECORD), "--throughput", "-1", "--print-metrics",
                 "--command-property", "acks=all", f"client.id={client_id}")
    if p.returncode != 0:
        raise RuntimeError(f"producer-perf-test exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    sent = re.findall(r"^(\d+) records sent", p.stdout, re.MULTILINE)
    return {"sent": int(sent[-1]) if sent else 0, "metrics": java_metrics(p.stdout),
            "errors": java_errors(p.stdout + p.stderr), "stdout": p.stdout, "stderr": p.stderr}


def java_consume(cluster: KafkaCluster, bootstrap: str, topic: str, n: int, group: str, client_id: str) -> dict:
    """consumer-perf-test from the beginning, auto-committing every 200 ms (that is what is measured)."""
    p = run_java(cluster, "consumer_perf", "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(n),
                 "--group", group, "--timeout", "30000", "--print-metrics",
                 "--command-property", f"client.id={client_id}", "--command-property", "auto.commit.interval.ms=200",
                 "--command-property", f"max.partition.fetch.bytes={FETCH_PARTITION_BYTES}")
    if p.returncode != 0:
        raise RuntimeError(f"consumer-perf-test exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    i = next((i for i, ln in enumerate(lines) if ln.startswith("start.time")), None)
    consumed = 0
    if i is not None:
        row = dict(zip((h.strip() for h in lines[i].split(",")), (v.strip() for v in lines[i + 1].split(",")),
                       strict=False))
        consumed = int(row.get("data.consumed.in.nMsg", 0))
    return {"consumed": consumed, "metrics": java_metrics(p.stdout), "errors": java_errors(p.stdout + p.stderr),
            "stdout": p.stdout, "stderr": p.stderr}


def seq_value(i: int, pad: bytes) -> bytes:
    return struct.pack(">Q", i) + pad


def rdkafka_produce(bootstrap: str, topic: str, client_id: str, seconds: float, partitions: int = 1,
                    outstanding: int = 20_000, **config) -> dict:
    """confluent-kafka producing 1 KiB records numbered 0, 1, … for ``seconds`` (at most ``outstanding`` awaiting
    delivery, so memory stays bounded), then flushing. Returns counts and delivery errors."""
    from confluent_kafka import Producer

    errors: list[str] = []
    delivered = [0]

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[0] += 1

    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 5, **config})
    pad = os.urandom(RECORD - 8)
    i = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if len(p) >= outstanding:
            p.poll(0.05)
            continue
        try:
            p.produce(topic, seq_value(i, pad), partition=i % partitions, on_delivery=on_delivery)
        except BufferError:
            p.poll(0.05)
            continue
        i += 1
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    return {"produced": i, "delivered": delivered[0], "errors": errors, "undelivered": left}


def rdkafka_consume(bootstrap: str, topic: str, group: str, client_id: str, n: int, timeout: float = 180) -> dict:
    """confluent-kafka consuming partition 0 from the beginning, auto-committing every 200 ms, until ``n``."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                  "auto.offset.reset": "earliest", "auto.commit.interval.ms": 200,
                  "max.partition.fetch.bytes": FETCH_PARTITION_BYTES})
    c.subscribe([topic])
    got, errors, last = 0, [], -1
    arrivals: list[tuple[float, int]] = []  # (time, next offset) as batches arrive: a cross-check of the commits
    deadline = time.monotonic() + timeout
    try:
        while got < n and time.monotonic() < deadline:
            msgs = c.consume(1000, 0.5)
            for m in msgs:
                if m.error():
                    errors.append(str(m.error()))
                    continue
                if m.offset() != last + 1:
                    errors.append(f"offset jump {last} -> {m.offset()}")
                last = m.offset()
                got += 1
            if msgs:
                arrivals.append((time.monotonic(), last + 1))
        c.commit(asynchronous=False)
    finally:
        c.close()
    return {"consumed": got, "errors": errors, "arrivals": arrivals}


def fill_topic(bootstrap: str, topic: str, n: int) -> None:
    """n 1 KiB records into partition 0, in ~16 KiB batches (like the Java producer's), straight to the cluster."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20, "batch.size": 16384})
    pad = os.urandom(RECORD - 8)
    for i in range(n):
        while True:
            try:
                p.produce(topic, seq_value(i, pad), partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("fill_topic: records left undelivered")


def check_sequence(bootstrap: str, topic: str, start: int, n: int, timeout: float = 60) -> list[str]:
    """Read partition 0 from ``start`` straight from the cluster: values must number 0 … n − 1, in order."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, start)])
    problems: list[str] = []
    want = 0
    deadline = time.monotonic() + timeout
    try:
        while want < n and time.monotonic() < deadline:
            for m in c.consume(5000, 0.5):
                if m.error():
                    problems.append(str(m.error()))
                    continue
                (seq,) = struct.unpack_from(">Q", m.value())
                if seq != want:
                    problems.append(f"offset {m.offset()}: record {seq}, expected {want}")
                    if len(problems) > 10:
                        return problems
                want = seq + 1
    finally:
        c.close()
    if want != n:
        problems.append(f"read up to record {want}, expected {n}")
    return problems


# ------------------------------------------------------------------------------------------ benchmark
@dataclass
class Row:
    label: str
    quota: float
    results: list[Rate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _set_broker_quota(cluster: KafkaCluster, client_id: str, key: str, value: int) -> None:
    cluster.tool("configs", "--bootstrap-server", cluster.bootstrap, "--alter", "--entity-type", "clients",
                 "--entity-name", client_id, "--add-config", f"{key}={value}", check=True)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quota-mib", type=float, default=3.0, help="byte-rate quota in MiB/s (default 3)")
    ap.add_argument("--seconds", type=float, default=30.0, help="steady seconds per run (default 30)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per row (default 1)")
    ap.add_argument("--records", type=int, default=100_000, help="records per broker warm-up run")
    ap.add_argument("--output", default=str(REPO / "bench" / "QUOTA_FIDELITY.md"))
    args = ap.parse_args(argv)
    q = int(args.quota_mib * MIB)
    steady = args.seconds
    command = shlex.join([".venv/bin/python", "-m", "bench.quota_fidelity", *sys.argv[1:]])
    started = datetime.datetime.now().astimezone()
    from bench.run import java_produce as bench_java_produce
    from bench.run import machine_info, proxy_code_version

    code = proxy_code_version()
    workdir = Path(tempfile.mkdtemp(prefix="ktp-bench-"))
    t_start = time.monotonic()
    # Records a run needs: the padded-window burst (~10 s of quota) + 3 s to settle + the steady part.
    n_run = int((10 + 3 + steady + 2) * q / (RECORD + 10))
    rows: dict[str, Row] = {}
    try:
        with KafkaCluster(3, workdir=workdir / "kafka") as cluster:
            # --------------------------------------------------------------- warm-up (fresh brokers are slow)
            cluster.tool("topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", "bench",
                         "--partitions", "3", "--replication-factor", "3", check=True)
            n = args.records
            print("warming up the brokers", flush=True)
            for _ in range(3):
                bench_java_produce(cluster, cluster.bootstrap, n, -1)

            # --------------------------------------------------------------- binding quotas: proxy vs broker
            src = f"fill-{uuid.uuid4().hex[:6]}"
            create_topic(cluster, src, [1])
            print(f"filling {src} with {n_run:,} records", flush=True)
            fill_topic(cluster.bootstrap, src, n_run)
            src_index = batch_index(topic_dirs(cluster, src)[0])
            proxy = ProxyProcess(workdir, cluster.bootstrap, {"quotas.entities": [
                {"entity": {"client-id": f"proxy-{k}"}, "quotas": {f"{kind}_byte_rate": q}}
                for k, kind in (("jp", "producer"), ("rp", "producer"), ("jc", "consumer"), ("rc", "consumer"))
            ]}, name="quota-proxy").start()
            for k, kind in (("jp", "producer"), ("rp", "producer"), ("jc", "consumer"), ("rc", "consumer")):
                _set_broker_quota(cluster, f"broker-{k}", f"{kind}_byte_rate", q)
            time.sleep(2)  # let the brokers apply the new client quotas

            def produce_java(where: str, bs: str) -> tuple[Rate, list[str]]:
                topic = f"q-{where}-jp-{uuid.uuid4().hex[:6]}"
                create_topic(cluster, topic, [2])
                d = topic_dirs(cluster, topic)
                with Sampler(lambda: log_bytes(d)) as s:
                    res = java_produce(cluster, bs, topic, n_run, f"{where}-jp")
                m = res["metrics"]
                notes = [f"throttle-time-max {m.get('producer-metrics:produce-throttle-time-max', 0):.0f} ms",
                         f"errors {res['metrics'].get('producer-metrics:record-error-total', -1):.0f}"]
                if res["errors"] or res["sent"] != n_run:
                    notes.append(f"PROBLEM sent {res['sent']}/{n_run}: {res['errors'][:2]}")
                return produce_rate(s.samples, q, d[0]), notes

            def produce_rdk(where: str, bs: str) -> tuple[Rate, list[str]]:
                topic = f"q-{where}-rp-{uuid.uuid4().hex[:6]}"
                create_topic(cluster, topic, [3])
                d = topic_dirs(cluster, topic)
                with Sampler(lambda: log_bytes(d)) as s:
                    res = rdkafka_produce(bs, topic, f"{where}-rp", 13 + steady)
                notes = [f"{res['delivered']:,} delivered"]
                if res["errors"] or res["undelivered"]:
                    notes.append(f"PROBLEM {res['errors'][:2]} undelivered {res['undelivered']}")
                problems = check_sequence(cluster.bootstrap, topic, 0, res["produced"])
                notes.append("sequence ok" if not problems else f"PROBLEM {problems[:2]}")
                return produce_rate(s.samples, q, d[0]), notes

            def consume_java(where: str, bs: str) -> tuple[Rate, list[str]]:
                group = f"q-{where}-jc-{uuid.uuid4().hex[:6]}"
                with committed_sampler(cluster, group, src, src_index) as s:
                    res = java_consume(cluster, bs, src, n_run, group, f"{where}-jc")
                m = res["metrics"]
                tmax = m.get("consumer-fetch-manager-metrics:fetch-throttle-time-max", 0)
                notes = [f"throttle-time-max {tmax:.0f} ms"]
                if res["errors"] or res["consumed"] < n_run:
                    notes.append(f"PROBLEM consumed {res['consumed']}/{n_run}: {res['errors'][:2]}")
                return steady_rate(s.samples, q), notes

            def consume_rdk(where: str, bs: str) -> tuple[Rate, list[str]]:
                group = f"q-{where}-rc-{uuid.uuid4().hex[:6]}"
                with committed_sampler(cluster, group, src, src_index) as s:
                    res = rdkafka_consume(bs, src, group, f"{where}-rc", n_run)
                notes = [] if not res["errors"] and res["consumed"] >= n_run else [
                    f"PROBLEM consumed {res['consumed']}/{n_run}: {res['errors'][:2]}"]
                return steady_rate(s.samples, q), notes

            plan = [("Produce, Java producer-perf-test", produce_java, True),
                    ("Produce, librdkafka (confluent-kafka)", produce_rdk, True),
                    ("Fetch, Java consumer-perf-test", consume_java, False),
                    ("Fetch, librdkafka (confluent-kafka)", consume_rdk, False)]
            for r in range(args.repeats):
                for label, fn, _is_produce in plan:
                    for where in ("proxy", "broker") if r % 2 == 0 else ("broker", "proxy"):
                        bs = proxy.bootstrap if where == "proxy" else cluster.bootstrap
                        row = rows.setdefault(f"{label}|{where}", Row(f"{label}, quota on the {where}", q))
                        rate, notes = fn(where, bs)
                        row.results.append(rate)
                        row.notes += notes
                        print(f"[{r + 1}/{args.repeats}] {row.label:60} {rate.rate / MIB:.3f} MiB/s "
                              f"(charged {rate.charged / MIB:.3f}) error {100 * rate.error(q):+.2f}% over "
                              f"{rate.seconds:.1f}s, burst {rate.burst_bytes / MIB:.1f} MiB; {'; '.join(notes)}",
                              flush=True)
            if proxy.terminate() != 0:
                raise RuntimeError(f"proxy exited badly:\n{proxy.log()[-3000:]}")
            warnings = [ln for ln in proxy.log().splitlines() if " WARNING " in ln or " ERROR " in ln]
            info = machine_info(cluster, code)
        shutil.rmtree(workdir, ignore_errors=True)
    except BaseException:
        print(f"failed; kept {workdir} for the proxy and broker logs (delete it when done)", file=sys.stderr)
        raise
    minutes = (time.monotonic() - t_start) / 60

    table = ["| workload | quota MiB/s | achieved MiB/s (median) | error | charged-equivalent error | "
             "5 s slices MiB/s (min–max) | steady s | initial burst MiB | notes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows.values():
        med = statistics.median(x.rate for x in row.results)
        chg = statistics.median(x.charged for x in row.results)
        sl = [s for x in row.results for s in x.windows]
        table.append(
            f"| {row.label} | {q / MIB:.2f} | {med / MIB:.3f} | {100 * (med / q - 1):+.2f}% | "
            f"{100 * (chg / q - 1):+.2f}% | {min(sl) / MIB:.2f}–{max(sl) / MIB:.2f} | "
            f"{statistics.median(x.seconds for x in row.results):.0f} | "
            f"{statistics.median(x.burst_bytes for x in row.results) / MIB:.1f} | "
            f"{'; '.join(dict.fromkeys(row.notes))} |")
    print("\n".join(table))
    doc = [
        "# Quota fidelity: byte-rate quotas through the proxy vs on the brokers", "",
        f"- Command: `{command}` ({minutes:.0f} min in total); date {started:%Y-%m-%d %H:%M %Z}.", *info,
        f"- Quota {q:,} B/s ({q / MIB:g} MiB/s), one per client id (`proxy-jp`, `proxy-rp`, … in the proxy's config; "
        "`broker-jp`, … set with `kafka-configs --alter --entity-type clients --add-config` on the cluster, no "
        "proxy). Produce topics: 1 partition, RF 1; consume: one pre-filled 1-partition topic (16 KiB batches), "
        f"a fresh group per run. Records 1 KiB. {args.repeats} run(s) per row; ≥ {steady:.0f} s steady each.",
        "- Achieved rate = least-squares slope of the bytes the cluster stored (produce: partition segment file "
        "sizes on the leader's disk) or served (consume: the group's committed offset read from the cluster, "
        "auto-commit every 200 ms, mapped to batch bytes) over the steady part of the run; the initial burst "
        "that Kafka's padded 10 s window allows a fresh client is excluded (column 'initial burst'). "
        "'charged-equivalent' adds ~70 B per produce request (one batch per request) to compare with what "
        "Kafka charges, the request size; fetch response overhead is < 0.1 % and not added. See the module "
        "docstring for details.",
        f"- Proxy log: {len(warnings)} WARNING/ERROR lines.", "",
        "## Binding quota: achieved rate vs quota", "", *table, "",
        "All quotas configured but none binding: see the `quotas` side in BENCHMARKS.md (`bench.run`).", "",
    ]
    out = Path(args.output)
    notes = out.read_text().partition("\n## Notes")[2] if out.exists() else ""
    out.write_text("\n".join(doc).rstrip() + "\n" + (f"\n## Notes{notes}" if notes else ""))
    print(f"total {minutes:.1f} min; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
