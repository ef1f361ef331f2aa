"""The one place where a request meets protocol, quotas and muting.

Every request frame passes through :meth:`Policy.on_request`; the response to every request that got a
:class:`Decision` passes through :meth:`Policy.on_response`. Decisions are made on the event loop,
synchronously, except when the cluster must be asked first (current partition counts for KIP-599): then the
connection defers this request, and the ones behind it, until the answer is in.

What is charged where (see docs/quotas.md for the why):
- Produce: the request size (header + body) to ``producer_byte_rate`` when the request arrives; new producer
  ids to ``producer_ids_rate``. The data is always forwarded; acks=0 is muted at once (no response comes).
- Fetch: the response size to ``consumer_byte_rate`` when the response arrives; the data is delivered, the
  connection muted (an empty answer would break incremental fetch sessions). Replica fetches are exempt.
- ``request_percentage``: an estimate of the broker thread time each request costs (quotas.kinds.thread_ms, no
  clock read, so no wait the client asked for is ever charged), decided when the request arrives (its fixed and
  per-request-byte terms: over quota, nothing behind it is read, as a broker that reads one request a
  connection at a time holds a pipelining client). Its per-response-byte term is taken from the last response of
  the same API on the connection (the one charge stays at arrival, so the decision log replays it exactly).
  SASL, ApiVersions and the quota APIs are never charged.
- CreateTopics / CreatePartitions / DeleteTopics: partitions to ``controller_mutation_rate`` (KIP-599).
The response's ``throttle_time_ms`` becomes max(broker's, every proxy quota's), and the client is muted for the
proxy's throttle after the response is sent. With ``quotas.enforce: false`` (shadow mode) all of it is computed
and counted, and nothing is rewritten, rejected or muted.

This module is the dispatcher: it routes a request to the job that decides it and carries the decision to the
response. The jobs have modules of their own: the plan and binding lookup (``quotas.plans``), and beside this one
in ``proxy.rules``: the producer-id charge (``producer_id_charge``), smooth pacing (``pacing``), KIP-599
(``mutation_quota``, its cluster asks in ``partition_counts``), the protected topics' answers (``guard_answers``),
the quota APIs (``client_quota_api``) and recording (``decision_recording``).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import Final

from config.model import ProxyConfig
from config.quota_sources import QuotaSources
from mute import KeyedHolds
from protocol import throttle_field
from protocol.apis import Api
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader, response_body_offset
from protocol.inflight import Pending
from protocol.request import Request
from protocol.topic_guard import ProtectedTopics
from proxy.fleet.parts import FleetParts
from proxy.rules import client_quota_api
from proxy.rules.decision_recording import DecisionRecorder
from proxy.rules.decisions import SIZE, Buffer, ConnState, Decision, Verdict, ms
from proxy.rules.fair_seat import FETCH_APIS, BrokerSample, FairSeat, TenantSample
from proxy.rules.guard_answers import GuardAnswers
from proxy.rules.mutation_quota import MutationQuota
from proxy.rules.pacing import fetch_room, owed_ms, pace_marks, wait_slice_s
from proxy.rules.partition_counts import PartitionCounts
from proxy.rules.producer_id_charge import charge_producer_ids
from proxy.rules.topic_counts import RecentTopics
from proxy.rules.verdicts import Defer, PolicyConnection, Replace
from proxy.stats import Stats
from proxy.wire.responses import TopicIds
from quotas.connections import IpQuotas
from quotas.entities import QuotaStore
from quotas.fair_share import BrokerLoad, Tenant
from quotas.kinds import BUILTIN_COSTS, RequestCosts, amount_from
from quotas.manager import QuotaManager, Windows
from quotas.plans import BoundPlan, Plan, Plans, bind
from quotas.producer_ids import ProducerIdQuotaConfig, ProducerIdTracker
from quotas.throttle import MAX_THROTTLE_MS, combine

__all__ = ["Decision", "Policy", "Verdict"]

log = logging.getLogger(__name__)

_I32: Final = struct.Struct(">i")


def _fair_wait(d: Decision, fair_ms: int) -> None:
    """The wait fair share gave a request, or (negative: shadow mode) would have given it."""
    if fair_ms < 0:
        d.fair_ms, d.fair_shadow = -fair_ms, True
    else:
        d.fair_ms = fair_ms


class Policy:
    def __init__(
        self,
        config: ProxyConfig,
        stats: Stats,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fleet: FleetParts | None = None,
        topics: TopicIds | None = None,
    ) -> None:
        """``fleet``: quota scope ``fleet``'s lease holder, ledger and alter outbox (``proxy.fleet.parts``), which
        the quota manager and the quota sources are built with. ``topics``: what the proxy learnt of the cluster's
        topics from the Metadata it passed on (a Produce's replication factor, for the request quota)."""
        self.stats = stats
        self.topics = topics
        self._clock = clock
        """Monotonic seconds; injected so a test can drive every time-dependent decision."""
        self.store = QuotaStore()
        self.sources = QuotaSources(
            self.store, config.quotas.state_file, on_alter=fleet.alters.altered if fleet is not None else None
        )
        self.ip_quotas = IpQuotas()
        """KIP-612 connection_creation_rate per ip: the file's limits.ip_connection_creation_rate, then the API's."""
        # A fleet member enforces its share of each quota, and notes its charges for the others.
        leased = fleet.leased(self.store) if fleet is not None else self.store
        self.quotas = QuotaManager(leased, ledger=fleet.ledger if fleet is not None else None)
        self.plans = Plans(self.store, self.quotas)
        self.producer_ids: ProducerIdTracker  # set by reload()
        self.recorder = DecisionRecorder(config, stats, self.now_ms, wall_clock)
        self.keep_values = self.recorder.log is not None
        """Decisions keep what each quota recorded (:attr:`Decision.values`): the decision log writes it."""
        self._logging = self.keep_values
        """The decision log is on (read per request: one native field, where the recorder's is two reads)."""
        self._pid_holds = KeyedHolds()
        """user -> monotonic time before which that user's Produce/InitProducerId requests wait (KIP-936)."""
        own = frozenset(n for n in (config.decision_log.topic,) if n)
        self.guard: ProtectedTopics | None = ProtectedTopics(own) if config.fleet.name or own else None
        """The proxy's own topics (the fleet's, the decision log's), refused to every client; None while it keeps
        none on the cluster, so a request pays one attribute read for it. Fixed at start, like the topics it
        protects (``decision_log`` and ``fleet`` are restart-only: config.reload)."""
        self.guard_answers = GuardAnswers(stats, clock)
        self.recent_topics = RecentTopics()
        """Partition counts the cluster answered this proxy's mutations with, newer than brokers' metadata."""
        self.partition_counts = PartitionCounts(self.recent_topics, self.now_ms)
        self.mutations = MutationQuota(self.quotas, self.partition_counts, self.now_ms)
        self.costs: RequestCosts = BUILTIN_COSTS
        """What each request costs the brokers' threads (``request_percentage``): ``quotas.request_costs``, else the
        built-in table."""
        self.fair: FairSeat | None = None
        """Capacity-aware fair share (``proxy.rules.fair_seat``); None while ``quotas.fair_share.enabled`` is false."""
        self.fair_enforce = True
        self.reload(config)

    @property
    def lag_rechecks_s(self) -> tuple[float, ...]:
        """Waits before asking again about a topic the client's broker does not know
        (``proxy.rules.partition_counts``)."""
        return self.partition_counts.lag_rechecks_s

    @lag_rechecks_s.setter
    def lag_rechecks_s(self, value: tuple[float, ...]) -> None:
        self.partition_counts.lag_rechecks_s = value

    def reload(self, config: ProxyConfig) -> None:
        """A new, already validated configuration: take its quotas and enforcement settings. Its restart-only
        settings are the running ones (``Server.reload`` keeps them: config.reload)."""
        qc = config.quotas
        self.config = config
        self.sources.set_file({e.quota_entity(): dict(e.quotas) for e in qc.entities})
        self.ip_quotas.set_file(config.limits.ip_connection_creation_rate)
        self.admins = frozenset(qc.admins)
        self.describers = frozenset(qc.admins if qc.describers is None else qc.describers)
        self.enforce = qc.enforce
        self.cluster_scope = qc.scope in ("cluster", "fleet")
        self.charge_validate_only = qc.charge_validate_only
        self.mutations.charge_validate_only = qc.charge_validate_only
        self.pid_hold_max_ms = qc.producer_id_hold_max_ms
        pid_config = ProducerIdQuotaConfig(
            qc.producer_id_window_num, round(qc.producer_id_window_size_seconds), qc.producer_id_cleanup_interval_ms
        )
        if getattr(self, "producer_ids", None) is None or self.producer_ids.config != pid_config:
            self.producer_ids = ProducerIdTracker(pid_config)
        self.smooth = qc.enforcement == "smooth"
        # New costs take effect at each connection's next bind: quotas.configure below moves the stamp.
        self.costs = qc.request_costs.costs() if qc.request_costs is not None else BUILTIN_COSTS
        fc = qc.fair_share
        if not fc.enabled:
            if self.fair is not None:
                self.fair.retire()
            self.fair = None  # a request held for its share asks again, finds none, and goes
        elif self.fair is None:
            self.fair = FairSeat(fc)
        else:
            self.fair.configure(fc)
        self.fair_enforce = fc.enforce and qc.enforce
        self.quotas.configure(
            Windows.from_settings(qc.model_dump()),
            round(qc.entity_idle_seconds * 1000),
            qc.max_tracked_buckets,
            qc.smooth_burst_seconds if self.smooth else None,
        )

    def now_ms(self) -> int:
        """The policy's clock in ms: what anything recording into its quota state (the fleet) must use."""
        return ms(self._clock())

    def upkeep(self) -> None:
        if self.sources.refresh():  # a sibling worker altered quotas through its AlterClientQuotas
            log.info(
                "quotas.state_file %s changed (altered through another worker); now in force", self.sources.state_file
            )
        now_ms = self.now_ms()
        self.quotas.expire(now_ms)
        self.producer_ids.cleanup(now_ms)
        self._pid_holds.expire(now_ms / 1000)

    def quota_samples(self) -> list[tuple[str, str, str, str, str, float]]:
        return list(self.quotas.samples(self.now_ms(), self.config.metrics.max_entity_series))

    def _scope(self, conn: PolicyConnection) -> str:
        if self.cluster_scope:
            return ""
        if conn.label != "bootstrap":
            return conn.label  # "broker N": one bucket per broker, however the client reached it
        host, port = conn.upstream_addr or ("?", 0)
        return f"{host}:{port}"

    # ------------------------------------------------------------------------------------------ requests

    def on_request(self, conn: PolicyConnection, request: Request, now: float, st: ConnState | None = None) -> Verdict:
        """Decide on one request, as the session read it (``protocol.session.Request``: its header, a Produce's
        acks; no rule reads those again). Its ``frame`` is the whole request frame, size prefix included
        (``bytes`` for all but large ones: the producer-id memo then reads it natively). Views of its body are made
        only where a body is walked: the usual request, charged by its size, needs none, and making them cost more
        than the rest of the plain path (docs/performance.md). ``st``: the connection's ``policy_state`` as the
        connection read it (compiled, reading it here through the protocol is a generic attribute read; None: read
        here)."""
        header = request.header
        frame = request.frame
        key = header.api_key
        guard = self.guard
        if guard is not None and guard.may_name(request):
            refusal = self.guard_answers.refusal(conn, request, guard)
            if refusal is not None:
                return self.guard_answers.refuse(conn, request, refusal, now, self._decide, self.new_decision)
        if key == Api.DESCRIBE_CLIENT_QUOTAS or key == Api.ALTER_CLIENT_QUOTAS:
            return client_quota_api.answer(
                conn, header, memoryview(frame)[4:], self.sources, self.admins, self.describers, self.ip_quotas
            )
        if self._pid_holds and (key == Api.PRODUCE or key == Api.INIT_PRODUCER_ID):
            wait = self._pid_holds.remaining(conn.identity.principal, now)
            if wait > 0 and self.enforce:
                return self._hold(conn, request, wait)
        return self._gate(conn, request, now, st)

    def _gate(self, conn: PolicyConnection, request: Request, now: float, st: ConnState | None = None) -> Verdict:
        """Fair share's step before the quotas' decision: the request counted to its tenant, and held while its
        tenant is over its share of a limited broker (``proxy.rules.fair_seat``)."""
        fair = self.fair
        if fair is None:
            return self._decide(conn, request, now, None, 0, st)
        if st is None:
            st = conn.policy_state
            if st is None:
                st = conn.policy_state = ConnState(conn.identity)
        now_ms = ms(now)
        t, mark = fair.request(conn, st, request, now_ms)
        if t is None:
            return self._decide(conn, request, now, None, 0, st)
        if mark >= 0:  # over its share of a limited broker: it waits, unread behind it
            wait_ms = t.broker.wait_ms(t, mark, now_ms)
            if wait_ms > 1:
                if self.fair_enforce:
                    return self._fair_hold(conn, request.copied(), t, mark, now_ms, wait_ms)
                # Shadow mode: it goes now, recorded with the wait it would have had (a negative fair_ms).
                return self._decide(conn, request, now, t, -wait_ms, st)
        return self._decide(conn, request, now, t, 0, st)

    def _fair_hold(
        self, conn: PolicyConnection, request: Request, t: Tenant, mark: float, at_ms: int, wait: int
    ) -> Defer[Verdict]:
        """A method of its own (as :meth:`_hold`): compiled, a lambda in :meth:`_gate` allocated its closure on every
        request. ``request``: with a copy of its frame (the client's chunk may be reused before the wait ends)."""
        return Defer(lambda: self._after_fair_hold(conn, request, t, mark, at_ms), wait_s=wait_slice_s(wait))

    async def _after_fair_hold(
        self, conn: PolicyConnection, request: Request, t: Tenant, mark: float, held_ms: int
    ) -> Verdict:
        """A request held for its tenant's fair share, asked again (at most ``PACE_RECHECK_MS`` after it was last):
        still owing at the share in force now, it waits again; paid (or fair share released or turned off), it is
        decided as if it had just arrived, with the wait it was given (``held_ms``: when it arrived)."""
        now = self._clock()
        now_ms = ms(now)
        if self.fair is not None and self.fair_enforce:
            self.fair.state.tick(now_ms)  # a connection held this long may be the only one left to tick
            wait_ms = t.broker.wait_ms(t, mark, now_ms)
            if wait_ms > 1:
                return Defer(
                    lambda: self._after_fair_hold(conn, request, t, mark, held_ms), wait_s=wait_slice_s(wait_ms)
                )
        waited = now_ms - held_ms
        t.held_ms_total += waited
        t.held_total += 1
        return self._decide(conn, request, now, t, waited)

    def _hold(self, conn: PolicyConnection, request: Request, wait: float) -> Defer[Verdict]:
        """A method of its own: compiled, a lambda in :meth:`on_request` allocated its closure on every request."""
        held = request.copied()  # the client's chunk may be reused before the hold ends
        return Defer(lambda: self._after_hold(conn, held), wait_s=wait)

    async def _after_hold(self, conn: PolicyConnection, request: Request) -> Verdict:
        """KIP-936 hold: the connection muted the request (and, unread, everything behind it) for the user's
        producer-id throttle; now it is decided as if it had just arrived. The connection stays open."""
        return self._gate(conn, request, self._clock())

    def new_decision(self, st: ConnState, client_id: str, header: RequestHeader, size: int) -> Decision:
        """The one place a decision is made: what the decision log keeps and whether its throttles are served are
        chosen here, once, from the configuration in force when the request came."""
        return Decision(st, client_id, header, size, self.keep_values, not self.enforce)

    def _bind(
        self, conn: PolicyConnection, st: ConnState, plan: Plan, key: int, client_id: str, now_ms: int
    ) -> BoundPlan | None:
        """API ``key``'s plan bound to the connection's principal, client id and scope (None: no quota applies to
        this client), remembered as the connection's last; the scope is looked up again when the quotas or the
        principal changed."""
        q = self.quotas
        user = st.identity.principal
        if st.stamp != q.stamp() or st.user != user:
            st.user, st.scope = user, self._scope(conn)
        b = bind(q, plan, key, user, client_id, st.scope, now_ms, self.costs)
        st.stamp = q.stamp()  # binding may have dropped trackers (the cap): what is bound now is current
        st.last_key, st.last_client_id, st.last = key, client_id, b
        return b

    def _decide(
        self,
        conn: PolicyConnection,
        request: Request,
        now: float,
        ft: Tenant | None = None,
        fair_ms: int = 0,
        st: ConnState | None = None,
    ) -> Verdict:
        """The quotas' decision on one request. ``ft``: its fair-share tenant (None while fair share is off);
        ``fair_ms``: how long fair share held it (recorded with the decision; negative in shadow mode: how long it
        would have, recorded as shadow); ``st``: the connection's policy state
        when the caller has read it (None: read here; compiled, ``conn.policy_state`` is a generic attribute read)."""
        header = request.header
        frame = request.frame
        key = header.api_key
        now_ms = ms(now)
        client_id = header.client_id or ""
        if st is None:
            st = conn.policy_state  # the one read of it a request: the rest is native
        b: BoundPlan | None = None
        memo = False
        if st is not None:
            # Read through a name of the native type: compiled, the Optional one's fields are compared as boxed
            # objects (a generic compare each).
            cs: ConnState = st
            if (
                cs.last_key == key
                and cs.stamp == self.quotas.stamp()
                and cs.last_client_id == client_id
                and cs.user == cs.identity.principal
            ):  # as the last request: its plan, bound (see ConnState.last)
                b = cs.last
                memo = True
            elif cs.plain_key == key and cs.plain_stamp == self.quotas.stamp():
                memo = True  # no quota charges this API, as for the last request: no plan to look up
        if not memo:
            plan = self.plans.plan(key)
            if plan is None:  # no quota configured charges this API: the plain proxy's path, one dict lookup
                b = None
                if st is not None:
                    st.plain_key, st.plain_stamp = key, self.quotas.stamp()
            else:
                if st is None:
                    st = conn.policy_state = ConnState(conn.identity)
                b = self._bind(conn, st, plan, key, client_id, now_ms)
        if b is None:
            if ft is None or st is None or (fair_ms == 0 and not (ft.paced and key in FETCH_APIS)):
                return None
            return self._fair_only(st, client_id, request, ft, fair_ms, now_ms)
        assert st is not None  # a bound plan is kept on the connection's state
        plan = b.plan
        size = len(frame) - 4  # what a broker's quotas count: the request after its size prefix
        d = self.new_decision(st, client_id, header, size)
        if self._logging:  # it gets its own event: out of the summary (sums count the size prefix)
            conn.traffic.logged_request(size + 4)
        d.charged_ms = now_ms
        quotas = self.quotas
        for kind, h, how in b.at_request:
            # Both branches float: an int | float would be boxed, and unboxed again for each of the two calls below.
            if how == "request_bytes":
                a = float(size)
            elif how == "thread_time":  # request_percentage, decided here: a broker reads nothing behind a throttled
                # request. The response-size term: the last answer of this API on this connection (one charge); a
                # Produce with acks=-1 costs its followers' delayed Fetch completions, one with acks=0 nothing (its
                # acks as the session read them).
                acks = request.acks
                replication = -1
                if key == Api.PRODUCE and acks != 0:
                    replication = self._replication(st, request)
                # Alone: nothing else of the connection awaited an answer when it came (the session's reading), as
                # a consumer's Fetch or a request/response loop; the brokers charge those more (RequestCosts.alone).
                a = self.costs.request_percent(
                    key, size, st.last_out.get(key, 0) if b.out_term else 0, acks, replication, request.alone
                )
            else:
                a = amount_from(how, size, 0, key, self.costs)
            d.note(kind.key, a, h.limit, quotas.charge(h, a, now_ms))
        d.noted = b.at_request_kinds
        d.out_term = b.out_term
        if plan.exempt_replicas and b.later and request.is_replica_fetch():
            d.later, d.later_kinds = b.later_replica, b.later_replica_kinds
        else:
            d.later, d.later_kinds = b.later, b.later_kinds
        if ft is not None:
            _fair_wait(d, fair_ms)
            if ft.paced and key in FETCH_APIS:
                d.fair = ft  # its answer is charged to the tenant's share, and throttled over it
        if self.smooth:
            if d.throttle_ms > 0:  # the pacing wait of the kinds charged now: served before the broker sees it
                d.paced_ms, d.throttle_ms = d.throttle_ms, 0
                d.pace_marks = pace_marks(quotas, b.at_request, now_ms)
            elif key == Api.FETCH and (d.later or d.fair is not None):
                room = fetch_room(quotas, d, now_ms)
                if d.fair is not None and self.fair is not None and self.fair_enforce:
                    fair_room = self.fair.fetch_room(d.fair, now_ms)
                    if fair_room is not None and (room is None or fair_room < room):
                        room = fair_room
                if room is not None:
                    capped = request.capped_fetch(room)
                    if capped is not None:
                        return Replace(d, capped)
        if b.pids is not None:
            charge_producer_ids(
                quotas, self.producer_ids, self._pid_holds, self.pid_hold_max_ms, d, b.pids, request, now_ms
            )
        if d.paced_ms > 0 and not d.shadow:
            return self._paced(conn, d)
        if d.throttle_ms > 0 and not d.shadow:  # like a broker, read nothing more until it is served
            d.holds = True
            conn.mute.hold()
        if plan.mutation:
            return self.mutations.request(conn, d, header, memoryview(frame)[4:], now_ms)
        if not (d.noted or d.later or d.fair is not None or d.fair_ms > 0):
            return None
        return d

    def _paced(self, conn: PolicyConnection, d: Decision) -> Defer[Verdict]:
        """A method of its own (as :meth:`_hold`): compiled, a lambda in :meth:`_decide` made every local of it a
        field of a closure allocated on every request."""
        return Defer(lambda: self._after_paced(conn, d), wait_s=wait_slice_s(d.paced_ms))

    async def _after_paced(self, conn: PolicyConnection, d: Decision) -> Verdict:
        """A request held for its pacing wait (the connection waited ``Defer.wait_s``): still owing at the rate in
        force now (the rate moved, or this was one slice of a longer wait), it waits again, at most
        ``PACE_RECHECK_MS``; paid, it goes to the broker. A throttle of its own (KIP-936) still holds the reads
        behind it until served, as at arrival."""
        marks = d.pace_marks
        if marks:
            wait = owed_ms(self.quotas, marks, self.now_ms())
            if wait > 1:  # a millisecond is a timer's own granularity: one that fired that early has paid
                return Defer(lambda: self._after_paced(conn, d), wait_s=wait_slice_s(wait))
            d.pace_marks = None
        if d.throttle_ms > 0:
            d.holds = True
            conn.mute.hold()
        return d

    def _fair_only(
        self,
        st: ConnState,
        client_id: str,
        request: Request,
        ft: Tenant,
        fair_ms: int,
        now_ms: int,
    ) -> Verdict:
        """A request no quota charges, that fair share held (``fair_ms``: its wait, recorded) or whose answer it
        charges (a Fetch from a paced tenant, its ``max_bytes`` capped to the tenant's bucket)."""
        header = request.header
        size = len(request.frame) - 4
        d = self.new_decision(st, client_id, header, size)
        d.charged_ms = now_ms
        _fair_wait(d, fair_ms)
        if ft.paced and header.api_key in FETCH_APIS:
            d.fair = ft
            if self.fair is not None and self.fair_enforce:
                room = self.fair.fetch_room(ft, now_ms)
                capped = None if room is None else request.capped_fetch(room)
                if capped is not None:
                    return Replace(d, capped)
        return d

    # ------------------------------------------------------------------------------------------ responses

    def on_response(
        self, conn: PolicyConnection, pending: Pending, frame: Buffer, now: float, total: int | None = None
    ) -> list[memoryview | bytes] | None:
        """``frame`` is the whole response frame, or only its leading bytes when it streams through
        (``total`` is then the frame's full length): throttle_time_ms sits within them (see _may_stream).
        ``now``: monotonic seconds when it was read (the connection reads the clock once a read)."""
        d: Decision = pending.decision
        now_ms = ms(now)
        size = (total if total is not None else len(frame)) - 4
        if d.out_term:
            last_out = d.state.last_out
            if len(last_out) >= 64 and d.api_key not in last_out:  # api keys come from clients
                last_out.clear()
            last_out[d.api_key] = size
        if d.later:
            quotas = self.quotas
            for kind, h, how in d.later:
                a: float = (
                    float(size)
                    if how == "response_bytes"
                    else amount_from(how, d.bytes_in, size, d.api_key, self.costs)
                )
                d.note(kind.key, a, h.limit, quotas.charge(h, a, now_ms))
            d.noted |= d.later_kinds
        ft = d.fair
        if ft is not None:  # a paced tenant's Fetch: its answer charged to its share, throttled over it (KIP-219)
            fb: BrokerLoad = ft.broker
            fb.charge(ft, float(size), now_ms)
            f = fb.throttle_ms(ft, now_ms)
            if f > 0 and self.fair_enforce:
                d.fair_ms = f
                ft.held_ms_total += f
                ft.held_total += 1
                if f > d.throttle_ms:
                    d.throttle_ms = f if f < MAX_THROTTLE_MS else MAX_THROTTLE_MS
            elif f > 0:  # shadow mode: the throttle it would have had, recorded as shadow
                d.fair_ms, d.fair_shadow = f, True
        upstream_ms: float | None = None  # the decision log's alone: boxed, it cost a float object a response
        if self._logging and pending.local is None:
            upstream_ms = (now - pending.sent_at) * 1000
        throttle = d.throttle_ms
        if d.merge is None and (throttle <= 0 or d.shadow):  # the usual answer: nothing to rewrite
            if d.holds:
                conn.mute.served(0 if d.shadow else throttle / 1000)
            self.recorder.record(conn, d, size, upstream_ms, now_ms, d.shadow)
            return None
        header = pending.header
        view = memoryview(frame)
        body_start = 4 + response_body_offset(view[4:], header.api_key, header.api_version)
        pieces: list[memoryview | bytes] | None = None
        if d.merge is not None:  # a mutation request: its answer merged with the proxy's rejections, and learnt from
            merged = bytes(view[4:body_start]) + bytes(d.merge(view[body_start:]))
            view = memoryview(SIZE.pack(len(merged)) + merged)
            pieces = [view]
        if throttle > 0 and not d.shadow:
            offset = throttle_field.throttle_offset(header.api_key, header.api_version, view[body_start:])
            if offset is not None:
                at = body_start + offset
                broker = _I32.unpack_from(view, at)[0]
                if throttle > broker:  # the client waits for the longest of all: the broker's and every quota's
                    pieces = [view[:at], _I32.pack(combine(throttle, broker)), view[at + 4 :]]
            if not d.holds:
                conn.mute.mute_for(throttle / 1000)
        if d.holds:
            conn.mute.served(0 if d.shadow else throttle / 1000)
        self.recorder.record(conn, d, size if d.merge is None else len(view) - 4, upstream_ms, now_ms, d.shadow)
        return pieces

    def on_answer(self, st: ConnState | None, pending: Pending, nbytes: int, now: float, start: float) -> None:
        """Every answer from the broker (``nbytes`` long, read at ``now``; the broker could start on its request at
        ``start``) on a connection whose policy state is ``st`` (the connection passes its own attribute: read here
        through the protocol, it is a generic attribute read): fair share's sample of the broker's service time, and
        a Fetch's bytes counted to its tenant."""
        fair = self.fair
        if fair is not None and st is not None:
            fair.answer(st, pending, nbytes, now, start)

    def fair_snapshot(self) -> tuple[list[BrokerSample], list[TenantSample]]:
        """Fair share's metrics (``proxy.rules.fair_seat.FairSeat.snapshot``); empty while it is off."""
        fair = self.fair
        return ([], []) if fair is None else fair.snapshot(self.config.metrics.max_entity_series)

    def _replication(self, st: ConnState, request: Request) -> int:
        """The largest replication factor of the topics a Produce writes to, as the cluster's Metadata answers to
        this proxy's clients gave them; -1 when not known (the request quota then goes by its acks). A frame that
        does not parse is -1 too: the broker answers it with its own error. A producer sends request after request
        to one topic: while the request's head (up to its topic's key) is the last one's byte for byte and the
        topics' table has not changed, the last answer stands (``ConnState.produce_head``), with no read of it."""
        topics = self.topics
        header = request.header
        if topics is None or header.body_offset is None:
            return -1
        frame = request.frame
        at = 4 + header.body_offset
        head = st.produce_head
        # A slice and a compare, both native when compiled (bytes.startswith is a generic method call: ~1,000
        # instructions, as much as the rest of the request quota's charge).
        if (
            len(head) > 0  # not ``head``: compiled, a bytes' truth is a generic call
            and st.produce_stamp == topics.stamp
            and isinstance(frame, bytes)
            and frame[at : at + len(head)] == head
        ):
            return st.produce_rf
        try:
            keys, end = request.topics_head()
        except ProtocolError:
            return -1
        rf = topics.replication_of(keys)
        st.produce_head = bytes(frame[at:end]) if 0 <= end - at <= 1024 else b""
        st.produce_stamp = topics.stamp
        st.produce_rf = rf
        return rf

    def fair_tick(self) -> None:
        """Fair share's control step when no request has run it lately, and its state changes to the log (the server
        calls it every second; requests tick it every ``quotas.fair_share.TICK_MS``)."""
        fair = self.fair
        if fair is not None:
            fair.state.tick(self.now_ms())
            for b, state in fair.state.take_changes():
                self.recorder.fair_share_change(b, state, not self.fair_enforce)

    def on_unanswered(self, conn: PolicyConnection, d: Decision) -> None:
        """Produce acks=0: no response will come, so the mute starts now; what is charged at a response is charged
        here, with no response bytes. (``request_percentage`` charged it nothing at its arrival: a broker records an
        acks=0 Produce exempt from the request quota.)"""
        if d.later:
            quotas = self.quotas
            for kind, h, how in d.later:
                a = 0.0 if how == "response_bytes" else amount_from(how, d.bytes_in, 0, d.api_key, self.costs)
                d.note(kind.key, a, h.limit, quotas.charge(h, a, d.charged_ms))
            d.noted |= d.later_kinds
        if d.holds:
            conn.mute.served(0 if d.shadow else d.throttle_ms / 1000)
        elif d.throttle_ms > 0 and not d.shadow:
            conn.mute.mute_for(d.throttle_ms / 1000)
        self.recorder.record(conn, d, 0, None, d.charged_ms, d.shadow)

    # ------------------------------------------------------------------------------------------ the log

    def summarise(self, conn: PolicyConnection) -> None:
        """One decision-log event for a connection's traffic since its last summary (pass-through included)."""
        if self._logging:
            self.recorder.summarise(conn, self._scope(conn), not self.enforce)

    def decision_log_stats(self) -> dict[str, int]:
        out = self.recorder.log_stats()
        out["pid_cache_users"] = self.producer_ids.users()
        out["pid_cache_bytes"] = self.producer_ids.memory_bytes()
        return out

    def close(self) -> None:
        self.recorder.close()
