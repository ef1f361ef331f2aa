"""Isolation: a steady victim producer beside a flooder held by quotas (issue 30, item 5) or by fair share (issue 48).

    .venv/bin/python -m bench.isolation [--seconds 40] [--settle 10] [--phases alone-proxy,flood-smooth,...]

What a quota is for, seen from the neighbour: a tenant at its quota should cost the other tenants of the same
brokers little; what fair share is for: the same with no quota anywhere, without costing a tenant that harms
nobody anything. Three brokers (tests.harness), one proxy, these clients:

  * VICTIM (client id ``victim``, no quota): 200 records/s of 1 KiB, ``acks=all``, ``linger.ms=0``, round-robin
    over a 3-partition RF-3 topic (one leader per broker), in its own process so the flood's Python threads do not
    hold its GIL. Latency per record = monotonic time of ``produce()`` to monotonic time of its delivery callback
    (the process polls whenever it is not sending, so a callback runs as soon as librdkafka queues its report);
    librdkafka's own ``msg.latency()`` (enqueue to acknowledgement, no Python scheduling) is printed beside it.
  * FLOODER (client id ``flooder``): three confluent-kafka producers at full speed (16 KiB records, 1 MB batches,
    ``acks=all``, a 3-partition RF-3 topic led by brokers 1, 2, 3) plus a CreateTopics/DeleteTopics loop (topics of
    2 partitions, RF 1), in a second process. Quotas on its client id, where a phase sets them: producer_byte_rate
    2 MiB/s per broker (the proxy's default scope, as Kafka means it) and controller_mutation_rate 5/s (in the
    proxy one bucket per client id for the whole cluster, whatever the scope: quotas/kinds.py ``cluster_wide``).
    Two other shapes, where a phase says so: the same flood spread over 20 client ids ``flooder-0``..``flooder-19``
    (each producer queues a twentieth of the three's 24 MiB, so memory stays that of the one-id flood; the mutation
    loop runs as ``flooder-0``), and a CONSUMER as ``flooder`` re-reading a 256-MiB backlog (filled once, before
    the first phase that reads it) from its beginning, over and over, at full speed.
  * STEADY TENANTS (client ids ``steady-a`` and ``steady-b``, the steady-* phases, no victim): each produces
    ``--steady-rate`` MiB/s over the three brokers (16-KiB records evenly spaced, ``acks=all``), in one process.

Fair share (issue 48) is on by default, so every phase through the proxy has it unless it says "off". The issue-48
phases through the proxy (flood-noquota and its -off, flood-hand, flood-consumer and its -off, flood-ids, lone-*,
steady-*) set the product's default enforcement, ``smooth``: tests.support's ProxyProcess sets ``kafka`` for the
tests written before smooth became the default, and the alone and older quota phases keep that, as every earlier
run of this benchmark had.

Phases (each ``--seconds`` long from the flooder's start, the victim started ``VICTIM_LEAD_S`` before it; the first
``--settle`` seconds, while connections open and a windowed quota's first burst passes, are not counted; fresh
topics each; after each phase with a flooder a ``--cooldown`` pause, then a wait, at most 60 s, until the kernel
has written the flood's dirty pages back):

  alone-proxy    victim alone, through the proxy (no quota): the reference every ratio divides by
  alone-direct   victim alone, straight to the cluster
  flood-noquota  victim + flood through the proxy, no quota, the default config: fair share on
  flood-noquota-off  the same with quotas.fair_share.enabled: false (what the proxy did before issue 48)
  flood-nostart  the same with fair share on but quotas.fair_share.slow_start: false (what a surge did before it)
  flood-target   the same with fair share's target_delay_ms at ``--fair-target`` (default 0.5 against the default's
                 1): the point on the trade-off between the victim's tail and the flood's bytes
  flood-direct   victim + flood straight to the cluster, no quota anywhere
  flood-kafka    victim + flood through the proxy, quotas.enforcement: kafka (ProxyProcess's, not the product's)
  flood-smooth   victim + flood through the proxy, quotas.enforcement: smooth, smooth_burst_seconds 0.1
  flood-smooth-off  the same with quotas.fair_share.enabled: false (does fair share on top of a quota help?)
  flood-hand     victim + flood through the proxy, a smooth quota set by hand at the rate fair share settled on
                 in the same round's flood-noquota: producer_byte_rate = the flooder's MiB/s at the leaders / 3
                 brokers, controller_mutation_rate = its mutations/s (one bucket cluster-wide); without a
                 flood-noquota that round, ``--hand-rate`` MiB/s per broker and 5/s. Fair share off: the quota
                 alone, so the flooder gets that rate (with fair share on it still took the flooder below it).
                 The rate is in the notes, and the flooder's "/ quota" figures divide by it
  flood-broker   victim + flood straight to the cluster, the 2 MiB/s and 5/s quotas set on the brokers (kafka-configs)
  flood-paced    victim + flood straight to the cluster, no quota anywhere: the flooder paces itself to exactly
                 its quota (a ~1 MB batch to the next partition every 1/6 s, mutations at 5/s): the best any
                 pacing of the same lumps can do, so what is left above alone is what these bytes cost the brokers
  flood-paced-even  the same, the flooder's bytes spread evenly in 16-KiB batches: what the lumps add
  flood-consumer victim + the consumer flooder through the proxy, no quota, fair share on
  flood-consumer-off  the same, fair share off
  flood-ids      victim + the flood over 20 client ids through the proxy, no quota, fair share on (tenant: the
                 default ``user_client``, so 20 tenants)
  lone-fair      the flooder alone (no victim), through the proxy, no quota, fair share on: what fair share costs
                 a flood that harms nobody (issue 48: it keeps ≥ 95 % of lone-nofair's MiB/s at the leaders)
  lone-nofair    the same, fair share off
  lone-alt       the same flooder, one proxy, fair share turned on and off by a reload every ALT_SLICE_S: the lone
                 bound read where the brokers' minute-to-minute speed cannot move it (two phases a minute apart
                 read the brokers answering in 389 against 263 ms p50 with fair share holding no request, run K
                 2026-12-07); odd rounds start on, even rounds off
  steady-fair    the two steady tenants alone (no victim), through the proxy, no quota, fair share on: tenants that
                 use about the same are never limited (issue 48: each gets ≥ 95 % of ``--steady-rate``)
  steady-nofair  the same, fair share off
  alone-proxy-again  victim alone, through the proxy, once more: how far the machine drifted meanwhile

Even rounds run lone-nofair before lone-fair and steady-nofair before steady-fair (``round_order``), so neither
side of a pair always comes second. flood-hand always runs after its round's flood-noquota: it needs that phase's
rate, and a hand quota at another round's rate compared two different floods (run E, 2026-12-07: round 2 set
3.0 MiB/s by hand against fair share's 17.5).

Before the phases, unmeasured (``--warmup`` s each): victim + flood straight to the cluster (fresh brokers' JIT),
then the victim alone through a proxy (the first phase after a flood read slow in every run without it).
A flood leaves followers behind; the next phase starts only once they have caught up (a victim with acks=all
would otherwise wait for the replica fetchers still copying the last flood), and that wait is reported.

The flooder's rate is measured where its bytes land: the size of each partition's log on its leader's disk,
sampled every 0.1 s, cut into 1-s slices per broker and divided by the per-broker quota (an unquoted phase is
divided by the same 2 MiB/s, to show how far above it goes). Mutations: partitions created + deleted per second
over the settled window, against 5/s. The consumer flooder's rate is the bytes it was handed per second, and each
steady tenant's the bytes acknowledged to it per second (0.1-s slots), both over the settled window. The proxy's
"fair share: ... saturated" log lines of a phase are in its notes. Load averages (1 min) are read before and after
each phase: the machine has two cores and is shared, so every figure here is as noisy as that load.

The victim's p99 is also read per 5-s window: over the settled window (a stall hides in a phase's p99), and from
the phase's start, where the first window holds the flood starting (what fair share takes to bite) and the worst
window after it what is left once it has.

Issue 30's target: with the flooder at its quota in smooth mode, the victim's settled p99 ≤ 1.5 × its p99 alone
through the proxy (plus a few ms of scheduling noise on 2 cores). That reference pools the records of both alone
phases through the proxy, before and after the floods: in the first full run one of them (473 ms, at load 17) was
3.5 times the other (134 ms), and a ratio to either alone would say more about the neighbours than the quota.
Phases straight to the cluster are also divided by alone-direct ("same path"). With several ``--rounds`` the
summary gives each phase's median and range over the rounds, and each ratio is taken within one round.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
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
FLOOD_QUEUE_KIB = 8192  # queue.buffering.max.kbytes of each of the one-id flood's producers
FLOOD_IDS = 20  # flood-ids: the client ids the flood is spread over, one producer each
BACKLOG_FILL = 256 * MIB  # the consumer flooder's backlog: read over and over, from the page cache
STEADY_IDS = ("steady-a", "steady-b")
FLOOD_BATCH = 1_000_000  # librdkafka's batch.size cap (message.max.bytes): ~1 MB per partition per request
FLOOD_MAX_RECORDS = 2_000_000  # per producer: a bound on top of the clock (≈ 30 GiB, never reached in a phase)
MUTATION_PARTITIONS = 2  # partitions per topic the mutation loop creates and deletes: 2 mutations each way
MUTATION_MAX_CYCLES = 5_000
BYTE_QUOTA = 2 * MIB
MUTATION_QUOTA = 5
SAMPLE_S = 0.1
DIRTY_LIMIT = 64 * MIB  # a cool-down ends once the page cache holds less than this to write back
TAIL_S = 0.5  # the last half second of a phase: clients winding down
ALT_SLICE_S = 6.0
"""lone-alt: fair share is turned on or off (a reload: config/reload.py puts ``quotas.fair_share`` in force at once)
every this many seconds from the flooder's start."""
ALT_SKIP_S = 2.0
"""lone-alt: the first seconds of each slice are not counted: the brokers still answer the other state's requests
(1-MB batches answered in 0.3-0.4 s, five in flight per connection), and the leaders' logs take what was queued."""
VICTIM_LEAD_S = 5.0
"""The victim starts this long before the flooder, and a phase's clock (its windows, its settled window) starts with
the flooder: the first 5-s window is the flood starting, not the victim's own first requests on a fresh topic, which
read 704 and 801 ms at p99 with no flood at all (alone-proxy, rounds 1 and 3, 2026-12-07), as high as any flood's
first window beside them."""

PHASES = (
    "alone-proxy",
    "alone-direct",
    "flood-noquota",
    "flood-noquota-off",
    "flood-nostart",
    "flood-target",
    "flood-direct",
    "flood-kafka",
    "flood-smooth",
    "flood-smooth-off",
    "flood-hand",  # after flood-noquota: it takes that phase's rate in the same round
    "flood-broker",
    "flood-paced",
    "flood-paced-even",
    "flood-consumer",
    "flood-consumer-off",
    "flood-ids",
    "lone-fair",
    "lone-nofair",
    "lone-alt",
    "steady-fair",
    "steady-nofair",
    "alone-proxy-again",
)
LABELS = {
    "alone-proxy": "victim alone, through the proxy",
    "alone-direct": "victim alone, straight to the cluster",
    "flood-noquota": "victim + flood, proxy, no quota, fair share on (default config)",
    "flood-noquota-off": "victim + flood, proxy, no quota, fair share off",
    "flood-nostart": "victim + flood, proxy, no quota, fair share on, slow start off",
    "flood-target": "victim + flood, proxy, no quota, fair share on at --fair-target ms",
    "flood-direct": "victim + flood, straight to the cluster, no quota",
    "flood-kafka": "victim + flood, proxy, enforcement kafka",
    "flood-smooth": "victim + flood, proxy, enforcement smooth (burst 0.1 s)",
    "flood-smooth-off": "victim + flood, proxy, enforcement smooth (burst 0.1 s), fair share off",
    "flood-hand": "victim + flood, proxy, smooth quota set by hand at fair share's rate, fair share off",
    "flood-broker": "victim + flood, straight to the cluster, quotas on the brokers",
    "flood-paced": "victim + flood paced by the flooder itself at the quota in 1-MB lumps, straight to the cluster",
    "flood-paced-even": "victim + flood paced by the flooder itself at the quota in 16-KiB batches, straight",
    "flood-consumer": "victim + consumer flooder, proxy, no quota, fair share on",
    "flood-consumer-off": "victim + consumer flooder, proxy, no quota, fair share off",
    "flood-ids": "victim + flood over 20 client ids, proxy, no quota, fair share on",
    "lone-fair": "flooder alone, proxy, no quota, fair share on",
    "lone-nofair": "flooder alone, proxy, no quota, fair share off",
    "lone-alt": f"flooder alone, proxy, no quota, fair share on and off by turns every {ALT_SLICE_S:g} s",
    "steady-fair": "two steady tenants alone, proxy, no quota, fair share on",
    "steady-nofair": "two steady tenants alone, proxy, no quota, fair share off",
    "alone-proxy-again": "victim alone, through the proxy, again (drift)",
}
DIRECT = frozenset({"alone-direct", "flood-direct", "flood-broker", "flood-paced", "flood-paced-even"})
"""The phases that go straight to the cluster, no proxy."""
NO_VICTIM = frozenset({"lone-fair", "lone-nofair", "lone-alt", "steady-fair", "steady-nofair"})
"""The phases without a victim: what fair share costs tenants that harm nobody."""


# ------------------------------------------------------------------------------------------ phases
FLOOD_EXTRA = {"flood-paced": ",paced-lumps", "flood-paced-even": ",paced-even", "flood-ids": ",ids"}
"""What flood_main's ``parts`` gets added in these phases: the flooder paces itself, or spreads over client ids."""
CONSUMER_FLOOD = "consumer"
"""flood_parts' answer for the phases whose flooder is a consumer re-reading the backlog (not flood_main)."""


def flood_parts(phase: str, flood: str) -> str | None:
    """What a phase's flooder runs: flood_main's ``parts`` (``flood`` is --flood's), CONSUMER_FLOOD, or None (no
    flooder: the alone phases)."""
    if phase.startswith("steady"):
        return "steady"
    if phase.startswith("flood-consumer"):
        return CONSUMER_FLOOD
    if phase.startswith(("flood", "lone")):
        return flood + FLOOD_EXTRA.get(phase, "")
    return None


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


# Phases compared as a pair (fair share on beside off, no victim): in canonical order one side would always run
# second, after the other's flood and its disk write-back, and the first full run read lone-fair 0.76-0.84 of
# lone-nofair with fair share never engaging. Even rounds swap each pair, so an order effect shows as a spread.
SWAPPED_PAIRS = (
    ("lone-fair", "lone-nofair"),
    ("steady-fair", "steady-nofair"),
)
"""Pairs read side by side, swapped in even rounds so that neither side always runs first after the warm-up or the
other's flood (a round-1 fair-share phase started on brokers still busy from the warm-up read 5-100 x its later
rounds, 2026-12-07). Not flood-noquota and flood-hand: flood-hand takes its rate from the same round's
flood-noquota (:func:`hand_quota`), so it must run second; the cool-down and dirty-page wait between them is
what keeps the first flood out of the second's figures."""


def round_order(phases: Sequence[str], rnd: int) -> list[str]:
    """The phases of round ``rnd`` (from 1): the canonical order, with each of SWAPPED_PAIRS swapped in even rounds."""
    order = list(phases)
    if rnd % 2 == 0:
        for a, b in SWAPPED_PAIRS:
            if a in order and b in order:
                i, j = order.index(a), order.index(b)
                order[i], order[j] = b, a
    return order


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


def consumer_main(bootstrap: str, topic: str, seconds: float, out: Path, client_id: str = CONSUMER_ID) -> int:
    """The second victim: one consumer (client id CONSUMER_ID, no quota) re-reading a pre-filled topic at full
    speed, from the start again at its end. Its stall measure: the gap between two consecutive batches that
    returned records (``consume(500)``), stamped when each returned; and its bytes per second. As FLOOD_ID over
    the backlog, the same loop is the consumer flooder (a full-speed reader is one whoever it hurts)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
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


@dataclass(frozen=True)
class FloodProducer:
    """One producer of a flooder process: who it is and how it sends."""

    client_id: str = FLOOD_ID
    pace: str = ""  # "lumps" or "even": held to ``rate`` by its own clock; "": full speed
    rate: float = PACED_RATE  # bytes/s, when paced
    queue_kib: int = FLOOD_QUEUE_KIB
    k: int = 0  # its place among the process's producers: the partition it starts at, and (paced) when


def _flood_producer(bootstrap: str, topic: str, start: float, stop_at: float, stats: dict, spec: FloodProducer) -> None:
    """One full-speed flooder, or with ``spec.pace`` ("lumps" or "even") one that holds itself to ``spec.rate``:
    lumps of LUMP_RECORDS to one partition at a time (one ~1 MB batch each, the shape smooth pacing forwards), or
    single records evenly spaced (16-KiB batches). Producer ``k`` of the flood starts at partition ``k``, a third of a
    lump's period after producer k - 1: each broker then gets one lump at a time, evenly spaced, not three in step.
    Acknowledged records are counted per SAMPLE_S slot from ``start`` (``stats["slots"]``): a tenant's rate over the
    settled window, as the producer saw it."""
    from confluent_kafka import KafkaError, Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": spec.client_id,
            "acks": "all",
            "linger.ms": 10,
            "batch.size": FLOOD_BATCH,
            "queue.buffering.max.kbytes": spec.queue_kib,
            "message.timeout.ms": 60_000,
        }
    )
    slots: list[int] = stats["slots"]

    def delivered(err, _msg) -> None:
        if err is None:
            stats["delivered"] += 1
            slot = int((time.monotonic() - start) / SAMPLE_S)
            if slot < len(slots):
                slots[slot] += 1
        elif err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            stats["errors"] += 1
            stats.setdefault("first_error", str(err))

    value = os.urandom(FLOOD_RECORD)
    i = 0
    lump = LUMP_RECORDS if spec.pace == "lumps" else 1
    started = time.monotonic() + spec.k * lump * FLOOD_RECORD / spec.rate / FLOOD_PRODUCERS
    while i < FLOOD_MAX_RECORDS and time.monotonic() < stop_at:
        if spec.pace and i % lump == 0:  # ahead of the rate: wait until the bytes sent so far are due
            due = started + i * FLOOD_RECORD / spec.rate
            while (now := time.monotonic()) < due and now < stop_at:
                p.poll(min(due - now, 0.05))
        try:
            p.produce(topic, value, partition=(i // lump + spec.k) % 3, on_delivery=delivered)
        except BufferError:  # the queue is full (a throttled client): wait for acknowledgements, not spin
            p.poll(0.05)
            continue
        i += 1
        if i % 64 == 0:
            p.poll(0)
    stats["produced"] = i
    p.purge(in_queue=True, in_flight=False)  # what is still queued would take a throttled client half a minute
    p.flush(10)


def _mutation_loop(
    bootstrap: str, prefix: str, stop_at: float, stats: dict, paced: bool = False, client_id: str = FLOOD_ID
) -> None:
    """CreateTopics then DeleteTopics, over and over: what controller_mutation_rate is for. A throttled request
    (THROTTLING_QUOTA_EXCEEDED) is retried after a short pause, as a client following KIP-599 would. ``paced``:
    at most MUTATION_QUOTA partition mutations a second, by the loop's own clock (no quota anywhere)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id})
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
    bootstrap: str,
    topic: str,
    seconds: float,
    out: Path,
    mutation_prefix: str,
    parts: str = "producers,mutations",
    steady_rate: float = 0.0,
) -> int:
    """FLOOD_PRODUCERS full-speed producers and the mutation loop, all as client id FLOOD_ID, for ``seconds``
    (``parts`` leaves one of them out, to tell which costs the victim what; with "paced-lumps" or "paced-even" in
    it the producers and the loop hold themselves to the quotas; with "ids" the flood is FLOOD_IDS producers, one a
    client id, and the loop the first of them; "steady" is the STEADY_IDS tenants instead, each held to
    ``steady_rate`` bytes/s)."""
    pace = "lumps" if "paced-lumps" in parts else "even" if "paced-even" in parts else ""
    start = time.monotonic()
    stop_at = start + seconds
    mutator = FLOOD_ID
    if "steady" in parts:
        specs = [FloodProducer(cid, "even", steady_rate, k=k) for k, cid in enumerate(STEADY_IDS)]
    elif "producers" not in parts:
        specs = []
    elif "ids" in parts:
        # the one-id flood's queue memory, shared: 20 producers must not hold 20 × 8 MiB
        queue = FLOOD_QUEUE_KIB * FLOOD_PRODUCERS // FLOOD_IDS
        specs = [FloodProducer(f"{FLOOD_ID}-{k}", queue_kib=queue, k=k) for k in range(FLOOD_IDS)]
        mutator = specs[0].client_id
    else:
        specs = [FloodProducer(pace=pace, k=k) for k in range(FLOOD_PRODUCERS)]
    slots = int(seconds / SAMPLE_S) + 1
    producers = [
        {"client_id": sp.client_id, "delivered": 0, "errors": 0, "produced": 0, "slots": [0] * slots} for sp in specs
    ]
    mutations: dict = {"events": [], "throttled": 0, "errors": 0}
    threads = [
        threading.Thread(target=_flood_producer, args=(bootstrap, topic, start, stop_at, st, sp), daemon=True)
        for sp, st in zip(specs, producers, strict=True)
    ]
    if "mutations" in parts:
        threads.append(
            threading.Thread(
                target=_mutation_loop,
                args=(bootstrap, mutation_prefix, stop_at, mutations, bool(pace), mutator),
                daemon=True,
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
    flood_slices: list[float] = field(default_factory=list)  # per broker per 1-s slice, / quota_bytes
    flood_mib_s: float | None = None  # all three brokers, settled window
    quota_bytes: float = BYTE_QUOTA  # the flooder's producer_byte_rate per broker (flood-hand sets its own)
    mutations_per_s: float | None = None
    mutation_throttled: int = 0
    flood_read_mib_s: float | None = None  # the consumer flooder: bytes it was handed, settled window
    tenant_mib_s: dict[str, float] = field(default_factory=dict)  # steady tenant -> its acknowledged bytes, settled
    load_before: float = 0.0
    load_after: float = 0.0
    notes: list[str] = field(default_factory=list)
    round: int = 1
    window_lo: float = 0.0  # the settled window's start (the victim's clock, or the flooder's: time.monotonic)
    window_p99_ms: list[float] = field(default_factory=list)  # the victim's p99 per WINDOW_S window, settled
    start_window_p99_ms: list[float] = field(default_factory=list)  # the same from the phase's start
    consumer_mib_s: float | None = None  # the consumer victim, settled window
    consumer_gap_p99_ms: float | None = None  # its p99 gap between batches with records
    consumer_window_gap_p99_ms: list[float] = field(default_factory=list)
    lag_max_ms: float | None = None  # the proxy's event-loop lag (timeline on), settled window
    lag_over_10ms: int | None = None  # lag samples ≥ 10 ms in the settled window
    victim_in_proxy_p99_ms: float | None = None  # timeline: frame read → forwarded + answer read → handed on
    alt_slices: list[tuple[bool, float]] = field(default_factory=list)  # lone-alt: (fair share on, MiB/s) per slice

    def alt_mib_s(self, on: bool) -> float | None:
        """lone-alt: the flooder's MiB/s at the leaders over the counted part of the slices with fair share ``on``
        (every slice counts the same length)."""
        xs = [x for state, x in self.alt_slices if state == on]
        return sum(xs) / len(xs) if xs else None

    @property
    def alt_ratio(self) -> float | None:
        """lone-alt: fair share on ÷ off, MiB/s at the leaders over the same phase's interleaved slices."""
        on, off = self.alt_mib_s(True), self.alt_mib_s(False)
        return on / off if on is not None and off else None

    @property
    def flood_ratio(self) -> float | None:
        """The flooder's bytes over all three brokers against its quota (quota_bytes per broker, three brokers)."""
        return None if self.flood_mib_s is None else self.flood_mib_s * MIB / (3 * self.quota_bytes)

    @property
    def first_window_p99_ms(self) -> float | None:
        """The victim's p99 over the phase's first WINDOW_S seconds: the flood starting."""
        return self.start_window_p99_ms[0] if self.start_window_p99_ms else None

    @property
    def worst_later_window_p99_ms(self) -> float | None:
        """The victim's worst window p99 after the first: what is left once a limit has bitten."""
        return max(self.start_window_p99_ms[1:]) if len(self.start_window_p99_ms) > 1 else None

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


SMOOTH = {"quotas.enforcement": "smooth"}
"""The product's default enforcement, which tests.support's ProxyProcess replaces by kafka: the issue-48 phases
judge the default config."""
FAIR_OFF = {**SMOOTH, "quotas.fair_share.enabled": False}


def _flood_quotas(byte_rate: float, mutation_rate: float) -> dict[str, object]:
    """The flooder's quotas, as the proxy's config file holds them."""
    quotas = {"producer_byte_rate": byte_rate, "controller_mutation_rate": mutation_rate}
    return {"quotas.entities": [{"entity": {"client-id": FLOOD_ID}, "quotas": quotas}]}


FAIR_TARGET_MS = 0.5
"""flood-target's ``quotas.fair_share.target_delay_ms`` unless ``--fair-target`` says (the product's default is 1)."""


def proxy_config(phase: str, hand: tuple[int, float] | None = None, target_ms: float = FAIR_TARGET_MS) -> dict | None:
    """The proxy's config for a phase (None: the phase goes straight to the cluster). ``hand``: flood-hand's
    producer_byte_rate per broker and controller_mutation_rate (:func:`hand_quota`); ``target_ms``: flood-target's
    ``quotas.fair_share.target_delay_ms``."""
    if phase in DIRECT:
        return None
    quotas = _flood_quotas(BYTE_QUOTA, MUTATION_QUOTA)
    configs: dict[str, dict[str, object]] = {
        "alone-proxy": {},
        "alone-proxy-again": {},
        "flood-nostart": {**SMOOTH, "quotas.fair_share.slow_start": False},
        "flood-target": {**SMOOTH, "quotas.fair_share.target_delay_ms": target_ms},
        "flood-kafka": {**quotas, "quotas.enforcement": "kafka"},
        "flood-smooth": {**quotas, "quotas.enforcement": "smooth", "quotas.smooth_burst_seconds": 0.1},
        # The same static quota with fair share off: whether fair share, engaging on top of a quota that already
        # holds the flooder, helps the victim or costs it (issue 48's static-quota bound).
        "flood-smooth-off": {**quotas, **FAIR_OFF, "quotas.smooth_burst_seconds": 0.1},
        # Fair share off: on, it still limited the flooder in the first smoke run (to 3.1 of the 5.2 MiB/s set),
        # and the phase is a quota alone at fair share's rate, to set the victim's latency beside fair share's.
        "flood-hand": {**FAIR_OFF, **_flood_quotas(*(hand or (BYTE_QUOTA, MUTATION_QUOTA)))},
    }
    if phase in configs:
        return configs[phase]
    return FAIR_OFF if phase.endswith(("-off", "-nofair")) else SMOOTH  # the issue-48 phases: on, or off


def hand_quota(results: Sequence[Result], rnd: int, fallback_mib: float) -> tuple[int, float, str]:
    """flood-hand's producer_byte_rate per broker and controller_mutation_rate, and a note saying where they come
    from: what the flooder got under fair share in round ``rnd``'s flood-noquota, else ``fallback_mib`` MiB/s per
    broker and MUTATION_QUOTA (never another round's: that would compare two different floods)."""
    src = next((r for r in results if r.round == rnd and r.phase == "flood-noquota" and r.flood_mib_s), None)
    if src is None:
        byte_rate, mutation_rate = round(fallback_mib * MIB), float(MUTATION_QUOTA)
        source = "--hand-rate: no flood-noquota in this round"
    else:
        # The proxy's byte quotas are per broker (its default scope): the three leaders' total over three. Its
        # mutation quota is one bucket per client id for the whole cluster (quotas/kinds.py cluster_wide): the
        # total as it was. A quota must be > 0, and a flood with no mutation loop measured none.
        byte_rate = max(1, round((src.flood_mib_s or 0) * MIB / 3))
        mutation_rate = max(0.1, round(src.mutations_per_s or 0, 2))
        source = f"round {src.round}'s flood-noquota"
    note = (
        f"hand quota producer_byte_rate {byte_rate / MIB:.2f} MiB/s per broker, controller_mutation_rate "
        f"{mutation_rate:g}/s ({source})"
    )
    return byte_rate, mutation_rate, note


def _assignment(cluster) -> list[list[int]]:
    """Three partitions, partition i led by broker i+1, replicas on all three."""
    nodes = [b.node_id for b in cluster.brokers]
    return [nodes[i:] + nodes[:i] for i in range(3)]


def _fill_topic(cluster, topic: str, nbytes: int) -> None:
    """A topic of ``nbytes`` over _assignment's partitions: for a consumer to re-read from the page cache."""
    _create_topic(cluster, topic, _assignment(cluster))
    _wait(_spawn("fill", cluster.bootstrap, topic, str(nbytes)), 300, "fill")


class Alternator:
    """lone-alt's switch: from when it is entered (the flooder's spawn), every ALT_SLICE_S it rewrites the proxy's
    configuration file with ``quotas.fair_share.enabled`` set and sends SIGHUP (the file watch reloads it once more
    within a second, to the same state: a no-op). ``switches``: (time.monotonic() after the signal, on) each time."""

    def __init__(self, proxy, first_on: bool) -> None:
        self.proxy = proxy
        self.first_on = first_on
        self.switches: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lone-alt", daemon=True)

    def _set(self, on: bool) -> None:
        import signal

        import yaml

        path = self.proxy.config_path
        doc = yaml.safe_load(path.read_text())
        doc.setdefault("quotas", {}).setdefault("fair_share", {})["enabled"] = on
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc))
        tmp.replace(path)
        self.proxy.proc.send_signal(signal.SIGHUP)
        self.switches.append((time.monotonic(), on))

    def _run(self) -> None:
        on, due = self.first_on, time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self._set(on)
            on, due = not on, due + ALT_SLICE_S

    def __enter__(self) -> Alternator:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def slices(self, lo: float, hi: float) -> list[tuple[bool, float, float]]:
        """(on, start, end) of each slice's counted part (from ALT_SKIP_S after its switch) inside [lo, hi); a part
        shorter than half a slice's is left out."""
        ends = [t for t, _ in self.switches[1:]] + [hi]
        out = []
        for (t, on), end in zip(self.switches, ends, strict=True):
            a, b = max(lo, t + ALT_SKIP_S), min(hi, end)
            if b - a >= (ALT_SLICE_S - ALT_SKIP_S) / 2:
                out.append((on, a, b))
        return out


def run_phase(
    cluster,
    workdir: Path,
    phase: str,
    seconds: float,
    settle: float,
    flood: str | None,
    bootstrap: str,
    consumer_topic: str | None = None,
    timeline: Path | None = None,
    *,
    victim: bool = True,
    backlog: str | None = None,
    steady_rate: float = 0.0,
    quota_bytes: float = BYTE_QUOTA,
    alternator: Alternator | None = None,
) -> Result:
    """One phase: the victim (unless ``victim`` is false), the consumer victim on ``consumer_topic``, and the
    flooder ``flood`` (:func:`flood_parts`; CONSUMER_FLOOD reads ``backlog``; ``steady_rate``: each steady
    tenant's bytes/s), all on ``bootstrap`` for ``seconds``. ``alternator``: turns fair share on and off from the
    flooder's spawn (lone-alt)."""
    tag = uuid.uuid4().hex[:6]
    prefix = f"iso-{phase}-{tag}"
    assignment = _assignment(cluster)
    victim_topic, flood_topic = f"{prefix}-victim", f"{prefix}-flood"
    writes = flood is not None and flood != CONSUMER_FLOOD  # a flooder that produces: its topic, its leaders' logs
    if victim:
        _create_topic(cluster, victim_topic, assignment)
    if writes:
        _create_topic(cluster, flood_topic, assignment)
    dirs = _leader_dirs(cluster, flood_topic, assignment) if writes else {}
    res = Result(phase, quota_bytes=quota_bytes, load_before=os.getloadavg()[0])
    victim_out, flood_out = workdir / f"{prefix}-victim.json", workdir / f"{prefix}-flood.json"
    consumer_out = workdir / f"{prefix}-consumer.json"
    samplers = {b: Sampler(functools.partial(_dir_bytes, d), interval=SAMPLE_S) for b, d in dirs.items()}
    with contextlib.ExitStack() as stack:
        for s in samplers.values():
            stack.enter_context(s)
        lead = VICTIM_LEAD_S if victim else 0.0
        consumer = (  # the consumer victim is a victim: not in a phase without one
            _spawn("consumer", bootstrap, consumer_topic, str(seconds + lead), str(consumer_out))
            if victim and consumer_topic is not None
            else None
        )
        producer = _spawn("victim", bootstrap, victim_topic, str(seconds + lead), str(victim_out)) if victim else None
        time.sleep(lead)
        flood_at = time.monotonic()
        flooder = None
        if flood == CONSUMER_FLOOD:
            if backlog is None:
                raise ValueError(f"{phase}: a consumer flooder needs the backlog topic")
            flooder = _spawn("consumer", bootstrap, backlog, str(seconds), str(flood_out), FLOOD_ID)
        elif flood is not None:
            args = (flood_topic, str(seconds), str(flood_out), f"{prefix}-mut", flood, str(steady_rate))
            flooder = _spawn("flood", bootstrap, *args)
        if alternator is not None:
            stack.enter_context(alternator)
        for proc, what in ((producer, "victim"), (consumer, "consumer"), (flooder, "flooder")):
            if proc is not None:
                _wait(proc, seconds + lead + 90, what)
    res.load_after = os.getloadavg()[0]
    f = json.loads(flood_out.read_text()) if flood is not None else None
    # The phase's clock starts with the flooder's (one clock: time.monotonic on one machine); in a phase with a
    # victim and no flooder, when a flooder would have been spawned (VICTIM_LEAD_S after the victim).
    t0 = f["start"] if f is not None else flood_at
    lo, hi = t0 + settle, t0 + seconds - TAIL_S
    res.window_lo = lo
    if victim:
        _read_victim(res, victim_out, lo, hi, t0)
    if consumer is not None:
        c = json.loads(consumer_out.read_text())
        rows = [r for r in c["rows"] if lo <= r[0] < hi]
        res.consumer_mib_s = sum(r[2] for r in rows) / (hi - lo) / MIB
        if rows:
            res.consumer_gap_p99_ms = percentile([r[1] for r in rows], 99) * 1000
        res.consumer_window_gap_p99_ms = [percentile(w, 99) * 1000 for w in windows(c["rows"], lo, hi) if w]
    if timeline is not None and timeline.exists():
        _read_timeline(res, timeline, lo, hi)
    if flood is not None and f is not None:
        lo, hi = f["start"] + settle, f["start"] + seconds - TAIL_S
        if flood == CONSUMER_FLOOD:
            res.flood_read_mib_s = sum(r[2] for r in f["rows"] if lo <= r[0] < hi) / (hi - lo) / MIB
        else:
            _read_flood(res, f, samplers.values(), lo, hi, "mutations" in flood)
            if alternator is not None:
                res.alt_slices = [
                    (on, _leader_mib_s(samplers.values(), a, b)) for on, a, b in alternator.slices(lo, hi)
                ]
            if flood == "steady":
                _read_tenants(res, f, settle, seconds - TAIL_S)
            caught_up = _wait_replicated(cluster, flood_topic, assignment)
            res.notes.append(
                "followers caught up "
                + (
                    f"{caught_up:.0f} s after the flood"
                    if caught_up is not None
                    else "NOT within 120 s after the flood"
                )
            )
    _delete_topics(cluster, prefix)
    return res


def _read_victim(res: Result, path: Path, lo: float, hi: float, t0: float) -> None:
    """The victim's latencies in the settled window [lo, hi), and its p99 per WINDOW_S window: over that window,
    and from the phase's start ``t0`` (the first window holds the flood starting)."""
    v = json.loads(path.read_text())
    res.latencies_ms = [x * 1000 for x in settled_latencies(v["rows"], lo, hi)]
    res.rdk_latencies_ms = [r[2] * 1000 for r in v["rows"] if lo <= r[0] < hi and r[2] == r[2]]
    res.window_p99_ms = [percentile(w, 99) * 1000 for w in windows(v["rows"], lo, hi) if w]
    res.start_window_p99_ms = [percentile(w, 99) * 1000 for w in windows(v["rows"], t0, hi) if w]
    if v["error_count"] or v["undelivered"]:
        res.notes.append(f"victim: {v['error_count']} errors {v['errors'][:2]}, {v['undelivered']} undelivered")


def _read_flood(res: Result, f: dict, samplers, lo: float, hi: float, mutated: bool) -> None:
    """A producing flooder's bytes at the leaders and (``mutated``: its loop ran) its mutations, over [lo, hi) of
    its clock."""
    for s in samplers:
        res.flood_slices += [x / res.quota_bytes for x in slice_increments(s.samples, lo, hi)]
    res.flood_mib_s = _leader_mib_s(samplers, lo, hi)
    m = f["mutations"]
    if mutated:
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


def _leader_mib_s(samplers, a: float, b: float) -> float:
    """A producing flooder's MiB/s at the leaders over [a, b) of its clock: what its leaders' log directories grew."""
    return sum(value_at(s.samples, b) - value_at(s.samples, a) for s in samplers) / (b - a) / MIB


def _read_tenants(res: Result, f: dict, lo_s: float, hi_s: float) -> None:
    """Each steady tenant's acknowledged bytes per second, from ``lo_s`` to ``hi_s`` seconds after the flooder's
    start (its SAMPLE_S slots)."""
    a, b = round(lo_s / SAMPLE_S), round(hi_s / SAMPLE_S)
    for p in f["producers"]:
        res.tenant_mib_s[p["client_id"]] = sum(p["slots"][a:b]) * FLOOD_RECORD / ((b - a) * SAMPLE_S) / MIB


FAIR_LINE = re.compile(
    r"fair share: (.+?) saturated \(.*?\): limited to ([\d.]+) MiB/s of work, shared by (\d+) tenants"
)  # proxy/rules/decision_recording.py's log line


def fair_share_notes(log: str) -> list[str]:
    """The proxy's "fair share: ... saturated" lines (at most one a minute per broker) and how often a broker was
    released, as one note: whether fair share bit in a phase, where, and at what limit."""
    hits = [f"{m[1]} {float(m[2]):.1f} MiB/s ({m[3]} tenants)" for m in FAIR_LINE.finditer(log)]
    released = log.count(" no longer limited")
    if not hits and not released:
        return []
    return [f"fair share saturated: {', '.join(hits) or 'none'}; released {released}×"]


def _read_timeline(res: Result, path: Path, lo: float, hi: float) -> None:
    """The proxy's timeline (proxy/wire/loop_lag.py; one clock: both are time.monotonic on one machine): the loop's
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
    return "direct" if phase in DIRECT else "proxy"


QUOTA_PHASES = frozenset(
    {"flood-kafka", "flood-smooth", "flood-smooth-off", "flood-hand", "flood-broker", "flood-paced", "flood-paced-even"}
)
"""The phases whose flooder is held to a quota (or holds itself to one): the summary's "/ its quota" is theirs."""


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else f"{x:{fmt}}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table (first column left-aligned, the others right, but a last ``notes``), without the columns in
    which no row has a figure: a run of a few phases needs few of them, and a full run's table stays readable."""
    keep = [i for i, _ in enumerate(head) if i == 0 or any(row[i] != "–" for row in rows)]
    align = ["---" if i == 0 or head[i] == "notes" else "---:" for i in keep]
    return [
        "| " + " | ".join(head[i] for i in keep) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row[i] for i in keep) + " |" for row in rows),
    ]


def _tenants(r: Result) -> str:
    return ", ".join(f"{t} {x:.2f}" for t, x in r.tenant_mib_s.items()) or "–"


def format_table(results: list[Result]) -> list[str]:
    """Every phase of every round."""
    refs = references(results)
    head = [
        "phase",
        "round",
        "victim p50 ms",
        "victim p99 ms",
        "p99 / alone via proxy (pooled)",
        "p99 / alone, same path",
        "p99 ms, librdkafka's clock",
        "victim records",
        "victim p99 per 5-s window from the start, ms",
        "flooder 1-s slices / quota, per broker: min / median / max",
        "flooder MiB/s at the leaders, 3 brokers",
        "mutations/s",
        "flood consumer MiB/s read",
        "steady tenants MiB/s",
        "load avg 1 min before → after",
        "notes",
    ]
    rows = []
    for r in results:
        got = bool(r.latencies_ms)
        sl = "–"
        if r.flood_slices:
            a, b, c = spread(r.flood_slices)
            sl = f"{a:.2f} / {b:.2f} / {c:.2f}"
        missing = [] if got or r.phase in NO_VICTIM else ["no settled records"]
        rows.append(
            [
                LABELS[r.phase],
                str(r.round),
                _f(r.p50 if got else None, ".1f"),
                _f(r.p99 if got else None, ".1f"),
                _f(r.p99 / refs["proxy"] if got and "proxy" in refs else None, ".2f"),
                _f(r.p99 / refs[path_of(r.phase)] if got and path_of(r.phase) in refs else None, ".2f"),
                _f(percentile(r.rdk_latencies_ms, 99) if r.rdk_latencies_ms else None, ".1f"),
                "–" if r.phase in NO_VICTIM else f"{len(r.latencies_ms):,}",
                " ".join(f"{x:.0f}" for x in r.start_window_p99_ms) or "–",
                sl,
                _f(r.flood_mib_s, ".1f"),
                _f(r.mutations_per_s, ".1f"),
                _f(r.flood_read_mib_s, ".0f"),
                _tenants(r),
                f"{r.load_before:.1f} → {r.load_after:.1f}",
                "; ".join(missing + r.notes) or "–",
            ]
        )
    return _table(head, rows)


def _mr(values: Sequence[float], fmt: str = ".1f") -> str:
    """Median and range: ``median (min–max)``."""
    if not values:
        return "–"
    a, b, c = spread(values)
    return f"{b:{fmt}} ({a:{fmt}}–{c:{fmt}})"


def summary_table(results: list[Result]) -> list[str]:
    """Per phase over its rounds, the median and range of: the victim's settled p99 and its ratio to alone-proxy's
    in the same round; its p99 in the phase's first 5-s window (the flood starting), its worst window after that
    and its worst settled window; the flooder's MiB/s at the leaders, against its quota where it has one, and
    mutations/s; the consumer flooder's and each steady tenant's MiB/s; the consumer victim's figures and the
    loop's lag (with --consumer, --timeline). A column no phase has a figure in is left out."""
    alone = {r.round: r.p99 for r in results if r.phase == "alone-proxy" and r.latencies_ms}

    def per_round(fig, fmt: str):
        """A column: ``fig`` of each round's result (None: none), as median (range)."""
        return lambda rs: _mr([x for r in rs if (x := fig(r)) is not None], fmt)

    def tenants(rs: list[Result]) -> str:
        names = sorted({t for r in rs for t in r.tenant_mib_s})
        return "; ".join(f"{t} {_mr([r.tenant_mib_s[t] for r in rs if t in r.tenant_mib_s], '.2f')}" for t in names)

    columns = [
        ("rounds", lambda rs: str(len(rs))),
        ("victim p99 ms, settled", per_round(lambda r: r.p99 if r.latencies_ms else None, ".1f")),
        (
            "p99 / alone via proxy, same round",
            per_round(lambda r: r.p99 / alone[r.round] if r.latencies_ms and r.round in alone else None, ".2f"),
        ),
        ("first 5-s window p99 ms", per_round(lambda r: r.first_window_p99_ms, ".0f")),
        ("worst later 5-s window p99 ms", per_round(lambda r: r.worst_later_window_p99_ms, ".0f")),
        ("worst settled 5-s window p99 ms", per_round(lambda r: max(r.window_p99_ms, default=None), ".0f")),
        ("flooder MiB/s at the leaders", per_round(lambda r: r.flood_mib_s, ".1f")),
        ("flooder / its quota", per_round(lambda r: r.flood_ratio if r.phase in QUOTA_PHASES else None, ".2f")),
        ("mutations/s", per_round(lambda r: r.mutations_per_s, ".1f")),
        ("fair share on ÷ off, interleaved slices", per_round(lambda r: r.alt_ratio, ".3f")),
        ("flood consumer MiB/s", per_round(lambda r: r.flood_read_mib_s, ".0f")),
        ("steady tenants MiB/s", lambda rs: tenants(rs) or "–"),
        ("consumer victim MiB/s", per_round(lambda r: r.consumer_mib_s, ".0f")),
        ("consumer victim gap p99 ms", per_round(lambda r: r.consumer_gap_p99_ms, ".0f")),
        ("loop lag max ms", per_round(lambda r: r.lag_max_ms, ".0f")),
        ("victim inside proxy p99 ms", per_round(lambda r: r.victim_in_proxy_p99_ms, ".2f")),
        ("load avg 1 min", per_round(lambda r: r.load_after, ".1f")),
    ]
    rows = []
    for phase in PHASES:
        rs = [r for r in results if r.phase == phase]
        if rs:
            rows.append([LABELS[phase], *(cell(rs) for _, cell in columns)])
    return _table(["phase", *(name for name, _ in columns)], rows)


def _rounds(results: Sequence[Result], phase: str) -> dict[int, Result]:
    return {r.round: r for r in results if r.phase == phase}


def _same_round_ratios(results: Sequence[Result], a: str, b: str, fig) -> list[float]:
    """``fig`` of phase ``a`` ÷ ``fig`` of phase ``b``, per round that has both (``fig`` None or 0: no figure)."""
    tops = {k: x for k, r in _rounds(results, b).items() if (x := fig(r))}
    return [x / tops[k] for k, r in _rounds(results, a).items() if (x := fig(r)) and k in tops]


def fair_share_lines(results: Sequence[Result], steady_mib: float) -> list[str]:
    """Issue 48's promises read over the rounds: a lone flooder keeps ≥ 95 % of its MiB/s at the leaders with fair
    share on (against off, in the same round); the victim's p99 under fair share is within 1.25 × of a hand-set
    quota at the rate fair share gave the flood (same round); each of two steady tenants gets ≥ 95 % of its rate."""
    out = []
    ratios = _same_round_ratios(results, "lone-fair", "lone-nofair", lambda r: r.flood_mib_s)
    if ratios:
        met = sum(1 for x in ratios if x >= 0.95)
        out.append(
            f"- Lone flooder, fair share on / off in the same round: {_mr(ratios, '.3f')} of its MiB/s at the leaders "
            f"— target ≥ 0.95: met in {met} of {len(ratios)} rounds."
        )
    alt = [x for r in results if (x := r.alt_ratio) is not None]
    if alt:
        met = sum(1 for x in alt if x >= 0.95)
        slices = sum(len(r.alt_slices) for r in results)
        out.append(
            f"- Lone flooder, fair share on ÷ off in interleaved {ALT_SLICE_S:g}-s slices of one phase (lone-alt, "
            f"{slices} slices): {_mr(alt, '.3f')} — target ≥ 0.95: median "
            f"{'met' if spread(alt)[1] >= 0.95 else 'NOT met'}, {met} of {len(alt)} rounds."
        )
    versus = _same_round_ratios(results, "flood-noquota", "flood-hand", lambda r: r.p99 if r.latencies_ms else None)
    if versus:
        out.append(
            f"- Victim p99, fair share ÷ a hand-set smooth quota at the rate fair share gave the flood, same round: "
            f"{_mr(versus, '.2f')} — target ≤ 1.25: median {'met' if spread(versus)[1] <= 1.25 else 'NOT met'}"
            f", {sum(1 for x in versus if x <= 1.25)} of {len(versus)} rounds."
        )
    for phase in ("steady-fair", "steady-nofair"):
        worst = [min(r.tenant_mib_s.values()) / steady_mib for r in _rounds(results, phase).values() if r.tenant_mib_s]
        if worst:
            met = sum(1 for x in worst if x >= 0.95)
            out.append(
                f"- {LABELS[phase]}: the slower tenant got {_mr(worst, '.3f')} of --steady-rate {steady_mib:g} MiB/s"
                + (f" — target ≥ 0.95: met in {met} of {len(worst)} rounds." if phase == "steady-fair" else ".")
            )
    return out


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
    for phase in (
        "flood-smooth",
        "flood-smooth-off",
        "flood-kafka",
        "flood-broker",
        "flood-hand",
        "flood-noquota",
        "flood-noquota-off",
        "flood-nostart",
        "flood-target",
        "flood-direct",
        "flood-consumer",
        "flood-consumer-off",
        "flood-ids",
    ):
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


def progress_line(res: Result) -> str:
    """One phase's figures as it ends, on one line."""
    victim = "no victim" if res.phase in NO_VICTIM else "no victim records"
    return (
        f"round {res.round} {res.phase}: "
        + (f"victim p50 {res.p50:.1f} ms p99 {res.p99:.1f} ms" if res.latencies_ms else victim)
        + (
            f"; flooder {res.flood_mib_s:.1f} MiB/s, slices/quota "
            + " / ".join(f"{x:.2f}" for x in spread(res.flood_slices))
            if res.flood_slices
            else ""
        )
        + (f", mutations {res.mutations_per_s:.1f}/s" if res.mutations_per_s is not None else "")
        + (
            f"; fair share on {res.alt_mib_s(True) or 0:.1f} / off {res.alt_mib_s(False) or 0:.1f} MiB/s = "
            f"{res.alt_ratio or 0:.3f} (slices: "
            + " ".join(f"{'on' if on else 'off'} {x:.0f}" for on, x in res.alt_slices)
            + ")"
            if res.alt_slices
            else ""
        )
        + (f"; flood consumer {res.flood_read_mib_s:.0f} MiB/s" if res.flood_read_mib_s is not None else "")
        + (f"; steady tenants MiB/s {_tenants(res)}" if res.tenant_mib_s else "")
        + (
            f"; windows p99 from the start {' '.join(f'{x:.0f}' for x in res.start_window_p99_ms)}, settled "
            f"{' '.join(f'{x:.0f}' for x in res.window_p99_ms)}"
            if res.start_window_p99_ms
            else ""
        )
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
        + f"; load {res.load_before:.1f} → {res.load_after:.1f}; {'; '.join(res.notes)}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "victim":
        return victim_main(argv[1], argv[2], float(argv[3]), Path(argv[4]))
    if argv and argv[0] == "flood":
        return flood_main(argv[1], argv[2], float(argv[3]), Path(argv[4]), argv[5], argv[6], float(argv[7]))
    if argv and argv[0] == "consumer":
        return consumer_main(argv[1], argv[2], float(argv[3]), Path(argv[4]), *argv[5:6])
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
    ap.add_argument(
        "--fair-target",
        type=float,
        default=FAIR_TARGET_MS,
        help=f"flood-target's quotas.fair_share.target_delay_ms (default {FAIR_TARGET_MS}; the product's is 1)",
    )
    ap.add_argument(
        "--hand-rate",
        type=float,
        default=2.0,
        help="flood-hand's producer_byte_rate, MiB/s per broker, in a round with no flood-noquota to take fair "
        "share's rate from (default 2)",
    )
    ap.add_argument(
        "--steady-rate",
        type=float,
        default=6.0,
        help="each steady tenant's rate, MiB/s over the three brokers (default 6: about a quarter of what these "
        "brokers take)",
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
            run_phase(cluster, workdir, "warmup", args.warmup, 0, "producers,mutations", cluster.bootstrap)
            print(f"cool-down after the warm-up: {_cool_down(args.cooldown):.0f} s", flush=True)
            # Then the victim alone through a proxy, unmeasured: in four runs the first measured phase after the
            # flood warm-up (alone-proxy) read 118-473 ms p99 against 31-134 ms for the same phase at the end, with
            # the page cache already written back; whatever the brokers still settle after a flood (JIT, GC, the
            # mutation loop's metadata), it is not the reference's to carry.
            warm = ProxyProcess(workdir, cluster.bootstrap, {}, name="proxy-warmup").start()
            try:
                quiet = run_phase(cluster, workdir, "warmup-alone", args.warmup, 0, None, warm.bootstrap)
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
            _fill_topic(cluster, consumer_topic, CONSUMER_FILL)
            print(f"consumer victim's topic filled: {CONSUMER_FILL // MIB} MiB", flush=True)
        backlog = None
        if any(flood_parts(p, args.flood) == CONSUMER_FLOOD for p in phases):
            backlog = "iso-backlog"
            _fill_topic(cluster, backlog, BACKLOG_FILL)
            print(f"consumer flooder's backlog filled: {BACKLOG_FILL // MIB} MiB", flush=True)
        for rnd, phase in ((r, p) for r in range(1, args.rounds + 1) for p in round_order(phases, r)):
            parts = flood_parts(phase, args.flood)
            hand = hand_quota(results, rnd, args.hand_rate) if phase == "flood-hand" else None
            cfg = proxy_config(phase, hand[:2] if hand else None, args.fair_target)
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
                    parts,
                    proxy.bootstrap if proxy else cluster.bootstrap,
                    consumer_topic,
                    victim=phase not in NO_VICTIM,
                    backlog=backlog,
                    steady_rate=args.steady_rate * MIB,
                    quota_bytes=hand[0] if hand else BYTE_QUOTA,
                    alternator=Alternator(proxy, first_on=rnd % 2 == 1) if phase == "lone-alt" and proxy else None,
                )
            finally:
                if proxy is not None:
                    proxy.terminate()  # the timeline's last second is written at shutdown
                    warnings += sum(1 for ln in proxy.log().splitlines() if " WARNING " in ln or " ERROR " in ln)
                if phase == "flood-broker":
                    _set_broker_quotas(cluster, add=False)
            if hand:
                res.notes.insert(0, hand[2])
            if proxy is not None:
                res.notes += fair_share_notes(proxy.log())
            if timeline is not None and timeline.exists():
                v_lo = res.window_lo
                _read_timeline(res, timeline, v_lo, v_lo + args.seconds - args.settle - TAIL_S)
            if parts is not None:
                res.notes.append(f"cool-down after it {_cool_down(args.cooldown):.0f} s")
            res.round = rnd
            results.append(res)
            print(progress_line(res), flush=True)
    minutes = (time.monotonic() - t_start) / 60
    table = format_table(results)
    targets = target_lines(results) + fair_share_lines(results, args.steady_rate)
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
