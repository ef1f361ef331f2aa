"""Isolation: a steady victim producer beside a flooder held by quotas (issue 30, item 5).

    .venv/bin/python -m bench.isolation [--seconds 40] [--settle 10] [--phases alone-proxy,flood-smooth,...]

What a quota is for, seen from the neighbour: a tenant at its quota should cost the other tenants of the same
brokers little. Three brokers (tests.harness), one proxy, two client ids:

  * VICTIM (client id ``victim``, no quota): 200 records/s of 1 KiB, ``acks=all``, ``linger.ms=0``, round-robin
    over a 3-partition RF-3 topic (one leader per broker), in its own process so the flood's Python threads do not
    hold its GIL. Latency per record = monotonic time of ``produce()`` to monotonic time of its delivery callback
    (the process polls whenever it is not sending, so a callback runs as soon as librdkafka queues its report);
    librdkafka's own ``msg.latency()`` (enqueue to acknowledgement, no Python scheduling) is printed beside it.
  * FLOODER (client id ``flooder``): three confluent-kafka producers at full speed (16 KiB records, 1 MB batches,
    ``acks=all``, a 3-partition RF-3 topic led by brokers 1, 2, 3) plus a CreateTopics/DeleteTopics loop (topics of
    2 partitions, RF 1), in a second process. Quotas on its client id, where a phase sets them: producer_byte_rate
    2 MiB/s and controller_mutation_rate 5 (per broker, as Kafka means them: the proxy's default scope).

Phases (each ``--seconds`` long; the first ``--settle`` seconds, while connections open and a windowed quota's
first burst passes, are not counted; a fresh pair of topics each; after each flood a ``--cooldown`` pause, then a
wait, at most 60 s, until the kernel has written the flood's dirty pages back):

  alone-proxy    victim alone, through the proxy (no quota): the reference every ratio divides by
  alone-direct   victim alone, straight to the cluster
  flood-noquota  victim + flood through the proxy, no quota configured
  flood-kafka    victim + flood through the proxy, quotas.enforcement: kafka (the default)
  flood-smooth   victim + flood through the proxy, quotas.enforcement: smooth, smooth_burst_seconds 0.1
  flood-broker   victim + flood straight to the cluster, the same quotas set on the brokers (kafka-configs)
  flood-paced    victim + flood straight to the cluster, no quota anywhere: the flooder paces itself to exactly
                 its quota (a ~1 MB batch to the next partition every 1/6 s, mutations at 5/s): the best any
                 pacing of the same lumps can do, so what is left above alone is what these bytes cost the brokers
  flood-paced-even  the same, the flooder's bytes spread evenly in 16-KiB batches: what the lumps add
  alone-proxy-again  victim alone through the proxy once more: how far the machine drifted meanwhile

Before the phases, unmeasured (``--warmup`` s each): victim + flood straight to the cluster (fresh brokers' JIT),
then the victim alone through a proxy (the first phase after a flood read slow in every run without it).
A flood leaves followers behind; the next phase starts only once they have caught up (a victim with acks=all
would otherwise wait for the replica fetchers still copying the last flood), and that wait is reported.

The flooder's rate is measured where its bytes land: the size of each partition's log on its leader's disk,
sampled every 0.1 s, cut into 1-s slices per broker and divided by the per-broker quota (an unquoted phase is
divided by the same 2 MiB/s, to show how far above it goes). Mutations: partitions created + deleted per second
over the settled window, against 5/s. Load averages (1 min) are read before and after each phase: the machine
has two cores and is shared, so every figure here is as noisy as that load.

Issue 30's target: with the flooder at its quota in smooth mode, the victim's settled p99 ≤ 1.5 × its p99 alone
through the proxy (plus a few ms of scheduling noise on 2 cores). That reference pools the records of both alone
phases through the proxy, before and after the floods: in the first full run one of them (473 ms, at load 17) was
3.5 times the other (134 ms), and a ratio to either alone would say more about the neighbours than the quota.
Phases straight to the cluster are also divided by alone-direct ("same path").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.measure import (
    Sampler,
    dirty_bytes,
    log_bytes,
    percentile,
    settled_latencies,
    slice_increments,
    spread,
    value_at,
)

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
VICTIM_ID = "victim"
CONSUMER_ID = "victim-consumer"
CONSUMER_FILL = 96 * MIB  # the consumer victim's topic: read over and over, from the page cache
WINDOW_S = 5.0  # the victim's p99 is also read per window of this many seconds (a stall hides in a phase's p99)
FLOOD_ID = "flooder"
VICTIM_RATE = 200  # records/s
VICTIM_RECORD = 1024
FLOOD_RECORD = 16 * 1024
FLOOD_PRODUCERS = 3
FLOOD_BATCH = 1_000_000  # librdkafka's batch.size cap (message.max.bytes): ~1 MB per partition per request
FLOOD_MAX_RECORDS = 2_000_000  # per producer: a bound on top of the clock (≈ 30 GiB, never reached in a phase)
MUTATION_PARTITIONS = 2  # partitions per topic the mutation loop creates and deletes: 2 mutations each way
MUTATION_MAX_CYCLES = 5_000
BYTE_QUOTA = 2 * MIB
MUTATION_QUOTA = 5
SAMPLE_S = 0.1
DIRTY_LIMIT = 64 * MIB  # a cool-down ends once the page cache holds less than this to write back
TAIL_S = 0.5  # the last half second of a phase: clients winding down

PHASES = (
    "alone-proxy",
    "alone-direct",
    "flood-noquota",
    "flood-kafka",
    "flood-smooth",
    "flood-broker",
    "flood-paced",
    "flood-paced-even",
    "alone-proxy-again",
)
LABELS = {
    "alone-proxy": "victim alone, through the proxy",
    "alone-direct": "victim alone, straight to the cluster",
    "flood-noquota": "victim + flood, proxy, no quota",
    "flood-kafka": "victim + flood, proxy, enforcement kafka",
    "flood-smooth": "victim + flood, proxy, enforcement smooth (burst 0.1 s)",
    "flood-broker": "victim + flood, straight to the cluster, quotas on the brokers",
    "flood-paced": "victim + flood paced by the flooder itself at the quota in 1-MB lumps, straight to the cluster",
    "flood-paced-even": "victim + flood paced by the flooder itself at the quota in 16-KiB batches, straight",
    "alone-proxy-again": "victim alone, through the proxy, again (drift)",
}


# ------------------------------------------------------------------------------------------ phases
PACING = {"flood-paced": ",paced-lumps", "flood-paced-even": ",paced-even"}
"""The phases whose flooder paces itself (what flood_main's ``parts`` gets added)."""


def parse_phases(text: str) -> list[str]:
    """``--phases``: a comma list of phase names (or ``all``), run in the canonical order whatever the list's:
    the reference (alone-proxy) comes first, every ratio divides by it."""
    if text.strip() == "all":
        return list(PHASES)
    wanted = {p.strip() for p in text.split(",") if p.strip()}
    unknown = wanted - set(PHASES)
    if unknown or not wanted:
        raise ValueError(f"unknown phase(s) {sorted(unknown)}; choose from {', '.join(PHASES)} or all")
    return [p for p in PHASES if p in wanted]


# ------------------------------------------------------------------------------------------ the clients (own processes)
def victim_main(bootstrap: str, topic: str, seconds: float, out: Path) -> int:
    """Send VICTIM_RATE records/s on a fixed schedule for ``seconds``; write every record's latency as JSON."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": VICTIM_ID,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": 120_000,  # issue 48: a no-quota flood holds it 45 s; nothing may be lost
        }
    )
    p.list_topics(topic, timeout=15)  # metadata and connections before the clock starts
    rows: list[tuple[float, float, float]] = []  # (sent, latency by our clock, librdkafka's msg.latency())
    errors: list[str] = []

    def delivered(sent: float, err, msg) -> None:
        now = time.monotonic()
        if err is not None:
            errors.append(str(err))
            return
        lat = msg.latency()
        rows.append((sent, now - sent, lat if lat is not None else float("nan")))

    value = os.urandom(VICTIM_RECORD)
    n = int(seconds * VICTIM_RATE)
    start = time.monotonic()
    for i in range(n):  # bounded by count; the schedule bounds it in time
        due = start + i / VICTIM_RATE
        while (wait := due - time.monotonic()) > 0:
            p.poll(wait)  # returns early to run a delivery callback: latencies are read when they happen
        p.produce(topic, value, partition=i % 3, on_delivery=functools.partial(delivered, time.monotonic()))
        p.poll(0)
    undelivered = p.flush(30)
    out.write_text(
        json.dumps(
            {
                "start": start,
                "end": time.monotonic(),
                "rows": rows,
                "errors": errors[:20],
                "error_count": len(errors),
                "undelivered": undelivered,
                "sent": n,
            }
        )
    )
    return 0


def consumer_main(bootstrap: str, topic: str, seconds: float, out: Path) -> int:
    """The second victim: one consumer (client id CONSUMER_ID, no quota) re-reading a pre-filled topic at full
    speed, from the start again at its end. Its stall measure: the gap between two consecutive batches that
    returned records (``consume(500)``), stamped when each returned; and its bytes per second."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": CONSUMER_ID,
            "group.id": f"iso-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
    )
    parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)]
    c.assign(parts)
    rows: list[tuple[float, float, int]] = []  # (returned at, gap since the previous batch, bytes)
    start = time.monotonic()
    last = start
    eof: set[int] = set()
    while (now := time.monotonic()) < start + seconds:
        msgs = c.consume(500, 0.5)
        got = 0
        for m in msgs:
            err = m.error()
            if err is None:
                got += len(m.value() or b"")
            elif err.code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition() or 0)
        now = time.monotonic()
        if got:
            rows.append((now, now - last, got))
            last = now
        if len(eof) == 3:  # read it all: from the start again
            c.assign(parts)
            eof.clear()
    c.close()
    out.write_text(json.dumps({"start": start, "end": time.monotonic(), "rows": rows}))
    return 0


def fill_main(bootstrap: str, topic: str, nbytes: int) -> int:
    """Write ``nbytes`` of FLOOD_RECORD records over the three partitions (the consumer victim's topic)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": FLOOD_BATCH, "acks": 1})
    value = os.urandom(FLOOD_RECORD)
    for i in range(nbytes // FLOOD_RECORD):
        while True:
            try:
                p.produce(topic, value, partition=i % 3)
                break
            except BufferError:
                p.poll(0.05)
    return 0 if p.flush(120) == 0 else 1


def windows(rows: Sequence[Sequence[float]], lo: float, hi: float, width: float = WINDOW_S) -> list[list[float]]:
    """Column 1 of ``rows`` (column 0: when), cut into consecutive ``width``-second windows of [lo, hi)."""
    n = max(1, int((hi - lo) // width))
    out: list[list[float]] = [[] for _ in range(n)]
    for r in rows:
        k = int((r[0] - lo) // width)
        if lo <= r[0] < hi and 0 <= k < n:
            out[k].append(r[1])
    return out


PACED_RATE = BYTE_QUOTA * 3 / FLOOD_PRODUCERS  # bytes/s per producer: the three brokers' quotas, shared
LUMP_RECORDS = 60  # 60 × 16 KiB ≈ 0.98 MB: one batch under batch.size with its overhead


def _flood_producer(bootstrap: str, topic: str, stop_at: float, stats: dict, pace: str = "", k: int = 0) -> None:
    """One full-speed flooder, or with ``pace`` ("lumps" or "even") one that holds itself to PACED_RATE: lumps of
    LUMP_RECORDS to one partition at a time (one ~1 MB batch each, the shape smooth pacing forwards), or single
    records evenly spaced (16-KiB batches). Producer ``k`` of the flood starts at partition ``k``, a third of a
    lump's period after producer k - 1: each broker then gets one lump at a time, evenly spaced, not three in step."""
    from confluent_kafka import KafkaError, Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": FLOOD_ID,
            "acks": "all",
            "linger.ms": 10,
            "batch.size": FLOOD_BATCH,
            "queue.buffering.max.kbytes": 8192,
            "message.timeout.ms": 60_000,
        }
    )

    def delivered(err, _msg) -> None:
        if err is None:
            stats["delivered"] += 1
        elif err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            stats["errors"] += 1
            stats.setdefault("first_error", str(err))

    value = os.urandom(FLOOD_RECORD)
    i = 0
    lump = LUMP_RECORDS if pace == "lumps" else 1
    started = time.monotonic() + k * lump * FLOOD_RECORD / PACED_RATE / FLOOD_PRODUCERS
    while i < FLOOD_MAX_RECORDS and time.monotonic() < stop_at:
        if pace and i % lump == 0:  # ahead of the rate: wait until the bytes sent so far are due
            due = started + i * FLOOD_RECORD / PACED_RATE
            while (now := time.monotonic()) < due and now < stop_at:
                p.poll(min(due - now, 0.05))
        try:
            p.produce(topic, value, partition=(i // lump + k) % 3, on_delivery=delivered)
        except BufferError:  # the queue is full (a throttled client): wait for acknowledgements, not spin
            p.poll(0.05)
            continue
        i += 1
        if i % 64 == 0:
            p.poll(0)
    stats["produced"] = i
    p.purge(in_queue=True, in_flight=False)  # what is still queued would take a throttled client half a minute
    p.flush(10)


def _mutation_loop(bootstrap: str, prefix: str, stop_at: float, stats: dict, paced: bool = False) -> None:
    """CreateTopics then DeleteTopics, over and over: what controller_mutation_rate is for. A throttled request
    (THROTTLING_QUOTA_EXCEEDED) is retried after a short pause, as a client following KIP-599 would. ``paced``:
    at most MUTATION_QUOTA partition mutations a second, by the loop's own clock (no quota anywhere)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": FLOOD_ID})
    events: list[tuple[float, int]] = stats["events"]

    def attempt(fn, name: str) -> bool:
        while time.monotonic() < stop_at:
            try:
                fn([name])
                events.append((time.monotonic(), MUTATION_PARTITIONS))
                return True
            except KafkaException as exc:
                text = str(exc.args[0]) if exc.args else str(exc)
                if "THROTTLING_QUOTA_EXCEEDED" in text or "quota" in text.lower():
                    stats["throttled"] += 1
                    time.sleep(0.1)
                    continue
                stats["errors"] += 1
                stats.setdefault("first_error", text)
                time.sleep(0.2)
                return False
        return False

    def create(names: list[str]) -> None:
        admin.create_topics([NewTopic(n, MUTATION_PARTITIONS, 1) for n in names], request_timeout=15)[names[0]].result(
            20
        )

    def delete(names: list[str]) -> None:
        admin.delete_topics(names, request_timeout=15)[names[0]].result(20)

    started = time.monotonic()
    for i in range(MUTATION_MAX_CYCLES):
        if paced:  # each cycle is 2 × MUTATION_PARTITIONS mutations
            time.sleep(max(0.0, started + i * 2 * MUTATION_PARTITIONS / MUTATION_QUOTA - time.monotonic()))
        if time.monotonic() >= stop_at:
            break
        name = f"{prefix}-{i}"
        if attempt(create, name):
            attempt(delete, name)


def flood_main(
    bootstrap: str, topic: str, seconds: float, out: Path, mutation_prefix: str, parts: str = "producers,mutations"
) -> int:
    """FLOOD_PRODUCERS full-speed producers and the mutation loop, all as client id FLOOD_ID, for ``seconds``
    (``parts`` leaves one of them out, to tell which costs the victim what; with "paced-lumps" or "paced-even" in
    it the producers and the loop hold themselves to the quotas)."""
    pace = "lumps" if "paced-lumps" in parts else "even" if "paced-even" in parts else ""
    start = time.monotonic()
    stop_at = start + seconds
    producers = [
        {"delivered": 0, "errors": 0, "produced": 0} for _ in range(FLOOD_PRODUCERS if "producers" in parts else 0)
    ]
    mutations: dict = {"events": [], "throttled": 0, "errors": 0}
    threads = [
        threading.Thread(target=_flood_producer, args=(bootstrap, topic, stop_at, s, pace, k), daemon=True)
        for k, s in enumerate(producers)
    ]
    if "mutations" in parts:
        threads.append(
            threading.Thread(
                target=_mutation_loop, args=(bootstrap, mutation_prefix, stop_at, mutations, bool(pace)), daemon=True
            )
        )
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    out.write_text(
        json.dumps({"start": start, "end": time.monotonic(), "producers": producers, "mutations": mutations})
    )
    return 0


# ------------------------------------------------------------------------------------------ the orchestra
@dataclass
class Result:
    phase: str
    latencies_ms: list[float] = field(default_factory=list)
    rdk_latencies_ms: list[float] = field(default_factory=list)
    flood_slices: list[float] = field(default_factory=list)  # per broker per 1-s slice, / BYTE_QUOTA
    flood_mib_s: float | None = None  # all three brokers, settled window
    mutations_per_s: float | None = None
    mutation_throttled: int = 0
    load_before: float = 0.0
    load_after: float = 0.0
    notes: list[str] = field(default_factory=list)
    round: int = 1
    window_lo: float = 0.0  # the settled window's start (the victim's clock: time.monotonic)
    window_p99_ms: list[float] = field(default_factory=list)  # the victim's p99 per WINDOW_S window, settled
    consumer_mib_s: float | None = None  # the consumer victim, settled window
    consumer_gap_p99_ms: float | None = None  # its p99 gap between batches with records
    consumer_window_gap_p99_ms: list[float] = field(default_factory=list)
    lag_max_ms: float | None = None  # the proxy's event-loop lag (timeline on), settled window
    lag_over_10ms: int | None = None  # lag samples ≥ 10 ms in the settled window
    victim_in_proxy_p99_ms: float | None = None  # timeline: frame read → forwarded + answer read → handed on

    @property
    def flood_ratio(self) -> float | None:
        """The flooder's bytes over all three brokers against its quota (2 MiB/s per broker, three brokers)."""
        return None if self.flood_mib_s is None else self.flood_mib_s * MIB / (3 * BYTE_QUOTA)

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99)


def _create_topic(cluster, topic: str, assignment: list[list[int]]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=len(assignment), replica_assignment=assignment)])[topic].result(
        30
    )
    deadline = time.monotonic() + 30
    while len(_leader_dirs(cluster, topic, assignment)) < len(assignment):
        if time.monotonic() > deadline:
            raise RuntimeError(f"partition directories of {topic} did not appear")
        time.sleep(0.1)


def _leader_dirs(cluster, topic: str, assignment: list[list[int]]) -> dict[int, Path]:
    """Broker id -> the directory of the partition it leads (the first replica: the preferred leader)."""
    found = {}
    for p, replicas in enumerate(assignment):
        d = cluster.broker(replicas[0]).dir / "data" / f"{topic}-{p}"
        if d.is_dir():
            found[replicas[0]] = d
    return found


def _wait_replicated(cluster, topic: str, assignment: list[list[int]], timeout: float = 120) -> float | None:
    """Seconds until every follower of ``topic`` holds as many log bytes as its leader (None: not within
    ``timeout``). A flood leaves followers behind; the next phase's victim (acks=all) would wait for the very
    replica fetchers still copying it, so a phase starts only once they have caught up."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        behind = False
        for p, replicas in enumerate(assignment):
            sizes = [log_bytes([cluster.broker(b).dir / "data" / f"{topic}-{p}"]) for b in replicas]
            behind = behind or any(x < sizes[0] for x in sizes[1:])
        if not behind:
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def _cool_down(pause: float, limit_bytes: int = DIRTY_LIMIT, timeout: float = 60) -> float:
    """Pause, then wait (bounded) until the page cache's dirty bytes are written back; returns the seconds waited.
    A flood leaves gigabytes dirty that the kernel writes back up to 30 s later (dirty_expire_centisecs), in the
    middle of the next phase: the first runs' alone phase right after the warm-up flood read 172-473 ms p99,
    the same phase at the end 31-134 ms."""
    t0 = time.monotonic()
    time.sleep(pause)
    while time.monotonic() - t0 < timeout and dirty_bytes(Path("/proc/meminfo").read_text()) > limit_bytes:
        time.sleep(0.5)
    return time.monotonic() - t0


def _delete_topics(cluster, prefix: str) -> None:
    """Best effort: the phase's topics (and a mutation topic the loop left behind) go, so disks do not fill."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    names = [t for t in admin.list_topics(timeout=15).topics if t.startswith(prefix)]
    if names:
        for fut in admin.delete_topics(names, request_timeout=30).values():
            with contextlib.suppress(Exception):
                fut.result(30)


def _set_broker_quotas(cluster, add: bool) -> None:
    action = (
        ("--add-config", f"producer_byte_rate={BYTE_QUOTA},controller_mutation_rate={MUTATION_QUOTA}")
        if add
        else ("--delete-config", "producer_byte_rate,controller_mutation_rate")
    )
    cluster.tool(
        "configs",
        "--bootstrap-server",
        cluster.bootstrap,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        FLOOD_ID,
        *action,
        check=True,
    )


def _spawn(role: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.isolation", role, *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait(proc: subprocess.Popen, timeout: float, what: str) -> None:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise RuntimeError(f"{what} did not finish within {timeout:.0f} s") from None
    if rc != 0:
        raise RuntimeError(f"{what} exited {rc}")


def proxy_config(phase: str) -> dict | None:
    """The proxy's config for a phase (None: the phase goes straight to the cluster)."""
    quotas = {
        "quotas.entities": [
            {
                "entity": {"client-id": FLOOD_ID},
                "quotas": {"producer_byte_rate": BYTE_QUOTA, "controller_mutation_rate": MUTATION_QUOTA},
            }
        ]
    }
    configs: dict[str, dict[str, object]] = {
        "alone-proxy": {},
        "alone-proxy-again": {},
        "flood-noquota": {},
        "flood-kafka": {**quotas, "quotas.enforcement": "kafka"},
        "flood-smooth": {**quotas, "quotas.enforcement": "smooth", "quotas.smooth_burst_seconds": 0.1},
    }
    return configs.get(phase)


def run_phase(
    cluster,
    workdir: Path,
    phase: str,
    seconds: float,
    settle: float,
    flood: bool,
    bootstrap: str,
    parts: str = "producers,mutations",
    consumer_topic: str | None = None,
    timeline: Path | None = None,
) -> Result:
    tag = uuid.uuid4().hex[:6]
    prefix = f"iso-{phase}-{tag}"
    nodes = [b.node_id for b in cluster.brokers]
    assignment = [nodes[i:] + nodes[:i] for i in range(3)]  # partition i led by broker i+1, replicas on all three
    victim_topic, flood_topic = f"{prefix}-victim", f"{prefix}-flood"
    _create_topic(cluster, victim_topic, assignment)
    if flood:
        _create_topic(cluster, flood_topic, assignment)
    dirs = _leader_dirs(cluster, flood_topic, assignment) if flood else {}
    res = Result(phase, load_before=os.getloadavg()[0])
    victim_out, flood_out = workdir / f"{prefix}-victim.json", workdir / f"{prefix}-flood.json"
    samplers = {b: Sampler(functools.partial(_dir_bytes, d), interval=SAMPLE_S) for b, d in dirs.items()}
    with contextlib.ExitStack() as stack:
        for s in samplers.values():
            stack.enter_context(s)
        flooder = (
            _spawn("flood", bootstrap, flood_topic, str(seconds), str(flood_out), f"{prefix}-mut", parts)
            if flood
            else None
        )
        consumer_out = workdir / f"{prefix}-consumer.json"
        consumer = (
            _spawn("consumer", bootstrap, consumer_topic, str(seconds), str(consumer_out))
            if consumer_topic is not None
            else None
        )
        victim = _spawn("victim", bootstrap, victim_topic, str(seconds), str(victim_out))
        _wait(victim, seconds + 90, "victim")
        if consumer is not None:
            _wait(consumer, seconds + 90, "consumer")
        if flooder is not None:
            _wait(flooder, seconds + 90, "flooder")
    res.load_after = os.getloadavg()[0]
    v = json.loads(victim_out.read_text())
    lo, hi = v["start"] + settle, v["start"] + seconds - TAIL_S
    res.latencies_ms = [x * 1000 for x in settled_latencies(v["rows"], lo, hi)]
    res.rdk_latencies_ms = [r[2] * 1000 for r in v["rows"] if lo <= r[0] < hi and r[2] == r[2]]
    res.window_p99_ms = [percentile(w, 99) * 1000 for w in windows(v["rows"], lo, hi) if w]
    res.window_lo = lo
    if consumer_topic is not None:
        c = json.loads(consumer_out.read_text())
        rows = [r for r in c["rows"] if lo <= r[0] < hi]
        res.consumer_mib_s = sum(r[2] for r in rows) / (hi - lo) / MIB
        if rows:
            res.consumer_gap_p99_ms = percentile([r[1] for r in rows], 99) * 1000
        res.consumer_window_gap_p99_ms = [percentile(w, 99) * 1000 for w in windows(c["rows"], lo, hi) if w]
    if timeline is not None and timeline.exists():
        _read_timeline(res, timeline, lo, hi)
    if v["error_count"] or v["undelivered"]:
        res.notes.append(f"victim: {v['error_count']} errors {v['errors'][:2]}, {v['undelivered']} undelivered")
    if flood:
        f = json.loads(flood_out.read_text())
        lo, hi = f["start"] + settle, f["start"] + seconds - TAIL_S
        total = 0.0
        for s in samplers.values():
            inc = slice_increments(s.samples, lo, hi)
            res.flood_slices += [x / BYTE_QUOTA for x in inc]
            total += value_at(s.samples, hi) - value_at(s.samples, lo)
        res.flood_mib_s = total / (hi - lo) / MIB
        m = f["mutations"]
        res.mutations_per_s = sum(n for t, n in m["events"] if lo <= t < hi) / (hi - lo)
        res.mutation_throttled = m["throttled"]
        errs = sum(p["errors"] for p in f["producers"])
        if errs:
            first = next(p.get("first_error") for p in f["producers"] if p["errors"])
            res.notes.append(f"flood produce errors {errs} ({first})")
        if m["errors"]:
            res.notes.append(f"mutation errors {m['errors']} ({m.get('first_error')})")
        if m["throttled"]:  # librdkafka's Create/DeleteTopics predate KIP-599's error: it is held by throttle_time
            res.notes.append(f"THROTTLING_QUOTA_EXCEEDED answers {m['throttled']}")
        caught_up = _wait_replicated(cluster, flood_topic, assignment)
        res.notes.append(
            "followers caught up "
            + (f"{caught_up:.0f} s after the flood" if caught_up is not None else "NOT within 120 s after the flood")
        )
    _delete_topics(cluster, prefix)
    return res


def _read_timeline(res: Result, path: Path, lo: float, hi: float) -> None:
    """The proxy's timeline (proxy/loop_lag.py; one clock: both are time.monotonic on one machine): the loop's
    lag in the settled window, and the victim's time inside the proxy per request (read → forwarded, plus the
    answer's read → handed to the client), to put beside the flooder's bursts."""
    lags: list[float] = []
    reqs: dict[tuple[str, int], tuple[float, float]] = {}
    inside: list[float] = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec[0] == "lag" and lo <= rec[1] < hi:
            lags.append(rec[2])
        elif rec[0] == "req" and rec[2] == VICTIM_ID and lo <= rec[6] < hi:
            reqs[(rec[1], rec[4])] = (rec[6], rec[7])
        elif rec[0] == "resp" and (rec[1], rec[2]) in reqs:
            read, fwd = reqs.pop((rec[1], rec[2]))
            inside.append((fwd - read) + (rec[5] - rec[4]))
    res.lag_max_ms = max(lags, default=0.0) * 1000
    res.lag_over_10ms = sum(1 for x in lags if x >= 0.010)
    if inside:
        res.victim_in_proxy_p99_ms = percentile(inside, 99) * 1000


def _dir_bytes(d: Path) -> int:
    return log_bytes([d])


def references(results: Sequence[Result]) -> dict[str, float]:
    """The victim's p99 alone, per path: ``proxy`` pools the records of both alone-through-the-proxy phases (before
    and after the floods), so one phase caught in a neighbour's load spike does not set every ratio; ``direct``
    is alone-direct. A path without an alone phase has no entry."""
    pooled = [x for r in results if r.phase in ("alone-proxy", "alone-proxy-again") for x in r.latencies_ms]
    direct = [x for r in results if r.phase == "alone-direct" for x in r.latencies_ms]
    out = {}
    if pooled:
        out["proxy"] = percentile(pooled, 99)
    if direct:
        out["direct"] = percentile(direct, 99)
    return out


def path_of(phase: str) -> str:
    """Which path the victim took in a phase: straight to the cluster or through the proxy."""
    return "direct" if phase in ("alone-direct", "flood-broker", "flood-paced", "flood-paced-even") else "proxy"


def format_table(results: list[Result]) -> list[str]:
    refs = references(results)
    lines = [
        "| phase | victim p50 ms | victim p99 ms | p99 / alone via proxy (pooled) | p99 / alone, same path | "
        "p99 ms, librdkafka's clock | victim records | flooder 1-s slices / quota, per broker: "
        "min / median / max | flooder MiB/s, 3 brokers | mutations/s (quota 5 per broker) | "
        "load avg 1 min before → after | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if not r.latencies_ms:
            lines.append(
                f"| {LABELS[r.phase]} | – | – | – | – | – | 0 | – | – | – | "
                f"{r.load_before:.1f} → {r.load_after:.1f} | no settled records; {'; '.join(r.notes)} |"
            )
            continue
        ratio = f"{r.p99 / refs['proxy']:.2f}" if "proxy" in refs else "–"
        same = f"{r.p99 / refs[path_of(r.phase)]:.2f}" if path_of(r.phase) in refs else "–"
        rdk = f"{percentile(r.rdk_latencies_ms, 99):.1f}" if r.rdk_latencies_ms else "–"
        sl = "–"
        if r.flood_slices:
            a, b, c = spread(r.flood_slices)
            sl = f"{a:.2f} / {b:.2f} / {c:.2f}"
        fl = f"{r.flood_mib_s:.1f}" if r.flood_mib_s is not None else "–"
        mu = f"{r.mutations_per_s:.1f}" if r.mutations_per_s is not None else "–"
        lines.append(
            f"| {LABELS[r.phase]} | {r.p50:.1f} | {r.p99:.1f} | {ratio} | {same} | {rdk} | "
            f"{len(r.latencies_ms):,} | {sl} | {fl} | {mu} | {r.load_before:.1f} → {r.load_after:.1f} | "
            f"{'; '.join(r.notes)} |"
        )
    return lines


def _mr(values: Sequence[float], fmt: str = ".1f") -> str:
    """Median and range: ``median (min–max)``."""
    if not values:
        return "–"
    a, b, c = spread(values)
    return f"{b:{fmt}} ({a:{fmt}}–{c:{fmt}})"


def summary_table(results: list[Result]) -> list[str]:
    """Per phase over its rounds: the median and range of the victim's settled p99, of its worst 5-s window, of the
    flooder's total against its quota, the consumer victim's figures, and the loop's lag (with --timeline)."""
    lines = [
        "| phase | rounds | victim p99 ms: median (range) | worst 5-s window p99 ms | p99 / alone via proxy, same "
        "round | flooder total / quota | consumer MiB/s | consumer gap p99 ms | loop lag max ms | victim inside "
        "proxy p99 ms | load avg 1 min |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    alone = {r.round: r.p99 for r in results if r.phase == "alone-proxy" and r.latencies_ms}
    for phase in PHASES:
        rs = [r for r in results if r.phase == phase and r.latencies_ms]
        if not rs:
            continue
        ratios = [r.p99 / alone[r.round] for r in rs if r.round in alone]
        lines.append(
            f"| {LABELS[phase]} | {len(rs)} | {_mr([r.p99 for r in rs])} | "
            f"{_mr([max(r.window_p99_ms) for r in rs if r.window_p99_ms])} | {_mr(ratios, '.2f')} | "
            f"{_mr([r.flood_ratio for r in rs if r.flood_ratio is not None], '.2f')} | "
            f"{_mr([r.consumer_mib_s for r in rs if r.consumer_mib_s is not None], '.0f')} | "
            f"{_mr([r.consumer_gap_p99_ms for r in rs if r.consumer_gap_p99_ms is not None], '.0f')} | "
            f"{_mr([r.lag_max_ms for r in rs if r.lag_max_ms is not None], '.0f')} | "
            f"{_mr([r.victim_in_proxy_p99_ms for r in rs if r.victim_in_proxy_p99_ms is not None], '.2f')} | "
            f"{_mr([r.load_after for r in rs])} |"
        )
    return lines


def target_lines(results: list[Result]) -> list[str]:
    """Issue 30's target, read off the table: smooth ≤ 1.5 × alone; kafka and the brokers' quotas for comparison."""
    by = {r.phase: r for r in results if r.latencies_ms}
    refs = references(results)
    if "proxy" not in refs:
        return ["(no alone-proxy phase: no ratios)"]
    ref = refs["proxy"]
    each = ", ".join(f"{by[p].p99:.1f} ms ({p})" for p in ("alone-proxy", "alone-proxy-again") if p in by)
    out = [
        f"- Reference: the victim's p99 alone through the proxy, both alone phases pooled: {ref:.1f} ms (each: {each})."
    ]
    for phase in ("flood-smooth", "flood-kafka", "flood-broker", "flood-noquota"):
        if phase in by:
            r = by[phase]
            verdict = (
                (
                    " — target ≤ 1.5×: "
                    + (
                        "met"
                        if r.p99 <= 1.5 * ref
                        else "met within 3 ms of noise"
                        if r.p99 <= 1.5 * ref + 3
                        else "NOT met"
                    )
                )
                if phase == "flood-smooth"
                else ""
            )
            same = path_of(phase)
            extra = (
                f"; {r.p99 / refs['direct']:.2f} × alone straight to the cluster ({refs['direct']:.1f} ms)"
                if same == "direct" and "direct" in refs
                else ""
            )
            out.append(
                f"- {LABELS[phase]}: victim p99 {r.p99:.1f} ms = {r.p99 / ref:.2f} × alone through the "
                f"proxy{extra}{verdict}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "victim":
        return victim_main(argv[1], argv[2], float(argv[3]), Path(argv[4]))
    if argv and argv[0] == "flood":
        return flood_main(argv[1], argv[2], float(argv[3]), Path(argv[4]), argv[5], argv[6])
    if argv and argv[0] == "consumer":
        return consumer_main(argv[1], argv[2], float(argv[3]), Path(argv[4]))
    if argv and argv[0] == "fill":
        return fill_main(argv[1], argv[2], int(argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="length of each phase (default 40)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds at the start of a phase not counted")
    ap.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="unmeasured: victim + flood straight to the cluster, then victim alone through a proxy",
    )
    ap.add_argument(
        "--cooldown",
        type=float,
        default=5.0,
        help="pause after each flood, then a wait (≤ 60 s) for the page cache to be written back",
    )
    ap.add_argument("--phases", default="all", help=f"comma list of {', '.join(PHASES)} (default all)")
    ap.add_argument(
        "--flood",
        default="producers,mutations",
        help="what the flooder runs: producers, mutations or both (default both; one alone tells which "
        "costs the victim what)",
    )
    ap.add_argument("--output", type=Path, help="also write the table (markdown) here")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="every phase this many times, interleaved (round 1 runs each phase once, then round 2...): the "
        "summary gives each phase's median and range over the rounds (default 3)",
    )
    ap.add_argument(
        "--consumer",
        action="store_true",
        help="a second victim: one consumer re-reading a pre-filled topic at full speed in every phase",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="the proxy records its per-request timeline and loop lag (KTP_TIMELINE): the loop's lag and the "
        "victim's time inside the proxy per phase; kept in the workdir with --keep",
    )
    ap.add_argument("--keep", action="store_true", help="keep the workdir (timelines, victims' records)")
    args = ap.parse_args(argv)
    phases = parse_phases(args.phases)
    if args.settle >= args.seconds - 5:
        ap.error("--settle must leave at least 5 s of each phase")

    from bench.run import machine_info, proxy_code_version
    from tests.harness import KafkaCluster
    from tests.support import ProxyProcess

    command = shlex.join([".venv/bin/python", "-m", "bench.isolation", *argv])
    started = datetime.datetime.now().astimezone()
    code = proxy_code_version()
    t_start = time.monotonic()
    results: list[Result] = []
    workdir = Path(tempfile.mkdtemp(prefix="ktp-iso-"))
    warnings = 0
    # Deleted topics' files go 1 s after the delete (Kafka's default 60 s would land a flood's gigabytes of unlinks
    # in a later phase); the cool-down covers that second.
    with KafkaCluster(3, workdir=workdir / "kafka", server_props={"file.delete.delay.ms": 1000}) as cluster:
        info = machine_info(cluster, code)
        if args.warmup > 0:
            print(f"warm-up: victim + flood straight to the cluster, {args.warmup:.0f} s", flush=True)
            run_phase(cluster, workdir, "warmup", args.warmup, 0, True, cluster.bootstrap)
            print(f"cool-down after the warm-up: {_cool_down(args.cooldown):.0f} s", flush=True)
            # Then the victim alone through a proxy, unmeasured: in four runs the first measured phase after the
            # flood warm-up (alone-proxy) read 118-473 ms p99 against 31-134 ms for the same phase at the end, with
            # the page cache already written back; whatever the brokers still settle after a flood (JIT, GC, the
            # mutation loop's metadata), it is not the reference's to carry.
            warm = ProxyProcess(workdir, cluster.bootstrap, {}, name="proxy-warmup").start()
            try:
                quiet = run_phase(cluster, workdir, "warmup-alone", args.warmup, 0, False, warm.bootstrap)
            finally:
                warm.terminate()
            print(
                f"warm-up: victim alone through the proxy, {args.warmup:.0f} s, unmeasured (p99 {quiet.p99:.1f} ms)"
                if quiet.latencies_ms
                else "warm-up: victim alone through the proxy: no records",
                flush=True,
            )
        consumer_topic = None
        if args.consumer:
            consumer_topic = "iso-consumer-victim"
            nodes = [b.node_id for b in cluster.brokers]
            _create_topic(cluster, consumer_topic, [nodes[i:] + nodes[:i] for i in range(3)])
            _wait(_spawn("fill", cluster.bootstrap, consumer_topic, str(CONSUMER_FILL)), 300, "fill")
            print(f"consumer victim's topic filled: {CONSUMER_FILL // MIB} MiB", flush=True)
        for rnd, phase in ((r, p) for r in range(1, args.rounds + 1) for p in phases):
            flood = phase.startswith("flood")
            cfg = proxy_config(phase)
            proxy = None
            if phase == "flood-broker":
                _set_broker_quotas(cluster, add=True)
                time.sleep(2)  # the brokers apply client quota changes asynchronously
            timeline = workdir / f"timeline-{phase}-{rnd}.jsonl" if args.timeline and cfg is not None else None
            if cfg is not None:
                saved = os.environ.get("KTP_TIMELINE")
                if timeline is not None:
                    os.environ["KTP_TIMELINE"] = str(timeline)
                try:
                    proxy = ProxyProcess(workdir, cluster.bootstrap, cfg, name=f"proxy-{phase}-{rnd}").start()
                finally:
                    os.environ.pop("KTP_TIMELINE", None)
                    if saved is not None:
                        os.environ["KTP_TIMELINE"] = saved
            try:
                res = run_phase(
                    cluster,
                    workdir,
                    phase,
                    args.seconds,
                    args.settle,
                    flood,
                    proxy.bootstrap if proxy else cluster.bootstrap,
                    args.flood + PACING.get(phase, ""),
                    consumer_topic,
                    None,
                )
            finally:
                if proxy is not None:
                    proxy.terminate()  # the timeline's last second is written at shutdown
                    warnings += sum(1 for ln in proxy.log().splitlines() if " WARNING " in ln or " ERROR " in ln)
                if phase == "flood-broker":
                    _set_broker_quotas(cluster, add=False)
            if timeline is not None and timeline.exists():
                v_lo = res.window_lo
                _read_timeline(res, timeline, v_lo, v_lo + args.seconds - args.settle - TAIL_S)
            if flood:
                res.notes.append(f"cool-down after it {_cool_down(args.cooldown):.0f} s")
            res.round = rnd
            results.append(res)
            print(
                f"round {rnd} {phase}: "
                + (f"victim p50 {res.p50:.1f} ms p99 {res.p99:.1f} ms" if res.latencies_ms else "no victim records")
                + (
                    f"; flooder {res.flood_mib_s:.1f} MiB/s, slices/quota {spread(res.flood_slices)}"
                    if res.flood_slices
                    else ""
                )
                + f"; windows p99 {' '.join(f'{x:.0f}' for x in res.window_p99_ms)}"
                + (
                    f"; consumer {res.consumer_mib_s:.0f} MiB/s gap p99 {res.consumer_gap_p99_ms:.0f} ms"
                    if res.consumer_gap_p99_ms is not None
                    else ""
                )
                + (
                    f"; loop lag max {res.lag_max_ms:.0f} ms, {res.lag_over_10ms} ≥ 10 ms, victim inside the proxy "
                    f"p99 {res.victim_in_proxy_p99_ms or 0:.2f} ms"
                    if res.lag_max_ms is not None
                    else ""
                )
                + f"; load {res.load_before:.1f} → {res.load_after:.1f}; {'; '.join(res.notes)}",
                flush=True,
            )
    minutes = (time.monotonic() - t_start) / 60
    table = format_table(results)
    targets = target_lines(results)
    if args.rounds > 1:
        table = [*summary_table(results), "", "Every phase of every round:", "", *table]
    head = [
        f"- Command: `{command}` ({minutes:.1f} min in total); date {started:%Y-%m-%d %H:%M %Z}; "
        f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        *info,
        f"- Proxy logs: {warnings} WARNING/ERROR lines.",
    ]
    print("\n".join(["", *head, "", *table, "", *targets]))
    if args.output:
        args.output.write_text("\n".join([*head, "", *table, "", *targets]) + "\n")
    import shutil

    if args.keep:
        print(f"workdir kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
