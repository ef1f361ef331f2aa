"""The fleet's channel: usage reports over a topic on the cluster the proxy already fronts (quota scope fleet).

Why a topic: the cluster is an existing, replicated, ordered log every member can reach; no consensus of our own,
no extra server. Topic ``__ktp_fleet_<name>``, one partition (every member reads every report, in one order),
short retention (a report older than a quota window changes nothing). Each member publishes what
``quotas.fleet_reports.FleetLedger`` collected every ``fleet.sync_interval_ms`` and, once per interval, folds every
other member's reports read since into its trackers (``quotas.fleet_reports.FleetFold`` sums them per bucket, then one
``QuotaManager.apply_remote`` per bucket: at 100 members that is 1 call where there were 99).

Never in the clients' way: publishing and reading run as tasks on the event loop through aiokafka; when the
topic is unreachable, the member keeps enforcing its own usage (the local charges never stopped), logs one
WARNING per minute and counts the failures; usage that could not be published is dropped, not queued (late usage
would throttle clients for traffic long gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

from config.model import ProxyConfig
from config.quota_sources import QuotaSources
from protocol.topic_guard import RESERVED_PREFIX, ProtectedTopics
from quotas.entities import QuotaEntity
from quotas.fleet_reports import (
    MAC_HEADER,
    MAX_NAMES,
    FleetFold,
    ReportError,
    UsageReport,
    authentic,
    decode_quota_record,
    encode_quota_record,
    record_mac,
)
from quotas.manager import Bound, QuotaManager

log = logging.getLogger(__name__)

RETENTION_MS = 60_000
#: A member not heard from for this long no longer counts in ``ktp_fleet_members``.
MEMBER_SILENT_S = 10.0
WARN_EVERY_S = 60.0
#: An idle member still reports (empty) this often, so the others know it is there.
HEARTBEAT_S = 2.0
#: Quota alters kept for publishing while the topic is unreachable.
MAX_PENDING_ALTERS = 10_000
MAX_UNACKED = 8
"""Reports sent and not yet acknowledged, at most (two seconds of reports at the default interval)."""
MAX_FOLD_ENTRIES = 1_000_000
"""Entries of other members' reports waiting for the next fold, at most (16 MB): past that they are folded at
once (a slow loop, or a burst of reports, must not grow memory)."""
MAX_FOLD_REPORTS = 10_000


class _Unbound(enum.Enum):
    """Type of :data:`_UNBOUND` (an enum so that ``is`` narrows it away)."""

    UNBOUND = 0


_UNBOUND: Final = _Unbound.UNBOUND
"""A bucket id not bound yet (a bound one may hold None: no quota applies to it here)."""


def topic_name(fleet: str) -> str:
    """The fleet's usage topic; its quota topic adds ``_quotas``. In the proxy's namespace, so no client of any
    member can name either (``protocol.topic_guard``)."""
    return f"{RESERVED_PREFIX}fleet_{fleet}"


class FleetSync:
    def __init__(
        self,
        config: ProxyConfig,
        manager: QuotaManager,
        now_ms: Callable[[], int],
        sources: QuotaSources | None = None,
        guard: ProtectedTopics | None = None,
        worker: int | None = None,
    ) -> None:
        """``worker``: this process's index among the host's workers (None: a single process); workers of one host
        are members of their own, so each needs its own id."""
        fc = config.fleet
        assert fc.name is not None
        secret = fc.secret()
        assert secret is not None  # the configuration requires one with scope fleet
        self.secret = secret
        self.guard = guard
        """The proxy's own topics: the fleet topics' ids go there once known (clients name topics by id too)."""
        self.topic = topic_name(fc.name)
        self.quota_topic = self.topic + "_quotas"
        self.sources = sources
        self.alters: asyncio.Queue[tuple[QuotaEntity, dict[str, float | None]]] = asyncio.Queue(
            maxsize=MAX_PENDING_ALTERS
        )
        self.alters_published = self.alters_taken_in = 0
        if sources is not None:
            sources.on_alter = self._altered_here
        self.member = (
            fc.member + (f"-w{worker}" if worker is not None else "")
            if fc.member
            else f"{socket.gethostname()}-{os.getpid()}"
        )
        self.interval_s = fc.sync_interval_ms / 1000
        self.servers = fc.bootstrap_servers or config.upstream.bootstrap_servers
        self.client = dict(fc.client)
        self.manager = manager
        self.now_ms = now_ms
        self.sent = self.received = self.applied = self.errors = self.dropped = self.bad = 0
        self.unauthenticated = 0
        """Records on the fleet's topics without a valid MAC: ignored (not a member's, or altered)."""
        self.fold = FleetFold()
        """Reports read since the last fold: folded into the trackers once per ``sync_interval_ms``, summed per
        bucket (a member folds as often as it publishes)."""
        self._folding_ts: list[int] = []  # the ts of every report in self.fold
        self._bound: dict[int, Bound | None] = {}  # bucket id -> its tracker's handle, while the stamp holds
        self._bound_stamp = -1
        self.delays: deque[int] = deque(maxlen=4096)
        """ms from a report's ts (drained at its member) to its fold here, for the last reports: the sync delay
        (both clocks are wall clocks: a skew between hosts shows up here)."""
        self.heard: dict[str, float] = {}  # member -> monotonic time of its last report
        self.connected = False
        self._tasks: list[asyncio.Task[None]] = []
        self._last_warning = -WARN_EVERY_S

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run(), name="fleet-sync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def members(self) -> int:
        """Members heard from recently, this one included."""
        now = time.monotonic()
        return 1 + sum(1 for t in self.heard.values() if now - t < MEMBER_SILENT_S)

    def gauges(self) -> dict[str, tuple[str, float]]:
        return {
            "ktp_fleet_members": ("Fleet members heard from in the last 10 s, this one included", self.members()),
            "ktp_fleet_connected": (
                "1 while the fleet topic is reachable (0: enforcing local usage only)",
                float(self.connected),
            ),
            "ktp_fleet_reports_sent": ("Usage reports this member published", self.sent),
            "ktp_fleet_reports_received": ("Usage reports from other members folded in", self.received),
            "ktp_fleet_usage_applied": ("Bucket usages from other members recorded here", self.applied),
            "ktp_fleet_errors": ("Fleet topic failures (publish, read, connect)", self.errors),
            "ktp_fleet_usage_dropped": (
                "Own usage not published: reports the topic refused, bucket usages over the ledger's bound",
                self.dropped + (self.manager.ledger.dropped if self.manager.ledger else 0),
            ),
            "ktp_fleet_reports_refused": ("Reports on the fleet topic that were malformed", self.bad),
            "ktp_fleet_usage_unnamed": (
                "Bucket usages of other members dropped before any report had named the "
                "bucket here (a member's first seconds)",
                self.fold.unnamed,
            ),
            "ktp_fleet_sync_delay_p99_ms": (
                "99th percentile of the last 4096 reports' delay from their member's drain to their fold here (ms)",
                self.delay_p99(),
            ),
            "ktp_fleet_records_unauthenticated": (
                "Records on the fleet's topics ignored for a missing or wrong MAC "
                "(written by something other than a member)",
                self.unauthenticated,
            ),
            "ktp_fleet_quota_alters_published": (
                "Quota alters made here and published to the fleet",
                self.alters_published,
            ),
            "ktp_fleet_quota_alters_taken_in": ("Quota alters of other members taken in", self.alters_taken_in),
        }

    def delay_p99(self) -> float:
        if not self.delays:
            return float("nan")
        ordered = sorted(self.delays)
        return float(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])

    def _altered_here(self, entity: QuotaEntity, layer: dict[str, float | None]) -> None:
        """QuotaSources' hook, on the event loop: queue the entity's new layer for every member. Kept while the
        topic is unreachable (a quota change must not be lost, unlike usage), up to a bound."""
        try:
            self.alters.put_nowait((entity, layer))
        except asyncio.QueueFull:
            log.warning(
                "fleet %s: %d quota alters waiting for the topic; the alter of %s stays local to this member",
                self.quota_topic,
                self.alters.qsize(),
                entity,
            )

    def _warn(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "fleet %s: %s (%s: %s); enforcing this member's own usage only until it recovers (%d failures so far)",
                self.topic,
                what,
                type(exc).__name__,
                exc,
                self.errors,
            )

    # ------------------------------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        backoff = 1.0
        while True:
            producer = consumer = None
            try:
                await self._ensure_topic()
                producer = AIOKafkaProducer(
                    bootstrap_servers=self.servers,
                    acks=1,
                    linger_ms=0,
                    request_timeout_ms=5_000,
                    client_id=f"ktp-fleet-{self.member}",
                    **self.client,
                )
                consumer = AIOKafkaConsumer(
                    bootstrap_servers=self.servers,
                    enable_auto_commit=False,
                    group_id=None,
                    client_id=f"ktp-fleet-{self.member}",
                    fetch_max_wait_ms=100,
                    **self.client,
                )
                await producer.start()
                await consumer.start()
                tp, qtp = TopicPartition(self.topic, 0), TopicPartition(self.quota_topic, 0)
                consumer.assign([tp, qtp])
                await consumer.seek_to_end(tp)  # history is usage of windows gone by
                await consumer.seek_to_beginning(qtp)  # compacted: the last alter of every entity
                self.connected = True
                backoff = 1.0
                log.info(
                    "fleet %s: member %s publishing every %d ms", self.topic, self.member, round(self.interval_s * 1000)
                )
                await asyncio.gather(self._publish(producer), self._read(consumer), self._publish_alters(producer))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the channel: local enforcement, retry
                self._warn("unreachable", exc)
            finally:
                self.connected = False
                for client in (producer, consumer):
                    if client is not None:
                        with contextlib.suppress(Exception):  # closing a broken client
                            await client.stop()
            if self.manager.ledger is not None:  # what piled up while disconnected is stale: drop it
                self.manager.ledger.drain(self.member, self.now_ms())
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(bootstrap_servers=self.servers, request_timeout_ms=10_000, **self.client)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            if {self.topic, self.quota_topic} <= existing:
                await self._learn_ids(admin)
                return
            rf = min(3, max(1, len((await admin.describe_cluster())["brokers"])))
            wanted = {
                self.topic: {"retention.ms": str(RETENTION_MS), "cleanup.policy": "delete"},
                self.quota_topic: {"cleanup.policy": "compact"},
            }
            for name, configs in wanted.items():
                if name not in existing:
                    with contextlib.suppress(TopicAlreadyExistsError):  # another member created it meanwhile
                        await admin.create_topics([NewTopic(name, 1, rf, topic_configs=configs)])
            await self._learn_ids(admin)
        finally:
            await admin.close()

    async def _learn_ids(self, admin: Any) -> None:
        """The fleet topics' ids, for the guard: a client fetching by id (Fetch v13+) is refused as by name."""
        if self.guard is None:
            return
        pairs: dict[uuid.UUID, str] = {}
        for t in await admin.describe_topics([self.topic, self.quota_topic]):
            topic_id = t.get("topic_id") if isinstance(t, dict) else None
            if isinstance(topic_id, uuid.UUID):
                pairs[topic_id] = t.get("topic")
            elif isinstance(topic_id, str):
                with contextlib.suppress(ValueError):
                    pairs[uuid.UUID(topic_id)] = t.get("topic")
        self.guard.learn(pairs)

    async def _publish_alters(self, producer: Any) -> None:
        while True:
            entity, layer = await self.alters.get()
            key, value = encode_quota_record(entity, layer)
            try:
                await producer.send_and_wait(
                    self.quota_topic, value, key=key, headers=self._mac(self.quota_topic, key, value)
                )
            except Exception:
                self._altered_here(entity, layer)  # again after the reconnect
                raise
            self.alters_published += 1

    async def _publish(self, producer: Any) -> None:
        """Every interval, on a fixed cadence: drain the ledger and send its reports without waiting for their
        acknowledgements (a produce round trip, seconds on a loaded cluster, must not stretch the interval and so
        make every member's view later). At most :data:`MAX_UNACKED` reports in flight: past that usage is dropped
        and counted, as when the topic refuses it; a failed send ends the connection (reconnect, as before)."""
        ledger = self.manager.ledger
        last_sent = 0.0
        unacked: set[asyncio.Future[Any]] = set()
        failed: list[BaseException] = []

        def acked(fut: asyncio.Future[Any]) -> None:
            unacked.discard(fut)
            exc = asyncio.CancelledError() if fut.cancelled() else fut.exception()
            if exc is None:
                self.sent += 1
            else:
                self.dropped += 1
                failed.append(exc)

        tick = time.monotonic()
        while True:
            tick = max(tick + self.interval_s, time.monotonic())  # behind (a stalled loop): no catching up
            await asyncio.sleep(tick - time.monotonic())
            if failed:
                raise failed[0]
            reports = ledger.drain(self.member, self.now_ms()) if ledger is not None else []
            if not reports and time.monotonic() - last_sent >= HEARTBEAT_S:
                reports = [UsageReport(self.member, self.now_ms())]  # empty: "still here", for ktp_fleet_members
            for report in reports:
                if len(unacked) >= MAX_UNACKED:
                    self.dropped += 1
                    continue
                try:
                    value = report.encode()
                    fut = await producer.send(self.topic, value, headers=self._mac(self.topic, None, value))
                except Exception:
                    self.dropped += 1
                    raise
                unacked.add(fut)
                fut.add_done_callback(acked)
                last_sent = time.monotonic()

    async def _read(self, consumer: Any) -> None:
        """Read as records come (quota alters are taken in at once); fold usage once per interval."""
        last_fold = time.monotonic()
        while True:
            wait = self.interval_s - (time.monotonic() - last_fold)
            batches = await consumer.getmany(timeout_ms=max(10, round(wait * 1000)), max_records=500)
            for tp, records in batches.items():
                for record in records:
                    self.take(tp.topic, record.key, record.value, record.headers)
            if time.monotonic() - last_fold >= self.interval_s:
                last_fold = time.monotonic()
                self._apply_pending()

    def _apply_pending(self) -> None:
        """Fold every report read since the last fold into the trackers: one record per bucket, through a handle
        kept per bucket id while the manager's stamp holds (quotas altered or trackers dropped: bound anew)."""
        ids, amounts = self.fold.drain_ids()
        now = self.now_ms()
        manager = self.manager
        stamp = manager.stamp()
        if stamp != self._bound_stamp or len(self._bound) > MAX_NAMES:
            self._bound.clear()
            self._bound_stamp = stamp
        bound = self._bound
        names = self.fold.names
        apply = manager.apply_bound
        for bid, amount in zip(ids, amounts, strict=True):
            b = bound.get(bid, _UNBOUND)
            if b is _UNBOUND:
                key, user, client_id = names[bid]
                b = bound[bid] = manager.bind(key, user, client_id, "", now)  # None: no quota applies here
            if b is not None:
                apply(b, amount, now)
                self.applied += 1
        self.delays.extend(now - ts for ts in self._folding_ts)
        self._folding_ts.clear()

    def _mac(self, topic: str, key: bytes | None, value: bytes) -> list[tuple[str, bytes]]:
        return [(MAC_HEADER, record_mac(self.secret, topic, key, value))]

    def take(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None
    ) -> None:
        """One record read from a fleet topic: folded in only when a member wrote it (its MAC checks out)."""
        if not authentic(self.secret, topic, key, value, headers):
            self.unauthenticated += 1
            if self.unauthenticated == 1 or self.unauthenticated % 1000 == 0:
                log.warning(
                    "fleet %s: ignored a record without a valid MAC (written by something other than a "
                    "member, or altered; %d so far): check the cluster's ACLs on the fleet's topics",
                    topic,
                    self.unauthenticated,
                )
            return
        if topic == self.topic:
            self._fold(value)
        else:
            self._take_alter(key, value)

    def _take_alter(self, key: bytes | None, value: bytes | None) -> None:
        """Another member's (or this one's, echoed) alter, in the topic's order: the same on every member."""
        try:
            entity, layer = decode_quota_record(key, value)
        except ReportError as exc:
            self.bad += 1
            log.warning("fleet %s: %s", self.quota_topic, exc)
            return
        if self.sources is not None and self.sources.set_api_entity(entity, layer):
            self.alters_taken_in += 1
            log.info("fleet %s: quotas of %s now %s", self.quota_topic, entity, layer)

    def _fold(self, value: bytes | None) -> None:
        try:
            report = UsageReport.decode(value or b"")
            if report.member == self.member:
                return
            self.fold.add(report)  # reads the names it does not know yet: may refuse the report
        except ReportError as exc:
            self.bad += 1
            if self.bad == 1 or self.bad % 1000 == 0:
                log.warning("fleet %s: %s (%d refused so far)", self.topic, exc, self.bad)
            return
        self.heard[report.member] = time.monotonic()
        if len(self.heard) > 10_000:  # bounded: anyone who can write the topic could invent members
            oldest = min(self.heard, key=self.heard.__getitem__)
            del self.heard[oldest]
        self.received += 1
        self._folding_ts.append(report.ts_ms)
        if self.fold.entries >= MAX_FOLD_ENTRIES or len(self._folding_ts) >= MAX_FOLD_REPORTS:
            self._apply_pending()
