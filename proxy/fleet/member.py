"""The fleet's channel: lease records over a topic on the cluster the proxy already fronts (quota scope fleet).

Why a topic: the cluster is an existing, replicated, ordered log every member can reach; no consensus of our own,
no extra server. Topic ``__ktp_fleet_<name>``, one partition (every member reads every record, in one order),
short retention (a record older than a lease changes nothing). Every ``fleet.sync_interval_ms`` a member takes what
``quotas.fleet_reports.FleetLedger`` collected into its lease holder's demand meter and writes a lease record
(``quotas.fleet_leases``: its demand and hold per bucket); every member runs the same lease book over the topic, in
its order, and enforces the share its own records, read back, give it (issue 39; docs/fleet.md, "Leases").

Fair share in a fleet rides on the same topic: while fair share is on, a member says where it has light tenants
(``quotas.fleet_fair.LightReport``), and another member's report counts on its own brokers
(``quotas.fair_share.FairShare.note_remote``; docs/fleet.md, "Fair share in a fleet").

Never in the clients' way: publishing and reading run as tasks on the event loop through aiokafka; when the
topic is unreachable, the member's lease runs out and it enforces an equal split of each quota (the others count
its last hold until its lease has run out for them too), logs one WARNING per minute and counts the failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from config.model import ProxyConfig
from config.quota_sources import QuotaSources
from protocol.topic_guard import ProtectedTopics
from proxy.fleet.parts import FleetParts, topic_name
from quotas.fair_share import FairShare
from quotas.fleet_fair import MAGIC as LIGHT_MAGIC
from quotas.fleet_fair import LightReport
from quotas.fleet_leases import (
    LEASE_MS,
    SKEW_MS,
    LeaseBook,
    LeasedStore,
    LeaseRecord,
    lease_id,
)
from quotas.fleet_leases import (
    MAGIC as LEASE_MAGIC,
)
from quotas.fleet_reports import (
    MAC_HEADER,
    ReportError,
    Usage,
    authentic,
    decode_quota_record,
    encode_quota_record,
    record_mac,
)
from quotas.manager import QuotaManager

log = logging.getLogger(__name__)

RETENTION_MS = 60_000
#: A member not heard from for this long no longer counts in ``ktp_fleet_members``.
MEMBER_SILENT_S = 10.0
WARN_EVERY_S = 60.0
#: An idle member still reports (empty) this often, so the others know it is there.
HEARTBEAT_S = 2.0
#: Quota alters kept for publishing while the topic is unreachable.
MAX_UNACKED = 8
"""Reports sent and not yet acknowledged, at most (two seconds of reports at the default interval)."""
FAREWELL_WAIT_S = 2.0
"""How long a stopping member waits for its farewell record to be acknowledged (:meth:`FleetMember.stop`): a
shutdown must end even when the topic is slow; without the record its share comes back a lease later."""
LIGHT_REFRESH_MS = 1_000
"""While a member has light tenants and nothing new to say (no broker added to where it has some), it writes its light
report again this often, so that the others keep counting it. Why not every sync interval: a report's effect at the
others is only "somebody light is on this broker", which changes seldom; a member with something new (a light tenant
on a broker it did not report) writes at its next interval, so a new victim is protected as fast as the leases move.
Why not longer: a member learns a broker only once its own clients use it (a report naming a broker it does not know
yet is dropped, ``FairShare.note_remote``), so a flooder's member that starts after the victim's report limits within
this long."""
LIGHT_VALID_MS = 3 * LIGHT_REFRESH_MS
"""How long after it was written a light report counts (``until = ts + this``): three refreshes, so one or two lost or
late records (a loaded cluster delays records by more than a second) do not release the flooder's broker, and a report
lapses within this long of the light tenant's leaving (the tenant itself counts as active for two seconds after its
last request: ``quotas.fair_share.ACTIVE_MS``): the flooder's member limits no longer than needed."""
HISTORY_MS = 2 * (LEASE_MS + SKEW_MS) + 1_000
"""How far back a member starts reading the usage topic: every record still live in the lease book (a lease and
the skew) and the records those were taken with (as long again), so its book equals everybody else's."""


def _no_fair_share() -> FairShare | None:
    return None


class FleetSync:
    def __init__(
        self,
        config: ProxyConfig,
        manager: QuotaManager,
        parts: FleetParts,
        now_ms: Callable[[], int],
        sources: QuotaSources | None = None,
        guard: ProtectedTopics | None = None,
        fair_share: Callable[[], FairShare | None] | None = None,
    ) -> None:
        """``parts``: the member's lease holder, ledger and alter outbox (``proxy.fleet.parts``), which ``manager``
        and ``sources`` were built with. ``fair_share``: the policy's fair share now (None while it is off); a
        getter, since a reload turns it on or off."""
        assert isinstance(manager.store, LeasedStore) and manager.store.holder is parts.holder, (
            "the quota manager must be built with the member's leased store (FleetParts.leased)"
        )
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
        self.outbox = parts.alters
        self.alters = parts.alters.queue
        """Quota alters made here (``QuotaSources.alter`` puts them, through ``parts.alters``), to publish."""
        self.alters_published = self.alters_taken_in = 0
        self.member = parts.member
        self.interval_s = fc.sync_interval_ms / 1000
        self.servers = fc.bootstrap_servers or config.upstream.bootstrap_servers
        self.client = dict(fc.client)
        self.manager = manager
        self.now_ms = now_ms
        self.sent = self.received = self.errors = self.dropped = self.bad = 0
        self.unauthenticated = 0
        """Records on the fleet's topics without a valid MAC: ignored (not a member's, or altered)."""
        self.delays: deque[int] = deque(maxlen=4096)
        """ms from a lease record's ts (when its member wrote it) to when this member took it, for the last records:
        the sync delay
        (both clocks are wall clocks: a skew between hosts shows up here)."""
        self.heard: dict[str, float] = {}  # member -> monotonic time of its last report
        self.wall_ms = parts.wall_ms
        """The lease records' clock: a wall clock, compared across hosts (within ``SKEW_MS``)."""
        self.book = LeaseBook(fc.sync_interval_ms)
        """The fleet's leases, as every member computes them from the topic (``quotas.fleet_leases``)."""
        self.holder = parts.holder
        self.ledger = parts.ledger
        self.inner_store = manager.store.inner
        """The quotas themselves (the manager resolves through the member's shares of them)."""
        self.leases_taken = 0
        self._throttles_seen: dict[int, int] = {}
        """Lease id -> its tracker's throttle total when last looked at (a rise: throttled since)."""
        self._lease_names: dict[int, tuple[str, str, str]] = {}
        """Lease id -> a (quota key, user, client id) charged to it, for the buckets the demand meter knows."""
        self._expiry_noted = True
        self.connected = False
        self._producer: Any = None
        """The lease records' producer while connected: :meth:`stop` writes the farewell with it."""
        self._tasks: list[asyncio.Task[None]] = []
        self._last_warning = -WARN_EVERY_S
        self.fair_share = fair_share or _no_fair_share
        self.light_sent = self.light_taken = 0
        self._told: frozenset[str] = frozenset()
        """The brokers this member's last light report named (a broker not among them is news: written at once)."""
        self._told_ms = 0
        """When (wall ms) this member last wrote a light report."""

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run(), name="fleet-sync"))
        self._tasks.append(loop.create_task(self._watch_lease(), name="fleet-lease"))

    async def _watch_lease(self) -> None:
        """When the lease runs out (records late, or the topic unreachable), the connections bind again: to the
        minimum share while connected, to the equal split while cut off (``LeaseHolder.share``)."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.check_lease(self.wall_ms())

    def check_lease(self, now: int) -> None:
        g = self.holder.grant
        if g is not None and now >= g.until_ms and not self._expiry_noted:
            self._expiry_noted = True
            self._rebind()

    async def stop(self) -> None:
        """Called once every client connection is closed (``Server.shutdown``): the farewell record first, so the
        others take this member's share at their next grant instead of when its lease runs out (a rolling restart;
        ``LeaseHolder.farewell``), then the tasks. Best effort: a topic that does not answer within
        :data:`FAREWELL_WAIT_S` leaves the lease to run out, as if the member had died."""
        producer = self._producer
        if producer is not None and self.connected:
            try:
                value = self.holder.farewell(self.wall_ms()).encode()
                await asyncio.wait_for(
                    producer.send_and_wait(self.topic, value, headers=self._mac(self.topic, None, value)),
                    FAREWELL_WAIT_S,
                )
                log.info("fleet %s: member %s wrote its farewell record", self.topic, self.member)
            except Exception as exc:  # noqa: BLE001 - stopping regardless
                log.warning(
                    "fleet %s: member %s could not write its farewell record (%s: %s); its share returns when its "
                    "lease runs out",
                    self.topic,
                    self.member,
                    type(exc).__name__,
                    exc,
                )
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
            "ktp_fleet_reports_received": ("Lease records taken into this member's lease book", self.received),
            "ktp_fleet_errors": ("Fleet topic failures (publish, read, connect)", self.errors),
            "ktp_fleet_usage_dropped": (
                "Own usage not published: reports the topic refused, bucket usages over the ledger's bound",
                self.dropped + self.ledger.dropped,
            ),
            "ktp_fleet_reports_refused": ("Reports on the fleet topic that were malformed", self.bad),
            "ktp_fleet_sync_delay_p99_ms": (
                "99th percentile of the last 4096 lease records' delay from their writing to their taking here (ms)",
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
            "ktp_fleet_lease_members": ("Members holding leases in this member's lease book", self.book.live()),
            "ktp_fleet_leases_taken": ("Lease grants this member took (its own records read back)", self.leases_taken),
            "ktp_fleet_lease_expired": (
                "Shares asked while this member held no live lease (the equal split applied)",
                self.holder.expired,
            ),
            "ktp_fleet_light_reports_sent": (
                "Fair-share light reports this member wrote (where it has light tenants)",
                self.light_sent,
            ),
            "ktp_fleet_light_reports_taken": (
                "Other members' fair-share light reports taken into this member's fair share",
                self.light_taken,
            ),
        }

    def delay_p99(self) -> float:
        if not self.delays:
            return float("nan")
        ordered = sorted(self.delays)
        return float(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])

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
                self._producer = producer
                await consumer.start()
                tp, qtp = TopicPartition(self.topic, 0), TopicPartition(self.quota_topic, 0)
                consumer.assign([tp, qtp])
                # the records still live in everybody's lease book, and those they were taken with
                since = await consumer.offsets_for_times({tp: self.wall_ms() - HISTORY_MS})
                if since.get(tp) is not None:
                    consumer.seek(tp, since[tp].offset)
                else:
                    await consumer.seek_to_end(tp)
                await consumer.seek_to_beginning(qtp)  # compacted: the last alter of every entity
                self.connected = True
                backoff = 1.0
                log.info(
                    "fleet %s: member %s publishing every %d ms", self.topic, self.member, round(self.interval_s * 1000)
                )
                await asyncio.gather(
                    self._publish(producer),
                    self._read(consumer),
                    self._publish_alters(producer),
                    self._publish_light(producer),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the channel: local enforcement, retry
                self._warn("unreachable", exc)
            finally:
                self.connected = False
                self._producer = None
                self.holder.fallback = "split"  # cut off: the equal split once the lease has run out
                if self._expiry_noted:  # (already run out: bind again to the split now)
                    self._rebind()
                for client in (producer, consumer):
                    if client is not None:
                        with contextlib.suppress(Exception):  # closing a broken client
                            await client.stop()
            self.ledger.take()  # what piled up while disconnected is stale: drop it
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
                self.outbox.altered(entity, layer)  # again after the reconnect
                raise
            self.alters_published += 1

    async def _publish(self, producer: Any) -> None:
        """Every interval, on a fixed cadence: take the ledger's usage into the lease holder's demand meter and,
        unless its last record is still on its way (``LeaseHolder.due``), send a lease record, without waiting for
        its acknowledgement (a produce round trip, seconds on a loaded cluster, must not stretch the interval and so
        make every member's view later). At most :data:`MAX_UNACKED` reports in flight: past that usage is dropped
        and counted, as when the topic refuses it; a failed send ends the connection (reconnect, as before)."""
        ledger = self.ledger
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
            now = self.wall_ms()
            self.holder.fallback = "floor"  # connected: its floor until a record is back (first, or late ones)
            self._observe(ledger.take(), now)
            if not self.holder.due(now):
                continue
            if len(unacked) >= MAX_UNACKED:
                self.dropped += 1
                continue
            try:
                value = self.holder.record(now).encode()
                if self.holder.lowered:  # it lowered shares at once: the connections bind to them before it goes
                    self.holder.lowered = False
                    self._rebind()
                fut = await producer.send(self.topic, value, headers=self._mac(self.topic, None, value))
            except Exception:
                self.dropped += 1
                raise
            unacked.add(fut)
            fut.add_done_callback(acked)

    async def _publish_light(self, producer: Any) -> None:
        """Every interval, while fair share is on: the fleet's live member count into fair share (each member takes
        its part of the floor), and a light report when :meth:`light_report` has one. Awaited one at a time: at most
        one in flight, so a slow topic delays reports, never piles them up; a failed send ends the connection, as the
        lease records' does."""
        tick = time.monotonic()
        while True:
            tick = max(tick + self.interval_s, time.monotonic())  # behind (a stalled loop): no catching up
            await asyncio.sleep(tick - time.monotonic())
            value = self.light_report(self.wall_ms())
            if value is None:
                continue
            try:
                await producer.send_and_wait(self.topic, value, headers=self._mac(self.topic, None, value))
            except Exception:
                self.dropped += 1
                raise
            self.light_sent += 1

    def live_members(self) -> int:
        """The fleet's live members as the lease book knows them, this one included (before its first record)."""
        return max(1, self.book.live() + (self.member not in self.book.members))

    def light_report(self, now: int) -> bytes | None:
        """This member's light report due at ``now`` (wall ms), or None: fair share off, nothing light here (what it
        told before lapses at the others), or nothing new and its last report younger than :data:`LIGHT_REFRESH_MS`.
        Tells fair share the fleet's live member count first (it decides what is too small to compare by it)."""
        fair = self.fair_share()
        if fair is None:
            self._told = frozenset()
            return None
        fair.set_members(self.live_members())
        light = fair.light()
        if not light:
            self._told = frozenset()
            return None
        if self._told.issuperset(light) and now - self._told_ms < LIGHT_REFRESH_MS:
            return None
        self._told, self._told_ms = frozenset(light), now
        return LightReport(self.member, now, LIGHT_VALID_MS, light, fair.baselines()).encode()

    def _observe(self, usage: Iterable[Usage], now: int) -> None:
        """This interval's own usage into the demand meter, per lease (the bucket each charge resolved to), with
        the buckets throttled in it: its clients want more than its share, in either enforcement mode, even when
        nothing was recorded (KIP-599 rejects a request over its bucket: no usage, only a throttle)."""
        store = self.inner_store
        per: dict[int, tuple[float, float]] = {}
        held: dict[int, int] = {}
        seen = self._throttles_seen
        names = self._lease_names
        mono = self.now_ms()
        for key, user, client_id, amount in usage:
            r = store.resolve(user, client_id, key)
            if r is None:
                continue
            lid = lease_id(key, r.bucket)
            got = per.get(lid)
            per[lid] = (amount + (got[0] if got else 0.0), r.limit)
            names[lid] = (key, user, client_id)
        # Every bucket used lately (the demand meter's), with usage in this interval or not: throttled since?
        for lid in [lid for lid in names if lid not in per and lid not in self.holder.usage]:
            del names[lid]
            seen.pop(lid, None)
        for lid, (key, user, client_id) in names.items():
            b = self.manager.bind(key, user, client_id, "", mono)
            if b is None:
                continue
            total = b.tracker.throttle_ms_total
            if total > seen.get(lid, 0):
                held[lid] = b.tracker.last_throttle_ms
            seen[lid] = total
        self.holder.observe(per, now, held)

    def _rebind(self) -> None:
        """Shares changed: every kept handle binds again (as after a quota alter), to the new limits."""
        self.manager._store_changed()

    async def _read(self, consumer: Any) -> None:
        """Take every record as it comes: lease records into the book, quota alters into the quotas."""
        while True:
            batches = await consumer.getmany(timeout_ms=1_000, max_records=500)
            for tp, records in batches.items():
                for record in records:
                    self.take(tp.topic, record.key, record.value, record.headers)

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
            magic = value[:4] if value is not None else None
            if value is not None and magic == LEASE_MAGIC:
                self._take_lease(value)
            elif value is not None and magic == LIGHT_MAGIC:
                self._take_light(value)
            else:  # a usage report (format 2): a member of an earlier version; members upgrade together
                self._refused(
                    "a record that is neither a lease record nor a light report (a member older than issue 39's "
                    "leases? the members of a fleet upgrade together)"
                )
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

    def _refused(self, why: object) -> None:
        """A record on the usage topic that is not one a member takes: counted; one WARNING, then one per 1,000."""
        self.bad += 1
        if self.bad == 1 or self.bad % 1000 == 0:
            log.warning("fleet %s: %s (%d refused so far)", self.topic, why, self.bad)

    def _take_light(self, value: bytes) -> None:
        """Another member's light report: its light tenants count on those brokers here until the report lapses
        (its ``ts + valid``, by the writer's clock: a late report counts for less, one already lapsed not at all), as
        one of the fleet's live members (the lease book's count). Its own, read back, is not news."""
        try:
            rec = LightReport.decode(value)
        except ReportError as exc:
            self._refused(exc)
            return
        fair = self.fair_share()
        if rec.member == self.member or fair is None:
            return
        left = rec.ts_ms + rec.valid_ms - self.wall_ms()
        if left <= 0:  # late, or from before this member started reading (HISTORY_MS)
            return
        left = min(left, rec.valid_ms + SKEW_MS)  # a writer's clock ahead of this one's counts no longer than that
        fair.note_remote(rec.member, rec.light, self.live_members(), self.now_ms() + left, rec.base)
        self.light_taken += 1

    def _take_lease(self, value: bytes) -> None:
        """A lease record, in the topic's order: into the book (every member's book takes the same records in the
        same order); this member's own newest record, read back, gives it its new shares."""
        try:
            rec = LeaseRecord.decode(value)
        except ReportError as exc:
            self._refused(exc)
            return
        mine = rec.member == self.member
        grant = self.book.take(rec, grant=mine)
        self.received += 1
        g = self.holder.grant
        if g is None or self.wall_ms() >= g.until_ms:  # no lease: the equal split among the members in the book
            self.holder.members_seen = self.book.live() + (self.member not in self.book.members)
        self.delays.append(self.wall_ms() - rec.ts_ms)
        if mine:
            if grant is not None and self.holder.read_back(rec, grant, self.book.live(), self.wall_ms()):
                self.leases_taken += 1
                self._expiry_noted = False
                self._rebind()
            return
        self.heard[rec.member] = time.monotonic()
        if len(self.heard) > 10_000:  # bounded: anyone who can write the topic could invent members
            oldest = min(self.heard, key=self.heard.__getitem__)
            del self.heard[oldest]
