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
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
import uuid
from collections.abc import Callable
from typing import Final, NamedTuple, TypeAlias

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from config.load import ConfigError
from config.model import ProxyConfig
from config.quota_sources import QuotaSources
from mute import KeyedHolds
from protocol import mutations, throttle_field
from protocol.apis import Api, api_label, decode_body, response_header_is_flexible
from protocol.errors import ProtocolViolation
from protocol.headers import RequestHeader, encode_response_header, response_body_offset
from protocol.inflight import Pending
from protocol.record_batches import (
    NO_PRODUCER_ID,
    RecordBatchError,
    Shape,
    producer_ids_and_shape,
    single_producer_id,
)
from protocol.text import printable
from protocol.topic_guard import ProtectedTopics, Refusal
from protocol.topic_guard import check as check_topics
from proxy import client_quota_api
from proxy.stats import Stats
from proxy.topic_counts import RecentTopics
from proxy.verdicts import Answer, Defer, Identity, PolicyConnection, Replace
from quotas.connections import IpQuotas
from quotas.decision_events import request_event, summary_event
from quotas.entities import QuotaStore
from quotas.fleet_reports import FleetLedger
from quotas.kinds import (
    BIT,
    CONTROLLER_MUTATION_RATE,
    MUTATION_APIS,
    NEVER_CHARGED_APIS,
    PRODUCER_IDS_RATE,
    Basis,
    QuotaKind,
    amount_from,
    basis,
    charged_at,
    has_response_term,
    keys_of,
    thread_percent,
)
from quotas.manager import Bound, QuotaManager, Windows
from quotas.producer_ids import ProducerIdQuotaConfig, ProducerIdTracker
from quotas.throttle import MAX_THROTTLE_MS, combine

log = logging.getLogger(__name__)

Buffer: TypeAlias = bytes | bytearray | memoryview
"""A request frame as the connection hands it on (``protocol.frames.FrameReader``)."""

_SIZE: Final = struct.Struct(">i")
_I32: Final = struct.Struct(">i")
_METADATA_VERSION = 12
_PROBE_CREATE_VERSION = 5  # the first CreateTopics version whose answer says how many partitions a topic gets
_NOT_SEEN_YET: Final = frozenset((3, 5, 100))
"""Metadata errors of a topic a broker may not have learned of yet: UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_ID."""
LAG_RECHECKS_S: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
"""Waits before asking a broker again about a topic to be deleted or grown that it does not know (see
``Policy._current_counts``): 0.75 s in all, the most a delete of a topic that does not exist is held up."""


def _ms(seconds: float) -> int:
    """Monotonic seconds to whole ms, half up. Not ``round()``: compiled, that is a call through the builtins
    module on every charge; this is native. (Half up instead of half even: the clock is never negative, and
    the charges compare times with each other only.)"""
    return int(seconds * 1000 + 0.5)


def local_frame(header: RequestHeader, body: bytes | bytearray) -> bytes:
    """A whole response frame (size prefix, response header, ``body``) answering ``header``. ``body`` may be a
    bytearray (kafka-python encodes into one): compiled, a ``bytes`` parameter would refuse it."""
    head = encode_response_header(
        header.correlation_id, bool(response_header_is_flexible(header.api_key, header.api_version))
    )
    return _SIZE.pack(len(head) + len(body)) + head + body


class _Plan(NamedTuple):
    """What one API is charged, given the quota keys configured (see ``Policy._plan``)."""

    at_request: tuple[QuotaKind, ...]
    at_response: tuple[QuotaKind, ...]
    pids: bool
    mutation: bool
    exempt_replicas: bool
    """Some kind charged at response exempts replica fetches: read the request's replica id."""


_Charged = tuple[QuotaKind, Bound, Basis]
"""(kind, handle, basis): one quota a bound plan charges (typed: compiled, its fields are read natively)."""


class _Bound:
    """One API's :class:`_Plan` bound to one connection's user, client id and scope: the quota handles its
    requests are charged through (see :class:`quotas.manager.Bound`), kept until the manager's stamp moves."""

    __slots__ = (
        "at_request",
        "at_request_kinds",
        "later",
        "later_kinds",
        "later_replica",
        "later_replica_kinds",
        "out_term",
        "pids",
        "plan",
    )

    def __init__(
        self, plan: _Plan, at_request: tuple[_Charged, ...], later: tuple[_Charged, ...], pids: Bound | None
    ) -> None:
        self.plan = plan
        self.at_request = at_request
        """(kind, handle, basis) for every kind charged when the request arrives and applying to this client
        (the basis: what the request is charged from, :func:`quotas.kinds.basis`)."""
        self.later = later
        """(kind, handle, basis) charged when the response arrives."""
        self.later_replica = tuple(khb for khb in later if not khb[0].exempt_replicas)
        """``later`` for a replica fetch."""
        self.at_request_kinds = _kinds(at_request)
        """The kinds of ``at_request`` as a set of ``quotas.kinds.BIT``: what every decision on it notes."""
        self.later_kinds = _kinds(later)
        self.later_replica_kinds = _kinds(self.later_replica)
        self.pids = pids
        self.out_term = False
        """request_percentage is charged and its estimate grows with the response (quotas.kinds.has_response_term):
        the connection keeps this API's last response size for the next request's charge."""


def _kinds(charged: tuple[_Charged, ...]) -> int:
    kinds = 0
    for kind, _h, _how in charged:
        kinds |= BIT[kind.key]
    return kinds


class _PidMemo:
    """The producer id a connection sent last, for whom it was observed, and until when (monotonic ms) the KIP-936
    filters know it: a plain class, so the per-request check reads native fields (a tuple's are objects)."""

    __slots__ = ("tracker", "user", "scope", "pid", "until")

    def __init__(self, tracker: ProducerIdTracker, user: str, scope: str, pid: int, until: int) -> None:
        self.tracker = tracker
        self.user = user
        self.scope = scope
        self.pid = pid
        self.until = until


class _ConnState:
    """What the policy keeps per connection (``PolicyConnection.policy_state``)."""

    __slots__ = (
        "identity",
        "last",
        "last_client_id",
        "last_key",
        "last_out",
        "pid_memo",
        "produce_shape",
        "scope",
        "stamp",
        "user",
    )

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        """The connection's identity (one object for its life): its principal is read from here, one lookup
        where ``conn.identity.principal`` was two."""
        self.stamp = -1
        self.user = ""
        self.scope = ""
        self.last_key = -1
        self.last_client_id = ""
        self.last: _Bound | None = None
        """The API key and client id of the last request that had a plan, and its bound plan (None: no quota
        applies to that client): valid while ``stamp`` and ``user`` are current. The one memo of the charging
        path. A producer sends one API with one client id, request after request, and a consumer mostly Fetch, so
        the decision finds its handles here; a request of another API binds its plan again (a few lookups in the
        manager's tables), which clients do seconds apart (metadata, heartbeats, commits)."""
        self.pid_memo: _PidMemo | None = None
        """The last producer id seen and until when the filters know it."""
        self.last_out: dict[int, int] = {}
        """API key -> the size of its last response on this connection, for APIs whose request_percentage estimate
        has a response term (Fetch, Metadata, ...; never Produce): charged with the next request of that API."""
        self.produce_shape: Shape | None = None
        """The skeleton of the last Produce request (protocol.record_batches.Shape), to read the next one's id."""


_PIDS_BIT: Final = BIT[PRODUCER_IDS_RATE]
_MUTATION_BIT: Final = BIT[CONTROLLER_MUTATION_RATE]


class Decision:
    """What the policy decided for one request, carried to its response."""

    __slots__ = (
        "user",
        "client_id",
        "scope",
        "state",
        "throttle_ms",
        "later",
        "later_kinds",
        "merge",
        "values",
        "noted",
        "mutations",
        "rejected",
        "new_pids",
        "bytes_in",
        "api_key",
        "api_version",
        "charged_ms",
        "holds",
        "topic_partitions",
        "paced_ms",
        "out_term",
    )

    def __init__(
        self, state: _ConnState, client_id: str, header: RequestHeader, bytes_in: int, keep_values: bool
    ) -> None:
        self.state = state
        """The connection's policy state (read natively at the response; the connection's own fields are not)."""
        user, scope = state.user, state.scope
        self.user = user
        self.client_id = client_id
        self.scope = scope
        self.api_key = header.api_key
        self.api_version = header.api_version
        self.bytes_in = bytes_in
        self.charged_ms = 0
        """The clock value (monotonic ms) the request-time charges used, for an exact replay of the log."""
        self.topic_partitions: list[int] | None = None
        self.throttle_ms = 0
        self.later: tuple[_Charged, ...] = ()
        """(kind, handle, basis) charged when the response arrives (response bytes, service time)."""
        self.merge: Callable[[memoryview], bytes | bytearray] | None = None
        self.values: dict[str, tuple[float, float, int]] | None = {} if keep_values else None
        """quota key -> (amount recorded, limit, throttle): the decision log's, kept only while it is on
        (``Policy.keep_values``); without it a decision allocates no dict (a request's kinds are :attr:`noted`)."""
        self.noted = 0
        """The keys of ``values`` as a set of ``quotas.kinds.BIT``, for counting the decision per kind (the
        bound plan's sets, or'ed in by the caller of :meth:`note`)."""
        self.later_kinds = 0
        """The kinds of ``later``: noted when the response comes."""
        self.holds = False
        """The connection's reads are held until this request's throttle is served (ChannelMute.hold, then served)."""
        self.mutations = 0
        self.rejected = 0
        self.new_pids = 0
        self.out_term = False
        """Its response's size is kept for the next request's request_percentage charge (``_ConnState.last_out``)."""
        self.paced_ms = 0
        """Smooth enforcement: how long the request was held before it went to the broker (its throttle, served
        before the broker saw it, so nothing of it is left for the response)."""

    def note(self, key: str, amount: float, limit: float, throttle_ms: int) -> None:
        if self.values is not None:
            self.values[key] = (amount, limit, throttle_ms)
        if throttle_ms > self.throttle_ms:  # quotas.throttle.combine, inlined: called on every charge
            self.throttle_ms = throttle_ms if throttle_ms < MAX_THROTTLE_MS else MAX_THROTTLE_MS


Verdict: TypeAlias = "Decision | Replace | Answer | Defer | None"
"""Everything :meth:`Policy.on_request` may return (``proxy.verdicts``): the one type the connection executes."""


class Policy:
    def __init__(self, config: ProxyConfig, stats: Stats, clock: Callable[[], float] = time.monotonic) -> None:
        self.stats = stats
        self._clock = clock
        """Monotonic seconds; injected so a test can drive every time-dependent decision."""
        self.store = QuotaStore()
        self.sources = QuotaSources(self.store, config.quotas.state_file)
        self.ip_quotas = IpQuotas()
        """KIP-612 connection_creation_rate per ip: the file's limits.ip_connection_creation_rate, then the API's."""
        self.quotas = QuotaManager(self.store)
        self._keys: frozenset[str] = frozenset()
        self._keys_generation = -1
        self._plans: dict[int, _Plan | None] = {}
        self._plans_generation = -1
        self.producer_ids: ProducerIdTracker  # set by reload()
        self.decision_log = _open_decision_log(config)
        self.keep_values = self.decision_log is not None
        """Decisions keep what each quota recorded (:attr:`Decision.values`): the decision log writes it."""
        self._epoch_offset_ms = round(time.time() * 1000) - self._now_ms()
        self._pid_holds = KeyedHolds()
        """user -> monotonic time before which that user's Produce/InitProducerId requests wait (KIP-936)."""
        own = frozenset(n for n in (config.decision_log.topic,) if n)
        self.guard: ProtectedTopics | None = ProtectedTopics(own) if config.fleet.name or own else None
        """The proxy's own topics (the fleet's, the decision log's), refused to every client; None while it keeps
        none on the cluster, so a request pays one attribute read for it. Fixed at start, like the topics it
        protects (``decision_log`` and ``fleet`` are restart-only: config.reload)."""
        if config.quotas.scope == "fleet":  # in or out of fleet is restart-only too: the fleet's sync starts once
            self.quotas.ledger = FleetLedger()
        self._guard_logged = [0.0, 0]  # [last line (monotonic s), refusals since]: one line per 10 s at most
        self.recent_topics = RecentTopics()
        """Partition counts the cluster answered this proxy's mutations with, newer than brokers' metadata."""
        self.lag_rechecks_s: tuple[float, ...] = LAG_RECHECKS_S
        """Waits before asking again about a topic the client's broker does not know (``_current_counts``)."""
        self.reload(config)

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
        self.pid_hold_max_ms = qc.producer_id_hold_max_ms
        pid_config = ProducerIdQuotaConfig(
            qc.producer_id_window_num, round(qc.producer_id_window_size_seconds), qc.producer_id_cleanup_interval_ms
        )
        if getattr(self, "producer_ids", None) is None or self.producer_ids.config != pid_config:
            self.producer_ids = ProducerIdTracker(pid_config)
        self.smooth = qc.enforcement == "smooth"
        self.quotas.configure(
            Windows.from_settings(qc.model_dump()),
            round(qc.entity_idle_seconds * 1000),
            qc.max_tracked_buckets,
            qc.smooth_burst_seconds if self.smooth else None,
        )

    def _active_keys(self) -> frozenset[str]:
        stamp = self.quotas.stamp()  # moves with every change of the store's quotas (and a little more often)
        if self._keys_generation != stamp:
            self._keys = frozenset(k for quotas in self.store.entities().values() for k in quotas)
            self._keys_generation = stamp
        return self._keys

    def _now_ms(self) -> int:
        return _ms(self._clock())

    def now_ms(self) -> int:
        """The policy's clock in ms: what anything recording into its quota state (the fleet) must use."""
        return _ms(self._clock())

    def upkeep(self) -> None:
        if self.sources.refresh():  # a sibling worker altered quotas through its AlterClientQuotas
            log.info(
                "quotas.state_file %s changed (altered through another worker); now in force", self.sources.state_file
            )
        now_ms = self._now_ms()
        self.quotas.expire(now_ms)
        self.producer_ids.cleanup(now_ms)
        self._pid_holds.expire(now_ms / 1000)

    def quota_samples(self):
        return list(self.quotas.samples(self._now_ms(), self.config.metrics.max_entity_series))

    def _scope(self, conn: PolicyConnection) -> str:
        if self.cluster_scope:
            return ""
        if conn.label != "bootstrap":
            return conn.label  # "broker N": one bucket per broker, however the client reached it
        host, port = conn.upstream_addr or ("?", 0)
        return f"{host}:{port}"

    # ------------------------------------------------------------------------------------------ requests

    def on_request(self, conn: PolicyConnection, header: RequestHeader, frame: Buffer, now: float) -> Verdict:
        """Decide on one request: ``frame`` is the whole request frame, size prefix included (``bytes`` for all
        but large ones: the producer-id memo then reads it natively). Views of its body are made only where a
        body is walked: the usual request, charged by its size, needs none, and making them cost more than the
        rest of the plain path (docs/performance.md)."""
        key = header.api_key
        guard = self.guard
        if guard is not None and guard.may_name(key, frame, header):
            refusal = self._refusal(conn, header, frame, guard)
            if refusal is not None:
                return self._refuse(conn, header, frame, refusal, now)
        if key == Api.DESCRIBE_CLIENT_QUOTAS or key == Api.ALTER_CLIENT_QUOTAS:
            return self._client_quotas(conn, header, memoryview(frame)[4:])
        if self._pid_holds and (key == Api.PRODUCE or key == Api.INIT_PRODUCER_ID):
            wait = self._pid_holds.remaining(conn.identity.principal, now)
            if wait > 0 and self.enforce:
                return self._hold(conn, header, frame, wait)
        return self._decide(conn, header, frame, now)

    # ------------------------------------------------------------------------------------------ own topics

    def _refusal(
        self, conn: PolicyConnection, header: RequestHeader, frame: Buffer, guard: ProtectedTopics
    ) -> Refusal | None:
        """The request names a protected topic (``protocol.topic_guard``): counted, and logged at most once per
        10 s with the number refused meanwhile (a client can send one such request after another)."""
        if header.body_offset is None:
            return None
        refusal = check_topics(guard, header.api_key, header.api_version, memoryview(frame)[4 + header.body_offset :])
        if refusal is None:
            return None
        self.stats.protected_refusals[api_label(header.api_key)] += 1
        logged = self._guard_logged
        logged[1] += 1
        now = time.monotonic()
        if now - logged[0] >= 10:
            more = f" ({logged[1] - 1} more refused since the last such line)" if logged[1] > 1 else ""
            log.warning(
                "%s: refused %s v%d by %s naming the proxy's own topic(s) %s%s",
                conn.peer,
                api_label(header.api_key),
                header.api_version,
                printable(conn.identity.principal),
                printable(", ".join(refusal.topics[:3])),
                more,
            )
            logged[0], logged[1] = now, 0
        return refusal

    def _refuse(
        self, conn: PolicyConnection, header: RequestHeader, frame: Buffer, refusal: Refusal, now: float
    ) -> Verdict:
        """Answer the protected topics' refusal here, or forward the rest of the request (charged as what it
        became) and merge the refusal into whatever answers it: the broker, or the policy itself."""
        if refusal.answer is not None:
            return Answer(None, local_frame(header, refusal.answer))
        assert refusal.forward is not None and refusal.merge is not None and header.body_offset is not None
        head = bytes(memoryview(frame)[4 : 4 + header.body_offset])
        stripped = _SIZE.pack(len(head) + len(refusal.forward)) + head + refusal.forward
        return self._merged(conn, header, self._decide(conn, header, stripped, now), stripped, refusal.merge)

    def _merged(
        self,
        conn: PolicyConnection,
        header: RequestHeader,
        verdict: Verdict,
        frame: bytes,
        merge: Callable[[memoryview], bytes],
    ) -> Verdict:
        """``verdict`` (for the stripped request ``frame``) with ``merge`` applied to its answer."""
        if type(verdict) is Defer:
            inner = verdict.decide
            return Defer(lambda: self._merged_later(conn, header, inner, frame, merge), wait_s=verdict.wait_s)
        if type(verdict) is Answer:
            body = memoryview(verdict.frame)[4:]
            body = body[response_body_offset(body, header.api_key, header.api_version) :]
            return Answer(verdict.decision, local_frame(header, merge(body)))
        if type(verdict) is Replace:
            d: Decision = verdict.decision
            _add_merge(d, merge)
            return Replace(d, verdict.frame, whole=True)
        if verdict is None:
            st = conn.policy_state
            if st is None:
                st = conn.policy_state = _ConnState(conn.identity)
            verdict = Decision(st, header.client_id or "", header, len(frame) - 4, self.keep_values)
        assert type(verdict) is Decision
        _add_merge(verdict, merge)
        return Replace(verdict, frame, whole=True)

    async def _merged_later(
        self, conn: PolicyConnection, header: RequestHeader, inner, frame: bytes, merge: Callable[[memoryview], bytes]
    ):
        return self._merged(conn, header, await inner(), frame, merge)

    def _hold(self, conn: PolicyConnection, header: RequestHeader, frame: Buffer, wait: float) -> Defer:
        """A method of its own: compiled, a lambda in :meth:`on_request` allocated its closure on every request."""
        held = bytes(frame)  # the client's chunk may be reused before the hold ends
        return Defer(lambda: self._after_hold(conn, header, held), wait_s=wait)

    async def _after_hold(self, conn: PolicyConnection, header: RequestHeader, frame: bytes) -> Verdict:
        """KIP-936 hold: the connection muted the request (and, unread, everything behind it) for the user's
        producer-id throttle; now it is decided as if it had just arrived. The connection stays open."""
        return self._decide(conn, header, frame, self._clock())

    def _plan(self, key: int) -> _Plan | None:
        """What requests of API ``key`` are charged, for the quota keys now configured (kept per API until the
        configuration changes); None when nothing is, so such a request costs a dict lookup and nothing more."""
        active = self._active_keys()
        plans = self._plans
        if self._plans_generation != self._keys_generation:
            plans.clear()
            self._plans_generation = self._keys_generation
        try:
            return plans[key]
        except KeyError:
            pass
        plan = None
        if active and key not in NEVER_CHARGED_APIS:
            plan = _Plan(
                charged_at(key, "request", active),
                charged_at(key, "response", active),
                key == Api.PRODUCE and PRODUCER_IDS_RATE in active,
                key in MUTATION_APIS and CONTROLLER_MUTATION_RATE in active,
                False,
            )
            plan = plan._replace(exempt_replicas=any(k.exempt_replicas for k in plan.at_response))
            if not (plan.at_request or plan.at_response or plan.pids or plan.mutation):
                plan = None
        if len(plans) >= 4096:  # api keys come from clients
            plans.clear()
        plans[key] = plan
        return plan

    def _bind(
        self, conn: PolicyConnection, st: _ConnState, plan: _Plan, key: int, client_id: str, now_ms: int
    ) -> _Bound | None:
        """API ``key``'s plan bound to the connection's principal, client id and scope (None: no quota applies to
        this client); the scope is looked up again when the quotas or the principal changed."""
        q = self.quotas
        user = st.identity.principal
        if st.stamp != q.stamp() or st.user != user:
            st.user, st.scope = user, self._scope(conn)
        scope = st.scope
        at_request = tuple(
            (k, h, basis(k, key))
            for k in plan.at_request
            if (h := q.bind(k.key, user, client_id, scope, now_ms)) is not None
        )
        later = tuple(
            (k, h, basis(k, key))
            for k in plan.at_response
            if (h := q.bind(k.key, user, client_id, scope, now_ms)) is not None
        )
        pids = q.bind(PRODUCER_IDS_RATE, user, client_id, scope, now_ms) if plan.pids else None
        b: _Bound | None = None
        if at_request or later or pids is not None or plan.mutation:  # else no quota applies to this client
            b = _Bound(plan, at_request, later, pids)
            b.out_term = has_response_term(key) and any(how == "thread_time" for _k, _h, how in at_request)
        st.stamp = q.stamp()  # binding may have dropped trackers (the cap): what is bound now is current
        return b

    def _decide(self, conn: PolicyConnection, header: RequestHeader, frame: Buffer, now: float) -> Verdict:
        key = header.api_key
        now_ms = _ms(now)
        client_id = header.client_id or ""
        st: _ConnState | None = conn.policy_state  # the one read of it a request: the rest is native
        b: _Bound | None
        if (
            st is not None
            and st.last_key == key
            and st.stamp == self.quotas.stamp()
            and st.last_client_id == client_id
            and st.user == st.identity.principal
        ):  # as the last request: its plan, bound (see _ConnState.last)
            b = st.last
            if b is None:
                return None
            plan = b.plan
        else:
            p = self._plan(key)
            if p is None:  # no quota configured charges this API: the plain proxy's path, one dict lookup
                return None
            plan = p
            if st is None:
                st = conn.policy_state = _ConnState(conn.identity)
            b = self._bind(conn, st, plan, key, client_id, now_ms)
            st.last_key, st.last_client_id, st.last = key, client_id, b
            if b is None:
                return None
        size = len(frame) - 4  # what a broker's quotas count: the request after its size prefix
        d = Decision(st, client_id, header, size, self.keep_values)
        if self.decision_log is not None:  # it gets its own event: out of the summary (sums count the size prefix)
            conn.traffic.logged_request(size + 4)
        d.charged_ms = now_ms
        quotas = self.quotas
        for kind, h, how in b.at_request:
            # Both branches float: an int | float would be boxed, and unboxed again for each of the two calls below.
            if how == "request_bytes":
                a = float(size)
            elif how == "thread_time":  # request_percentage, decided here: a broker reads nothing behind a throttled
                # request. The response-size term: the last answer of this API on this connection (one charge).
                a = thread_percent(key, size, st.last_out.get(key, 0) if b.out_term else 0)
            else:
                a = amount_from(how, request_bytes=size, api_key=key)
            d.note(kind.key, a, h.limit, quotas.charge(h, a, now_ms))
        d.noted = b.at_request_kinds
        d.out_term = b.out_term
        if plan.exempt_replicas and b.later and _is_replica_fetch(frame, header):
            d.later, d.later_kinds = b.later_replica, b.later_replica_kinds
        else:
            d.later, d.later_kinds = b.later, b.later_kinds
        if self.smooth:
            if d.throttle_ms > 0:  # the pacing wait of the kinds charged now: served before the broker sees it
                d.paced_ms, d.throttle_ms = d.throttle_ms, 0
            elif key == Api.FETCH and d.later:
                capped = self._fetch_cap(d, header, frame, now_ms)
                if capped is not None:
                    return Replace(d, capped)
        if b.pids is not None:
            self._charge_producer_ids(d, b.pids, header, frame, now_ms)
        if d.paced_ms > 0 and self.enforce:
            return Defer(lambda: self._paced(conn, d), wait_s=d.paced_ms / 1000)
        if d.throttle_ms > 0 and self.enforce:  # like a broker, read nothing more until it is served
            d.holds = True
            conn.mute.hold()
        if plan.mutation:
            return self._mutation_request(conn, d, header, memoryview(frame)[4:], now_ms)
        if not (d.noted or d.later):
            return None
        return d

    async def _paced(self, conn: PolicyConnection, d: Decision) -> Verdict:
        """A request held for its pacing wait (smooth enforcement), now affordable: it goes to the broker. A
        throttle of its own (KIP-936) still holds the reads behind it until served, as in ``_decide``."""
        if d.throttle_ms > 0:
            d.holds = True
            conn.mute.hold()
        return d

    def _fetch_cap(self, d: Decision, header: RequestHeader, frame: Buffer, now_ms: int) -> bytes | None:
        """Smooth enforcement: a Fetch asks for at most what the consumer's pacing buckets hold (its
        ``max_bytes``, v3+), so the broker never sends more than the quota allows now; the frame with the lower
        ``max_bytes``, or None when it asks for no more already. A broker still sends a first record batch larger
        than ``max_bytes`` whole, and what overdraws is throttled as in Kafka's mode."""
        version = header.api_version
        if version < 3 or header.body_offset is None or not isinstance(frame, bytes):
            return None
        room: float | None = None
        quotas = self.quotas
        for _kind, h, how in d.later:
            if how == "response_bytes":
                tokens = quotas.pace_tokens(h, now_ms)
                if tokens is not None and (room is None or tokens < room):
                    room = tokens
        if room is None:
            return None
        at = 4 + header.body_offset + (12 if version < 15 else 8)  # replica_id (v0-14), max_wait, min_bytes
        if len(frame) < at + 4:
            return None
        asked = _I32.unpack_from(frame, at)[0]
        cap = int(room) if room >= 1 else 1  # in debt (a batch larger than the last cap): one batch, no more
        if asked <= cap:
            return None
        return frame[:at] + _I32.pack(cap) + frame[at + 4 :]

    def _charge_producer_ids(self, d: Decision, h: Bound, header: RequestHeader, frame: Buffer, now_ms: int) -> None:
        """KIP-936: each producer id new to the user (per broker, as a broker would see it) within the window
        charges producer_ids_rate by one. Ids come from the record-batch headers; the records are not read."""
        assert header.body_offset is not None  # a Produce header always has its body located
        st = d.state
        version, offset = header.api_version, header.body_offset
        pid = None
        if st.produce_shape is not None and isinstance(frame, bytes):  # the skeleton the last one had: no walk
            pid = single_producer_id(frame, 4, version, offset, st.produce_shape)
        if pid is None:
            try:
                pids, st.produce_shape = producer_ids_and_shape(memoryview(frame)[4:], version, offset)
            except RecordBatchError as exc:
                raise ProtocolViolation(f"malformed Produce v{version} record batch: {exc}") from None
            if len(pids) == 1:
                (pid,) = pids
            elif not pids:
                return
        elif pid == NO_PRODUCER_ID:
            return
        tracker = self.producer_ids
        if pid is not None:  # the usual producer: one id, request after request, on one connection
            seen = st.pid_memo
            if (
                seen is not None
                and seen.tracker is tracker
                and seen.pid == pid
                and now_ms < seen.until
                and seen.user == d.user
                and seen.scope == d.scope
            ):
                return  # known to the user's filters until seen.until: asking again would change nothing
            new, until = tracker.observe_until((d.user, d.scope), pid, now_ms)
            st.pid_memo = _PidMemo(tracker, d.user, d.scope, pid, until)
            d.new_pids = int(new)
        else:
            d.new_pids = tracker.observe_many((d.user, d.scope), pids, now_ms)
        if not d.new_pids:
            return
        throttle = self.quotas.charge(h, d.new_pids, now_ms)
        d.note(PRODUCER_IDS_RATE, d.new_pids, h.limit, throttle)
        d.noted |= _PIDS_BIT
        if throttle > 0:
            # Muting one connection does not stop the KIP's misbehaving pattern (a new producer, on new
            # connections, per batch), so the user's next Produce / InitProducerId on ANY connection waits too,
            # up to producer_id_hold_max_ms (kept below client request timeouts).
            self._pid_holds.hold(d.user, now_ms / 1000 + min(throttle, self.pid_hold_max_ms) / 1000)

    def _client_quotas(self, conn: PolicyConnection, header: RequestHeader, body: memoryview) -> Answer:
        version = header.api_version
        if header.api_key == Api.DESCRIBE_CLIENT_QUOTAS:
            reply = client_quota_api.describe(
                self.sources,
                body[header.body_offset :],
                version,
                conn.identity.principal,
                self.describers,
                self.ip_quotas,
            )
        else:
            principal = conn.identity.principal
            reply = client_quota_api.alter(
                self.sources, body[header.body_offset :], version, principal, self.admins, self.ip_quotas
            )
            log.info("%s: AlterClientQuotas v%d by %s", conn.peer, version, printable(principal))
        return Answer(None, local_frame(header, reply))

    # ------------------------------------------------------------------------------------------ KIP-599

    def _mutation_request(
        self, conn: PolicyConnection, d: Decision, header: RequestHeader, body: memoryview, now_ms: int
    ) -> Verdict:
        tracker = self.quotas.mutation_tracker(d.user, d.client_id, d.scope, now_ms)
        if tracker is None:
            return d if d.later else None
        request = mutations.parse_request(header.api_key, header.api_version, body[header.body_offset :])
        if request.validate_only and not self.charge_validate_only:
            return d if d.later else None
        frame_body = body.tobytes()
        return Defer(lambda: self._mutation_decide(conn, d, header, frame_body, request))

    async def _mutation_decide(self, conn: PolicyConnection, d: Decision, header: RequestHeader, body: bytes, request):
        counts = await self._partition_counts(conn, request)
        now_ms = self._now_ms()
        # In shadow mode the same decision is made and recorded, and the request still goes through whole.
        charge = self.quotas.charge_mutations(d.user, d.client_id, d.scope, counts, now_ms, request.splittable)
        if charge is None:  # the quota was removed while we asked
            return d
        d.charged_ms = now_ms
        d.topic_partitions = list(counts)
        admitted, throttle, rejected = charge.admitted, charge.throttle_ms, charge.rejected
        d.mutations = charge.mutations
        d.rejected = len(rejected)
        d.note(CONTROLLER_MUTATION_RATE, d.mutations, charge.limit, throttle)
        d.noted |= _MUTATION_BIT
        if rejected:
            log.info(
                "%s: %s by %s/%s: %d of %d topics over controller_mutation_rate (throttle %d ms)%s",
                conn.peer,
                request.label,
                printable(d.user),
                printable(d.client_id),
                len(rejected),
                len(counts),
                throttle,
                "" if self.enforce else " [shadow: not enforced]",
            )
        if not rejected or not self.enforce:
            if request.validate_only:  # nothing changes on the cluster: nothing to learn from its answer
                return d
            # The answer says what the cluster now has, before the brokers' metadata does: learn it (whole: a
            # merge needs the whole response, never a streamed one).
            d.merge = lambda broker_body: self._learn(request, counts, broker_body)
            return Replace(d, _SIZE.pack(len(body)) + body, whole=True)
        head = body[: header.body_offset]
        if len(rejected) == len(counts):
            return Answer(d, local_frame(header, mutations.reject_all(request, throttle)))
        admitted_idx = [i for i, ok in enumerate(admitted) if ok]
        sub = head + mutations.subset_request(request, admitted_idx)
        d.merge = lambda broker_body: self._learn(
            request, counts, mutations.merge_response(request, broker_body, rejected, throttle)
        )
        return Replace(d, _SIZE.pack(len(sub)) + sub, whole=True)

    def _learn(self, request, counts: list[int], body: Buffer) -> bytes:
        """Keep what the cluster answered it created, grew or deleted (:class:`proxy.topic_counts.RecentTopics`),
        so the next mutation of those topics is charged their real count even before the client's broker has
        caught up with the controller; ``body`` (the response body going to the client) is returned as it is."""
        answer = bytes(body)  # a view of the receive buffer, or the merged answer (bytes already: not copied)
        if request.validate_only:
            return answer
        try:
            results = mutations.parse_results(request.api_key, request.version, answer)
        except ValueError as exc:  # DecodeError: the client gets the answer as it is, the proxy learns nothing
            log.warning("%s answer does not parse, its partition counts are not kept: %s", request.label, exc)
            return answer
        now_ms = self._now_ms()
        recent = self.recent_topics
        recent.expire(now_ms)
        key = request.api_key
        asked = {t.name: i for i, t in enumerate(request.topics) if t.name is not None}
        for r in results:
            if r.error_code != 0:
                continue
            i = asked.get(r.name) if r.name is not None else None
            if key == Api.DELETE_TOPICS:
                recent.deleted(r.name, r.topic_id)
            elif key == Api.CREATE_TOPICS:
                n = r.num_partitions if r.num_partitions > 0 else counts[i] if i is not None else 0
                recent.changed(r.name, r.topic_id, n, now_ms)
            elif i is not None:  # CreatePartitions: the topic now has the count asked for
                recent.changed(r.name, None, request.topics[i].count, now_ms)
        return answer

    async def _partition_counts(self, conn: PolicyConnection, request) -> list[int]:
        """Partitions each topic of the request would create or delete, asked of the cluster on the client's own
        broker link (so its view and its authorisation are the client's)."""
        key = request.api_key
        if key == Api.CREATE_TOPICS:
            unknown = [t for t in request.topics if t.partitions is None]
            defaults: dict[str, int] = {}
            if unknown:
                defaults = await self._default_partitions(conn, unknown)
            return [t.partitions if t.partitions is not None else defaults.get(t.name, 0) for t in request.topics]
        current = await self._current_counts(conn, request.topics)
        if key == Api.CREATE_PARTITIONS:
            return [max(t.count - current.get(t.name, t.count), 0) for t in request.topics]
        return [current.get(t.key, 0) for t in request.topics]

    async def _current_counts(self, conn: PolicyConnection, topics) -> dict:
        """Each topic's current partition count, under its key (name, or id for DeleteTopics v6 by id); a topic
        the cluster does not have is left out.

        A broker's metadata lags the controller's (KRaft applies the metadata log asynchronously): a topic created
        a moment ago may be unknown to the client's broker although the controller will delete it whole, and one
        grown a moment ago may show its old count. So what this proxy saw the cluster answer lately
        (``recent_topics``) counts too: for the same topic id the larger count is the newer (partitions are
        never removed from a topic). A topic neither knows is asked for again after each of
        ``lag_rechecks_s``: it may have been created a moment ago elsewhere (another proxy or worker)."""
        out: dict = {}
        todo = list(topics)
        rechecks = self.lag_rechecks_s
        attempt = 0
        while True:
            md = await self._metadata(conn, todo)
            now_ms = self._now_ms()
            by_name: dict = {}
            by_id: dict = {}
            for mt in md.topics:
                if mt.name is not None:
                    by_name[mt.name] = mt
                if mt.topic_id is not None:
                    by_id[mt.topic_id] = mt
            unseen = []
            for t in todo:
                key = t.key
                mt = by_id.get(key) if isinstance(key, uuid.UUID) else by_name.get(key)
                known = self.recent_topics.get(key, now_ms)
                if mt is not None and mt.error_code == 0:
                    count = len(mt.partitions)
                    if known is not None and (
                        known.topic_id is None or mt.topic_id is None or known.topic_id == mt.topic_id
                    ):
                        count = max(count, known.partitions)
                    out[key] = count
                elif mt is not None and mt.error_code not in _NOT_SEEN_YET:
                    pass  # not authorised, ...: the mutation fails the same way and changes nothing, charged 0
                elif known is not None:
                    out[key] = known.partitions
                else:
                    unseen.append(t)
            if not unseen or attempt >= len(rechecks):
                return out
            await asyncio.sleep(rechecks[attempt])
            attempt += 1
            todo = unseen

    async def _metadata(self, conn: PolicyConnection, topics):
        wanted = [
            MetadataRequest.MetadataRequestTopic(topic_id=getattr(t, "topic_id", None), name=t.name) for t in topics
        ]
        req = MetadataRequest(topics=wanted, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        reply = await conn.ask(Api.METADATA, _METADATA_VERSION, bytes(req.encode(version=_METADATA_VERSION)))
        return decode_body(MetadataResponse, reply, _METADATA_VERSION)

    async def _default_partitions(self, conn: PolicyConnection, topics) -> dict[str, int]:
        """The cluster's default partition count for topics created with -1, by asking it to validate them."""
        probe = CreateTopicsRequest(
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name=t.name, num_partitions=-1, replication_factor=t.replication_factor, assignments=[], configs=[]
                )
                for t in topics
            ],
            timeout_ms=30_000,
            validate_only=True,
        )
        reply = await conn.ask(
            Api.CREATE_TOPICS, _PROBE_CREATE_VERSION, bytes(probe.encode(version=_PROBE_CREATE_VERSION))
        )
        answer = decode_body(CreateTopicsResponse, reply, _PROBE_CREATE_VERSION)
        return {t.name: t.num_partitions for t in answer.topics if t.error_code == 0 and t.num_partitions > 0}

    # ------------------------------------------------------------------------------------------ responses

    def on_response(
        self, conn: PolicyConnection, pending: Pending, frame, now: float, total: int | None = None
    ) -> list | None:
        """``frame`` is the whole response frame, or only its leading bytes when it streams through
        (``total`` is then the frame's full length): throttle_time_ms sits within them (see _may_stream).
        ``now``: monotonic seconds when it was read (the connection reads the clock once a read)."""
        d: Decision = pending.decision
        now_ms = _ms(now)
        size = (total if total is not None else len(frame)) - 4
        if d.out_term:
            last_out = d.state.last_out
            if len(last_out) >= 64 and d.api_key not in last_out:  # api keys come from clients
                last_out.clear()
            last_out[d.api_key] = size
        if d.later:
            quotas = self.quotas
            for kind, h, how in d.later:
                a: float = float(size) if how == "response_bytes" else amount_from(how, d.bytes_in, size, d.api_key)
                d.note(kind.key, a, h.limit, quotas.charge(h, a, now_ms))
            d.noted |= d.later_kinds
        upstream_ms: float | None = None  # the decision log's alone: boxed, it cost a float object a response
        if self.decision_log is not None and pending.local is None:
            upstream_ms = (now - pending.sent_at) * 1000
        throttle = d.throttle_ms
        if d.merge is None and (throttle <= 0 or not self.enforce):  # the usual answer: nothing to rewrite
            if d.holds:
                conn.mute.served(throttle / 1000 if self.enforce else 0)
            self._record(conn, d, size, upstream_ms, now_ms)
            return None
        header = pending.header
        view = memoryview(frame)
        body_start = 4 + response_body_offset(view[4:], header.api_key, header.api_version)
        pieces: list[memoryview | bytes] | None = None
        if d.merge is not None:  # a mutation request: its answer merged with the proxy's rejections, and learnt from
            merged = bytes(view[4:body_start]) + bytes(d.merge(view[body_start:]))
            view = memoryview(_SIZE.pack(len(merged)) + merged)
            pieces = [view]
        if throttle > 0 and self.enforce:
            offset = throttle_field.throttle_offset(header.api_key, header.api_version, view[body_start:])
            if offset is not None:
                at = body_start + offset
                broker = _I32.unpack_from(view, at)[0]
                if throttle > broker:  # the client waits for the longest of all: the broker's and every quota's
                    pieces = [view[:at], _I32.pack(combine(throttle, broker)), view[at + 4 :]]
            if not d.holds:
                conn.mute.mute_for(throttle / 1000)
        if d.holds:
            conn.mute.served(throttle / 1000 if self.enforce else 0)
        self._record(conn, d, size if d.merge is None else len(view) - 4, upstream_ms, now_ms)
        return pieces

    def on_unanswered(self, conn: PolicyConnection, d: Decision) -> None:
        """Produce acks=0: no response will come, so the mute starts now. A broker spends thread time on it all
        the same: ``request_percentage`` is charged for it here, with no response bytes."""
        if d.later:
            quotas = self.quotas
            for kind, h, how in d.later:
                a = 0.0 if how == "response_bytes" else amount_from(how, d.bytes_in, 0, d.api_key)
                d.note(kind.key, a, h.limit, quotas.charge(h, a, d.charged_ms))
            d.noted |= d.later_kinds
        if d.holds:
            conn.mute.served(d.throttle_ms / 1000 if self.enforce else 0)
        elif d.throttle_ms > 0 and self.enforce:
            conn.mute.mute_for(d.throttle_ms / 1000)
        self._record(conn, d, 0, None, d.charged_ms)

    def _record(
        self, conn: PolicyConnection, d: Decision, bytes_out: int, upstream_ms: float | None, now_ms: int
    ) -> None:
        """Count the decision (metrics) and ship it to the decision log."""
        shadow = not self.enforce
        throttle_ms = d.throttle_ms if d.throttle_ms >= d.paced_ms else d.paced_ms
        if not d.rejected and throttle_ms <= 0 and not shadow:  # the usual decision: a pass, counted once for
            self.stats.passes[d.noted].n += 1  # its set of kinds (Stats.passes)
            if self.decision_log is None:
                return
        action = "reject" if d.rejected else "throttle" if throttle_ms > 0 else "pass"
        if action != "pass" or shadow:
            decisions = self.stats.decisions
            for key in keys_of(d.noted):
                decisions[(key, action, shadow)] += 1
        if self.decision_log is None:
            return
        # This request has its own event: the connection's next summary covers only the traffic that met no
        # decision, so summing any column over all events counts each request once.
        conn.traffic.logged_response(bytes_out + 4 if bytes_out else 0)
        off = self._epoch_offset_ms
        self.decision_log.emit(
            request_event(
                ts_ms=now_ms + off,
                req_ts_ms=d.charged_ms + off,
                conn=conn.id,
                user=d.user,
                client_id=d.client_id,
                api_key=d.api_key,
                api_version=d.api_version,
                bytes_in=d.bytes_in,
                bytes_out=bytes_out,
                mutations=d.mutations,
                new_pids=d.new_pids,
                upstream_ms=upstream_ms,
                action=action,
                throttle_ms=throttle_ms,
                shadow=shadow,
                rejected_topics=d.rejected,
                scope=d.scope,
                topic_partitions=d.topic_partitions,
                values=d.values or {},
            )
        )

    def summarise(self, conn: PolicyConnection) -> None:
        """One decision-log event for a connection's traffic since its last summary (pass-through included)."""
        if self.decision_log is None:
            return
        counts = conn.traffic.take()
        if counts is None:
            return
        requests, bytes_in, bytes_out = counts
        self.decision_log.emit(
            summary_event(
                ts_ms=round(time.time() * 1000),
                conn=conn.id,
                user=conn.identity.principal,
                client_id=conn.client_id,
                requests=requests,
                bytes_in=bytes_in,
                bytes_out=bytes_out,
                shadow=not self.enforce,
                scope=self._scope(conn),
            )
        )

    def decision_log_stats(self) -> dict[str, int]:
        out = dict(self.decision_log.stats()) if self.decision_log is not None else {}
        out["pid_cache_users"] = self.producer_ids.users()
        out["pid_cache_bytes"] = self.producer_ids.memory_bytes()
        return out

    def close(self) -> None:
        if self.decision_log is not None:
            self.decision_log.close()


def _open_decision_log(config: ProxyConfig):
    dc = config.decision_log
    if dc.directory is None and dc.topic is None:
        return None
    from proxy.decision_log.topic import TopicSink
    from proxy.decision_log.writer import DecisionLog  # pyarrow is loaded only when the log is on

    member = config.fleet.member if config.fleet.name else None
    instance = dc.instance or member or f"{socket.gethostname()}-{os.getpid()}"
    topic = None
    if dc.topic is not None:
        topic = TopicSink(dc.topic, dc.bootstrap_servers or config.upstream.bootstrap_servers, instance, dc.client)
    try:
        return DecisionLog(
            dc.directory,
            instance,
            topic=topic,
            max_queue=dc.max_queue,
            rotate_seconds=dc.rotate_seconds,
            rotate_bytes=dc.rotate_bytes,
            fmt=dc.format,
        )
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(
            f"decision_log.directory {dc.directory}: cannot write the decision log there ({type(exc).__name__}: {exc})"
        ) from None


def _add_merge(d: Decision, merge: Callable[[memoryview], bytes]) -> None:
    """The response body goes through ``merge`` after whatever merge ``d`` already has (a KIP-599 split)."""
    inner = d.merge
    if inner is None:
        d.merge = merge
    else:
        d.merge = lambda body: merge(memoryview(bytes(inner(body))))


def _is_replica_fetch(frame: Buffer, header: RequestHeader) -> bool:
    """Brokers fetch with their id in ``replica_id`` (v0–14); consumers send -1 (v15+ moved it to a tag)."""
    if header.api_version >= 15 or header.body_offset is None or len(frame) < 4 + header.body_offset + 4:
        return False
    return _I32.unpack_from(frame, 4 + header.body_offset)[0] >= 0
