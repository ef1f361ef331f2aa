"""The traffic the quota tests and the benchmarks measure: Kafka's Java perf tools and confluent-kafka
(librdkafka) producing and consuming 1 KiB records as fast as they may, a topic filled straight to the cluster, and
a check that what landed is every record, in order. What they achieved is measured elsewhere, where the bytes land
(:mod:`tests.harness.measure`); the clients' own reports are returned only as notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import struct
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.harness.cluster import KafkaCluster

RECORD = 1024
SMALL_RECORD = b"0123456789abcdef"
"""16 B: the record of a request-heavy, byte-light client."""
PERF_JVM = ("-Xmx512m",)
FETCH_PARTITION_BYTES = 512 * 1024
"""max.partition.fetch.bytes for both consumers: half the default, so a committed-offset curve has finer steps."""


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
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        raise RuntimeError(f"{tool} timed out after {timeout}s:\n{out[-2000:]}\n{err[-2000:]}") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def java_produce(cluster: KafkaCluster, bootstrap: str, topic: str, n: int, client_id: str) -> dict:
    """producer-perf-test, 1 KiB records, acks=all, as fast as it may (throughput -1), metrics printed."""
    p = run_java(
        cluster,
        "producer_perf",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(n),
        "--record-size",
        str(RECORD),
        "--throughput",
        "-1",
        "--print-metrics",
        "--command-property",
        "acks=all",
        f"client.id={client_id}",
    )
    if p.returncode != 0:
        raise RuntimeError(f"producer-perf-test exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    sent = re.findall(r"^(\d+) records sent", p.stdout, re.MULTILINE)
    return {
        "sent": int(sent[-1]) if sent else 0,
        "metrics": java_metrics(p.stdout),
        "errors": java_errors(p.stdout + p.stderr),
        "stdout": p.stdout,
        "stderr": p.stderr,
    }


def java_consume(cluster: KafkaCluster, bootstrap: str, topic: str, n: int, group: str, client_id: str) -> dict:
    """consumer-perf-test from the beginning, auto-committing every 200 ms (that is what is measured)."""
    p = run_java(
        cluster,
        "consumer_perf",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(n),
        "--group",
        group,
        "--timeout",
        "30000",
        "--print-metrics",
        "--command-property",
        f"client.id={client_id}",
        "--command-property",
        "auto.commit.interval.ms=200",
        "--command-property",
        f"max.partition.fetch.bytes={FETCH_PARTITION_BYTES}",
    )
    if p.returncode != 0:
        raise RuntimeError(f"consumer-perf-test exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    i = next((i for i, ln in enumerate(lines) if ln.startswith("start.time")), None)
    consumed = 0
    if i is not None:
        row = dict(
            zip((h.strip() for h in lines[i].split(",")), (v.strip() for v in lines[i + 1].split(",")), strict=False)
        )
        consumed = int(row.get("data.consumed.in.nMsg", 0))
    return {
        "consumed": consumed,
        "metrics": java_metrics(p.stdout),
        "errors": java_errors(p.stdout + p.stderr),
        "stdout": p.stdout,
        "stderr": p.stderr,
    }


def seq_value(i: int, pad: bytes) -> bytes:
    return struct.pack(">Q", i) + pad


def rdkafka_produce(
    bootstrap: str, topic: str, client_id: str, seconds: float, partitions: int = 1, outstanding: int = 20_000, **config
) -> dict:
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

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "auto.commit.interval.ms": 200,
            "max.partition.fetch.bytes": FETCH_PARTITION_BYTES,
        }
    )
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
                offset = m.offset()
                assert offset is not None  # a record's (not an error's)
                if offset != last + 1:
                    errors.append(f"offset jump {last} -> {offset}")
                last = offset
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

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False}
    )
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
                value = m.value()
                assert value is not None  # fill_topic's records all have one
                (seq,) = struct.unpack_from(">Q", value)
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


def request_stats(api: str, samples: list, node: int = 1):
    """A librdkafka stats_cb appending (monotonic s, requests of ``api`` sent to broker ``node``, throttle window)."""

    def cb(text: str) -> None:
        st = json.loads(text)
        for b in st.get("brokers", {}).values():
            if b.get("nodeid") == node:
                samples.append((time.monotonic(), b.get("req", {}).get(api, 0), b.get("throttle", {})))

    return cb


def request_rate(samples: list, start: float, end: float) -> dict:
    """Requests/s between ``start`` and ``end`` from cumulative counts, and the throttle windows within."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return {"rate": 0.0, "throttled": 0, "p50": 0, "p99": 0, "max": 0, "seconds": 0.0}
    (t0, n0, _), (t1, n1, _) = inside[0], inside[-1]
    wins = [w for _, _, w in inside[1:] if w.get("cnt", 0) > 0]
    cnt = sum(w["cnt"] for w in wins)
    return {
        "rate": (n1 - n0) / (t1 - t0),
        "seconds": t1 - t0,
        "throttled": cnt,
        # librdkafka gives percentiles per 1-s window: the median window's p50, the worst window's p99 and max
        "p50": statistics.median(w["p50"] for w in wins) if wins else 0,
        "p99": max((w["p99"] for w in wins), default=0),
        "max": max((w["max"] for w in wins), default=0),
    }


def rdkafka_request_flood(
    bootstrap: str, topic: str, client_id: str, warm: float, seconds: float, served: bool = False, **conf
) -> dict:
    """librdkafka producing 16-B records to partition 0 as fast as it may (linger 0, acks 1 unless ``conf`` says
    otherwise): one small batch per request, what ``request_percentage`` (KIP-124) exists for. Returns
    :func:`request_rate` of its Produce requests to broker 1 after ``warm`` seconds, over ``seconds``: requests
    written to the socket, or (``served``) requests answered, counted by delivery reports (one record, one request).

    Why ``served``: librdkafka's ``req`` counts what it has written to the socket. Held by a broker (or by the
    proxy), which reads one request at a time, its 20,000 queued records are all written in the first second and it
    writes nothing more while they are served, so "sent" reads 0/s under a quota and, unthrottled, counts what sits
    in the proxy's buffers."""
    from confluent_kafka import Producer

    samples: list = []
    delivered = [0]
    record_stats = request_stats("Produce", samples)

    def on_stats(text: str) -> None:
        n = len(samples)
        record_stats(text)
        if served:  # the requests answered so far, in place of those written
            samples[n:] = [(t, delivered[0], window) for t, _sent, window in samples[n:]]

    def on_delivery(err, _msg) -> None:
        if err is None:
            delivered[0] += 1

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 0,
            "batch.num.messages": 1,  # one record a request, pipelined: request-heavy
            "acks": 1,
            "statistics.interval.ms": 1000,
            "stats_cb": on_stats,
            "queue.buffering.max.messages": 20_000,
            **conf,
        }
    )
    start = time.monotonic()
    end = start + warm + seconds
    while time.monotonic() < end:
        try:
            p.produce(topic, SMALL_RECORD, partition=0, on_delivery=on_delivery if served else None)
        except BufferError:
            p.poll(0.001)
            continue
        p.poll(0)
    p.poll(1.5)  # the last statistics
    p.purge()
    p.flush(5)
    return request_rate(samples, start + warm, end + 0.5)
