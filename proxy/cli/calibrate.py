"""``kafka-throttle-proxy calibrate``: measure what the cluster's brokers charge each request, print the costs.

KIP-124's ``request_percentage`` charges a request the broker thread time it costs, which the proxy cannot read and
estimates from a table (``quotas.kinds``) fitted to one host's brokers; another host's charged half of it (issue 50).
This command asks the cluster itself. Straight to the brokers (not through a proxy), with the operator's admin
credentials (the same options as ``kafka-throttle-proxy quotas``), it:

1. creates three one-partition probe topics in the proxy's namespace (``__ktp_calibrate_<run>-…``: one of
   replication factor 1, one of the cluster's default, one left empty) and sets ``request_percentage`` on one client
   id per probe (``ktp-calibrate-<run>-<n>``), on the brokers, as kafka-configs would;
2. runs each probe's request unthrottled first (``--broker-warmup``: a cold broker's JIT charges many times what a
   warm one does), then each probe on its own connection to its partition's leader, 16 requests in flight as the
   pipelining clients the quota is for keep theirs (a broker reads one request of a connection at a time, and after
   a throttled answer nothing until the throttle is served, KIP-219):
   Produce acks=1 to RF 1, Produce acks=-1 to the default RF, an empty Fetch with ``max_wait_ms`` 0, a Fetch of
   about a KiB of the records the first probe wrote, ListOffsets, Metadata; then Produce acks=1, the empty Fetch,
   ListOffsets and Metadata again one request at a time, as a consumer's Fetch and a request/response loop come
   (the brokers charge those about twice as much). After a warm-up it counts the answers over many quota windows
   (the brokers hold a flooder in cycles about one window long, so a short count reads high);
3. removes the quotas and the topics, also when it fails or is interrupted (Ctrl-C), and says so if it cannot;
4. prints the ``quotas.request_costs`` section the rates support (``quotas.calibration``), with comments saying
   when, against which cluster, and each probe's rate and spread; progress goes to stderr.

Exit 0 when printed, 1 when the cluster refused or could not be reached (one line saying what), 2 for a wrong
option.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kafka.errors import for_code
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from proxy.cli.quota_admin import (
    ANSWER_TIMEOUT_S,
    STOPS,
    Connection,
    Refused,
    Security,
    UsageError,
    _address,
    _connection_options,
    security_from,
    ssl_context,
    stopped,
)
from quotas.calibration import CalibrationError, Probe, proposal, render
from quotas.kinds import FETCH, LIST_OFFSETS, METADATA, PRODUCE

TOPIC_PREFIX = "__ktp_calibrate_"
"""In the proxy's namespace (``protocol.topic_guard.RESERVED_PREFIX``): no tenant behind a proxy can name them."""
CLIENT_PREFIX = "ktp-calibrate-"
VERSIONS = {"produce": 7, "fetch": 7, "list_offsets": 4, "metadata": 7, "create": 4, "delete": 4, "quotas": 1}
"""Request versions every Kafka from 2.4 to 4.x answers (4.0 removed only older ones: KIP-896)."""
IN_FLIGHT = 16
"""Requests a pipelined probe keeps outstanding on its connection, as the request-heavy clients the quota is for
pipeline theirs (librdkafka keeps thousands in flight). One at a time the brokers charge more: on a fresh 3-broker
cluster (2026-12-07) they held an empty Fetch v12 sent one at a time to 226 and 272 requests/s under 1 %, sixteen
in flight to 394-560/s, whatever its version or isolation level; a calibration of 2026-12-06 held both at 596/s,
two others read 0.079 against 0.036 ms (Fetch) and 0.062 against 0.040 (ListOffsets). So the APIs clients also send
one at a time are probed both ways (``ProbeSpec.in_flight``) and the proxy charges by what it sees
(``quotas.kinds.RequestCosts.alone``)."""
SLICES = 4
"""The measured time is cut into this many slices: their spread says how steady the brokers' hold was."""
ADMIN_TIMEOUT_MS = 30_000
VALUE_BYTES = 100
"""A probe Produce's one record: a few hundred bytes a request, as the request-heavy clients the quota is for."""
TAIL_BYTES = 1024
"""What the tailing Fetch probe asks of its partition: about a KiB of record batches an answer (a broker returns
whole batches up to it), the span of the head term (``quotas.kinds.FETCH_HEAD_BYTES``) it measures."""


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    name: str
    api_key: int
    topic: str
    """Which probe topic: ``rf1``, ``rfd`` (the default replication factor) or ``empty``."""
    acks: int = 1
    records: bool = False
    """A Fetch from the start of a written partition (the tailing probe), not of an empty one."""
    in_flight: int = IN_FLIGHT
    """Requests kept outstanding: 1 probes the API's base for a request sent alone (``quotas.calibration``)."""


PROBES = (
    ProbeSpec("Produce acks=1 RF 1", PRODUCE, "rf1", 1),
    ProbeSpec("Produce acks=-1 RF {rf}", PRODUCE, "rfd", -1),
    ProbeSpec("Fetch, empty, max_wait 0", FETCH, "empty"),
    ProbeSpec(f"Fetch, {TAIL_BYTES} B of records, max_wait 0", FETCH, "rf1", records=True),
    ProbeSpec("ListOffsets", LIST_OFFSETS, "empty"),
    ProbeSpec("Metadata, one topic", METADATA, "empty"),
    # One at a time: a consumer sends its Fetch so (one a broker), a request/response loop everything.
    ProbeSpec("Produce acks=1 RF 1, one at a time", PRODUCE, "rf1", 1, in_flight=1),
    ProbeSpec("Fetch, empty, max_wait 0, one at a time", FETCH, "empty", in_flight=1),
    ProbeSpec("ListOffsets, one at a time", LIST_OFFSETS, "empty", in_flight=1),
    ProbeSpec("Metadata, one topic, one at a time", METADATA, "empty", in_flight=1),
)


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "calibrate",
        help="measure what the cluster's brokers charge each request; print quotas.request_costs",
        description="Measure, against the cluster itself (not through a proxy), what its brokers charge each request "
        "under request_percentage, and print the quotas.request_costs section to merge into the proxy's configuration. "
        "Needs rights to create and delete topics and to alter client quotas; leaves nothing behind.",
    )
    _connection_options(c, suppress=False, target="the cluster's bootstrap address (straight to the brokers)")
    c.add_argument("--percent", type=float, default=1.0, help="request_percentage set on the probes (default 1)")
    c.add_argument(
        "--broker-warmup",
        type=float,
        default=8.0,
        help="seconds each probe's request runs unthrottled first, so the brokers' JIT is warm (default 8)",
    )
    c.add_argument("--warmup", type=float, default=12.0, help="seconds of each probe not counted (default 12)")
    c.add_argument(
        "--seconds", type=float, default=48.0, help="seconds of each probe counted (default 48: four quota windows)"
    )


async def _metadata(conn: Connection, topics: list[str] | None) -> Any:
    req = MetadataRequest(
        topics=None
        if topics is None
        else [MetadataRequest.MetadataRequestTopic(topic_id=None, name=t) for t in topics],
        allow_auto_topic_creation=False,
    )
    return await conn.ask(req, MetadataResponse, VERSIONS["metadata"])


async def _create(conn: Connection, names: dict[str, int]) -> list[str]:
    """Create each topic (name -> replication factor, -1: the brokers' default); the names created."""
    ct = CreateTopicsRequest.CreatableTopic
    req = CreateTopicsRequest(
        topics=[
            ct(name=n, num_partitions=1, replication_factor=rf, assignments=[], configs=[]) for n, rf in names.items()
        ],
        timeout_ms=ADMIN_TIMEOUT_MS,
        validate_only=False,
    )
    resp = await conn.ask(req, CreateTopicsResponse, VERSIONS["create"])
    made = [t.name for t in resp.topics if not t.error_code]
    for t in resp.topics:
        if t.error_code:
            raise _Partial(made, f"cannot create topic {t.name}: {t.error_message or for_code(t.error_code).message}")
    return made


class _Partial(Refused):
    """Refused after some of what was asked was done (``done``: to clean up)."""

    def __init__(self, done: list[str], message: str) -> None:
        super().__init__(message)
        self.done = done


async def _delete(conn: Connection, names: list[str]) -> list[str]:
    """Delete the topics; what could not be deleted, with why."""
    resp = await conn.ask(
        DeleteTopicsRequest(topic_names=names, timeout_ms=ADMIN_TIMEOUT_MS), DeleteTopicsResponse, VERSIONS["delete"]
    )
    return [f"{r.name} ({for_code(r.error_code).message})" for r in resp.responses if r.error_code]


async def _quota(conn: Connection, client_ids: list[str], percent: float | None) -> list[str]:
    """Set (or, ``percent`` None, remove) request_percentage on each client id; the ones refused, with why."""
    e = AlterClientQuotasRequest.EntryData
    op = e.OpData(key="request_percentage", value=percent or 0.0, remove=percent is None)
    req = AlterClientQuotasRequest(
        entries=[e(entity=[e.EntityData(entity_type="client-id", entity_name=c)], ops=[op]) for c in client_ids],
        validate_only=False,
    )
    resp = await conn.ask(req, AlterClientQuotasResponse, VERSIONS["quotas"])
    return [
        f"{entry.entity[0].entity_name}: {entry.error_message or for_code(entry.error_code).message}"
        for entry in resp.entries
        if entry.error_code
    ]


def _records() -> bytes:
    """One batch of one record, stamped now. Not 0: a segment whose first record is older than ``segment.ms`` is
    rolled at the next append, so records stamped 1970 rolled a segment on every Produce and the brokers charged a
    probe twice what they charge a producer (the first calibrations)."""
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=-1, producer_epoch=-1, base_sequence=-1)
    b.append(int(time.time() * 1000), None, b"v" * VALUE_BYTES)
    b.close()
    return bytes(b.buffer())


def _request(spec: ProbeSpec, topic: str) -> tuple[Any, Any, int]:
    """The probe's request (the same one every time), its response class and version."""
    if spec.api_key == PRODUCE:
        td = ProduceRequest.TopicProduceData
        part = td.PartitionProduceData(index=0, records=_records())
        req = ProduceRequest(
            transactional_id=None, acks=spec.acks, timeout_ms=30_000, topic_data=[td(name=topic, partition_data=[part])]
        )
        return req, ProduceResponse, VERSIONS["produce"]
    if spec.api_key == FETCH:
        ft = FetchRequest.FetchTopic
        limit = TAIL_BYTES if spec.records else 1 << 20  # the empty probe's partition has nothing to return
        fp = ft.FetchPartition(partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=limit)
        req = FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=limit, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[ft(topic=topic, topic_id=None, partitions=[fp])], forgotten_topics_data=[],
        )  # fmt: skip
        return req, FetchResponse, VERSIONS["fetch"]
    if spec.api_key == LIST_OFFSETS:
        lt = ListOffsetsRequest.ListOffsetsTopic
        lp = lt.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[lt(name=topic, partitions=[lp])])
        return req, ListOffsetsResponse, VERSIONS["list_offsets"]
    req = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=topic)], allow_auto_topic_creation=False
    )
    return req, MetadataResponse, VERSIONS["metadata"]


async def _drive(
    conn: Connection, spec: ProbeSpec, topic: str, warmup: float, seconds: float, progress: Callable[[str], None]
) -> tuple[list[float], int, int, int]:
    """``spec.in_flight`` requests outstanding for ``warmup + seconds``: the answers per second of each of SLICES
    slices of the counted time, how many carried a throttle, the request's size and its largest answer's. Why the
    largest, not the last: a broker holding a Fetch over its request quota answers it empty (the partitions left out,
    ``FetchContext.getThrottledResponse``), and the base is what the probe cost less the size terms of its answer.
    Taken from whichever answer came last, a throttled one or not, the Fetch base moved by half its value between two
    probes of one calibration; the proxy charges a client's Fetch by the full answer it sees."""
    req, resp_cls, version = _request(spec, topic)
    start = time.monotonic()
    counted_from, end = start + warmup, start + warmup + seconds
    slice_s = seconds / SLICES if seconds > 0 else 1.0
    counts = [0] * SLICES
    throttled = 0
    shown = start
    outstanding = 0
    largest = 0
    while True:
        now = time.monotonic()
        while now < end and outstanding < spec.in_flight:
            conn.send(req, version)
            outstanding += 1
        if outstanding == 0:
            break
        resp = await conn.receive(resp_cls, version)
        outstanding -= 1
        if conn.last_response_bytes > largest:
            largest = conn.last_response_bytes
        errors = _errors(spec, resp)
        if errors:
            raise Refused(f"probe {spec.name}: the broker answered {errors}")
        t = time.monotonic()
        if t >= counted_from:
            counts[min(int((t - counted_from) / slice_s), SLICES - 1)] += 1
        if getattr(resp, "throttle_time_ms", 0) > 0:
            throttled += 1
        if t - shown >= 2.0:
            shown = t
            counted = sum(counts)
            progress(f"{spec.name}: {t - start:.0f}/{warmup + seconds:.0f} s, {counted} answers counted")
    return [c / slice_s for c in counts], throttled, conn.last_request_bytes, largest


def _errors(spec: ProbeSpec, resp: Any) -> str:
    """The probe answer's first error, or ''."""
    codes: list[int] = []
    if spec.api_key == PRODUCE:
        codes = [p.error_code for t in resp.responses for p in t.partition_responses]
    elif spec.api_key == FETCH:
        codes = [resp.error_code] + [p.error_code for t in resp.responses for p in t.partitions]
    elif spec.api_key == LIST_OFFSETS:
        codes = [p.error_code for t in resp.topics for p in t.partitions]
    else:
        codes = [t.error_code for t in resp.topics]
    bad = [c for c in codes if c]
    return for_code(bad[0]).message if bad else ""


async def calibrate(
    host: str, port: int, sec: Security, args: argparse.Namespace, progress: Callable[[str], None]
) -> str:
    """Run the probes against the cluster at ``host:port`` and return the section to print. Everything it creates
    is removed before it returns or raises (also when cancelled)."""
    run = f"{int(time.time()):x}{os.getpid() % 4096:03x}"
    topics = {
        "rf1": f"{TOPIC_PREFIX}{run}-rf1",
        "rfd": f"{TOPIC_PREFIX}{run}-rfd",
        "empty": f"{TOPIC_PREFIX}{run}-empty",
    }
    clients = [f"{CLIENT_PREFIX}{run}-{i}" for i in range(len(PROBES))]
    made: list[str] = []
    quotas_set = False
    async with Connection(host, port, sec, "kafka-throttle-proxy-calibrate") as admin:
        try:
            progress(f"creating topics {', '.join(topics.values())}")
            try:
                made = await _create(admin, {topics["rf1"]: 1, topics["rfd"]: -1, topics["empty"]: 1})
            except _Partial as exc:
                made = exc.done
                raise
            quotas_set = True  # (a partial alter is cleaned up by removing them all)
            refused = await _quota(admin, clients, args.percent)
            if refused:
                raise Refused(f"cannot set request_percentage: {'; '.join(refused)}")
            leaders, rf = await _leaders(admin, list(topics.values()))
            if args.broker_warmup > 0:
                # A cold broker charges many times what a warm one does (its JIT has not compiled the request
                # path yet): the first calibration on a fresh cluster read 3-10 x the costs of a warm one. Every
                # probe's request runs first as fast as the broker answers, under a client id without a quota.
                for spec in PROBES:
                    if spec.in_flight != IN_FLIGHT:  # the same request as a pipelined probe's: warmed with it
                        continue
                    lhost, lport = leaders[topics[spec.topic]]
                    progress(f"warming the brokers: {spec.name.format(rf=rf)}, {args.broker_warmup:.0f} s unthrottled")
                    async with Connection(lhost, lport, sec, f"{CLIENT_PREFIX}{run}-warm") as conn:
                        await _drive(conn, spec, topics[spec.topic], args.broker_warmup, 0.0, lambda _line: None)
            probes: list[Probe] = []
            for i, spec in enumerate(PROBES):
                name = spec.name.format(rf=rf)
                lhost, lport = leaders[topics[spec.topic]]
                progress(f"probe {i + 1}/{len(PROBES)}: {name} (broker {lhost}:{lport}, client id {clients[i]})")
                async with Connection(lhost, lport, sec, clients[i]) as conn:
                    rates, throttled, req_bytes, resp_bytes = await _drive(
                        conn, replace(spec, name=name), topics[spec.topic], args.warmup, args.seconds, progress,
                    )  # fmt: skip
                probes.append(
                    Probe(name, spec.api_key, args.percent, req_bytes, resp_bytes, tuple(rates), spec.acks,
                          rf if spec.topic == "rfd" else 1, throttled, spec.records, spec.in_flight == 1)
                )  # fmt: skip
            try:
                prop = proposal(probes)
            except CalibrationError as exc:
                raise Refused(str(exc)) from None
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            source = f"calibrate {stamp} against {host}:{port}"
            header = [
                f"kafka-throttle-proxy calibrate, {stamp}, against {host}:{port} (default replication factor {rf})",
                f"request_percentage {args.percent} % on each probe's client id; {args.warmup:.0f} s warm-up, then "
                f"{args.seconds:.0f} s counted in {SLICES} slices",
                "merge into the proxy's configuration; measure again after a broker upgrade or a hardware change",
            ]
            return render(prop, source, header)
        finally:
            await asyncio.shield(_clean(admin, made, clients if quotas_set else [], progress))


async def _leaders(admin: Connection, names: list[str]) -> tuple[dict[str, tuple[str, int]], int]:
    """Each topic's partition-0 leader's address, once every topic has one, and the default replication factor
    (the ``rfd`` topic's replicas)."""
    deadline = time.monotonic() + 30
    while True:
        meta = await _metadata(admin, names)
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        leaders: dict[str, tuple[str, int]] = {}
        rf = 1
        for t in meta.topics:
            for p in t.partitions:
                if p.partition_index == 0 and p.leader_id in brokers and not p.error_code:
                    leaders[t.name] = brokers[p.leader_id]
                    if t.name.endswith("-rfd"):
                        rf = len(p.replica_nodes)
        if len(leaders) == len(names):
            return leaders, rf
        if time.monotonic() > deadline:
            raise Refused(f"the probe topics have no leader after 30 s ({sorted(set(names) - set(leaders))})")
        await asyncio.sleep(0.5)


async def _clean(admin: Connection, topics: list[str], clients: list[str], progress: Callable[[str], None]) -> None:
    """Remove the probes' quotas and topics; say what could not be removed (the operator must, by hand)."""
    left: list[str] = []
    if clients:
        try:
            left += [f"client quota {x}" for x in await _quota(admin, clients, None)]
        except Exception as exc:  # noqa: BLE001 - whatever it is, the topics are still to be removed and named
            left += [f"client quotas of {', '.join(clients)} ({type(exc).__name__}: {exc})"]
    if topics:
        try:
            left += [f"topic {x}" for x in await _delete(admin, topics)]
        except Exception as exc:  # noqa: BLE001 - as above
            left += [f"topics {', '.join(topics)} ({type(exc).__name__}: {exc})"]
    if left:
        print(f"kafka-throttle-proxy calibrate: could not remove {'; '.join(left)}: remove by hand", file=sys.stderr)
    elif topics or clients:
        progress("removed the probe topics and quotas")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the section is printed, 1 when refused or unreachable, 2 for a wrong option."""
    prog = "kafka-throttle-proxy calibrate"

    def progress(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)

    sec: Security | None = None
    try:
        if not 0 < args.percent <= 100:
            raise UsageError(f"--percent {args.percent}: expected a share of one thread in (0, 100]")
        if args.warmup < 0 or args.seconds <= 0 or args.broker_warmup < 0:
            raise UsageError("--warmup and --broker-warmup must be >= 0, --seconds > 0")
        host, port = _address(getattr(args, "bootstrap_server", None), "the cluster's bootstrap address")
        sec = security_from(args)
        if sec.tls:
            ssl_context(sec)
        section = asyncio.run(calibrate(host, port, sec, args, progress))
    except STOPS as exc:
        return stopped(prog, args.bootstrap_server, exc, sec, ANSWER_TIMEOUT_S)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.write(section)
    return 0
