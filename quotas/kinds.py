"""The catalogue of quota kinds: the one place that says what each kind is, and everything else reads it.

Why: a quota kind's facts were once spread over config validation, the manager, the policy, the metrics, the
decision-log schema and the Spark job, each with its own table; adding a kind touched ten files and nothing
failed if one was forgotten. Here each kind states its Kafka quota key, its short name (the decision-log
columns ``<name>_value/_limit/_throttle_ms`` and the Spark job's ``kind``), its Kafka metric group, its unit,
which window settings it samples with, how its throttle is computed, what is charged and when, and which APIs
are never charged. A *generic* rate kind (``measure`` set) is charged by the policy and replayed offline with
no code of its own; KIP-599 mutations and KIP-936 producer ids have managers of their own
(:mod:`quotas.token_bucket`, :mod:`quotas.producer_ids`) because what they count needs the cluster or a bloom
filter. Pure data and arithmetic: every layer may read this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final, Literal

from quotas.rate import request_time_to_percent

# Kafka API keys this catalogue speaks of (protocol/apis.py names them all; quotas/ does not import protocol/).
PRODUCE: Final = 0
FETCH: Final = 1
JOIN_GROUP: Final = 11
SYNC_GROUP: Final = 14
DELETE_RECORDS: Final = 21
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
SASL_AUTHENTICATE: Final = 36
CREATE_PARTITIONS: Final = 37
ELECT_LEADERS: Final = 43
DESCRIBE_CLIENT_QUOTAS: Final = 48
ALTER_CLIENT_QUOTAS: Final = 49
SHARE_FETCH: Final = 78
INIT_PRODUCER_ID: Final = 22


@dataclass(frozen=True, slots=True)
class QuotaKind:
    """One kind of quota in the catalogue: what Kafka calls it, what it charges, how it throttles. The quota
    manager, the metrics and the decision log's columns read the kinds from :data:`KINDS`, so a new kind is one
    entry here, not a change in each of them."""

    key: str
    """Kafka's quota key (``kafka-configs --add-config <key>=...``)."""
    name: str
    """Short name: decision-log columns and the Spark job's ``kind``."""
    group: str
    """Kafka's metric group (``kafka.server:type=<group>``)."""
    metric: str
    """Kafka's name of the measured value in that group (``byte-rate``, ``request-time``, ``tokens``...)."""
    unit: str
    """What the limit is counted in, for reports."""
    window: Literal["rate", "controller", "pids"]
    """Which window settings sample it: ``window_*``, ``controller_window_*`` or ``producer_id_window_*``."""
    throttle: Literal["bytes", "request", "per_window", "bucket"]
    """Throttle formula: KIP-13 byte rate, KIP-124 request time (capped at one window), KIP-936 per window
    (capped at one window), KIP-599 token bucket."""
    apis: frozenset[int]
    """APIs charged; empty: every API except :data:`NEVER_CHARGED_APIS`."""
    at: Literal["request", "response"]
    """When it is charged: on the request's arrival or on its response's. ``request_percentage`` is charged on
    arrival, so a client over quota is held before the requests it pipelined behind are read, as a broker
    reading one request at a time holds it; the per-response-byte term of its estimate (where the API has one,
    :func:`has_response_term`) is then the size of the previous response of that API on the connection."""
    measure: Literal["request_bytes", "response_bytes", "thread_time", "requests"] | None
    """What one request charges, for the generic kinds; None for kinds with a manager of their own."""
    logged: str
    """The decision-log column that holds what a request brings to this kind (the Spark job's usage of traffic
    no quota applied to): ``bytes_in``, ``bytes_out``, ``upstream_ms`` (service time), ``requests``..."""
    integral: bool = False
    """Kafka types it as LONG: values must be integral."""
    user_only: bool = False
    """Allowed only on ``<user>`` / ``<default user>`` entities."""
    cluster_wide: bool = False
    """One bucket per entity for the whole cluster even in ``broker`` scope (KRaft's controller holds it)."""
    exempt_replicas: bool = False
    """Requests brokers send each other (replica fetches) are not charged. Only Fetch has replica requests:
    :func:`charged_at` clears the flag for every other API (a ShareFetch's first bytes are no ``replica_id``)."""


PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
CONTROLLER_MUTATION_RATE: Final = "controller_mutation_rate"
PRODUCER_IDS_RATE: Final = "producer_ids_rate"

# fmt: off
# One kind a row: the catalogue reads as a table, one field a line would hide it.
KINDS: Final[tuple[QuotaKind, ...]] = (
    QuotaKind(PRODUCER_BYTE_RATE, "produce", group="Produce", metric="byte-rate", unit="B/s", window="rate",
              throttle="bytes", apis=frozenset({PRODUCE}), at="request", measure="request_bytes", logged="bytes_in",
              integral=True),
    # ShareFetch (KIP-932) too: Kafka's broker records a ShareFetch response's size on the same Fetch quota sensor
    # (KafkaApis.processShareFetchResponse: quotas.fetch.maybeRecordAndGetThrottleTimeMs).
    QuotaKind(CONSUMER_BYTE_RATE, "fetch", group="Fetch", metric="byte-rate", unit="B/s", window="rate",
              throttle="bytes", apis=frozenset({FETCH, SHARE_FETCH}), at="response", measure="response_bytes",
              logged="bytes_out", integral=True,
              exempt_replicas=True),
    QuotaKind(REQUEST_PERCENTAGE, "request", group="Request", metric="request-time", unit="% of a thread",
              window="rate", throttle="request", apis=frozenset(), at="request", measure="thread_time",
              logged="bytes_in"),
    QuotaKind(CONTROLLER_MUTATION_RATE, "mutation", group="ControllerMutation", metric="tokens",
              unit="partitions/s", window="controller", throttle="bucket",
              apis=frozenset({CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS}), at="request", measure=None,
              logged="mutations", cluster_wide=True),
    QuotaKind(PRODUCER_IDS_RATE, "pids", group="ProducerIds", metric="rate", unit="new producer ids per window",
              window="pids", throttle="per_window", apis=frozenset({PRODUCE}), at="request", measure=None,
              logged="new_pids", user_only=True),
)
# fmt: on
"""Every quota kind, in the order of their decision-log columns."""

BY_KEY: Final = {k.key: k for k in KINDS}
BIT: Final[dict[str, int]] = {k.key: 1 << i for i, k in enumerate(KINDS)}
"""Quota key -> its bit in a set of kinds held as an int: a decision's kinds, counted in one slot
(``proxy.stats.Stats.passes``) instead of once per key."""
KIND_SETS: Final = 1 << len(KINDS)
"""How many sets of kinds there are (:data:`BIT` sets run from 0 to this, exclusive)."""
BY_NAME: Final = {k.name: k for k in KINDS}
QUOTA_KEYS: Final = frozenset(BY_KEY)
INTEGRAL_KEYS: Final = frozenset(k.key for k in KINDS if k.integral)
USER_ONLY_KEYS: Final = frozenset(k.key for k in KINDS if k.user_only)
CLUSTER_WIDE_KEYS: Final = frozenset(k.key for k in KINDS if k.cluster_wide)
NAMES: Final = tuple(k.name for k in KINDS)
KIND_KEYS: Final = {k.name: k.key for k in KINDS}
"""Short name -> quota key."""

NEVER_CHARGED_APIS: Final = frozenset(
    {SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS}
)
"""Authentication, version discovery and the quota API itself are never charged to any quota."""

WAITING_APIS: Final = frozenset({PRODUCE, FETCH, JOIN_GROUP, SYNC_GROUP, DELETE_RECORDS, ELECT_LEADERS, SHARE_FETCH})
"""APIs whose upstream time holds a wait (Produce acks=all replication, Fetch max_wait, JoinGroup/SyncGroup
rebalances, ...): a broker leaves that purgatory time out of ``request_percentage``, and so does
:func:`thread_ms` (it never reads the upstream time). Kept for reports that tell waits from work."""

LIST_OFFSETS: Final = 2
METADATA: Final = 3
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
HEARTBEAT: Final = 12

# fmt: off
# api key -> (base ms, ms per KiB of request, ms per KiB of response): the broker thread time (network + I/O
# threads) one request costs, estimated from what the proxy sees. Why not the upstream time: a broker's
# request-time sensor counts thread time only, which on the calibration machine was a third to a quarter of the
# upstream round trip (queues, the loopback hop, the proxy's own reads) and none of a Produce acks=all or a Fetch
# max_wait, so wall time over-charged quick APIs by 3-4x and charged nothing where the flooders live.
# The bases of Produce, Fetch and ListOffsets, and the two terms below, were calibrated against the brokers' own
# enforcement (bench/request_quota.py: the same client under the same P, brokers vs proxy; BENCHMARKS.md run 8).
# Each was scaled by the median proxy / broker rate of its workloads measured over 48-s phases: the brokers hold a
# flooder in ~11-s cycles (a burst, then about a request a second at the 1-s throttle cap), so the 12-s phases of
# runs 4-7 caught one burst or two and read their rate 1.3-2 x high, more so a fresh client's first burst; the
# bases fitted to them were too low by 1.5-2.6 x. Produce's base sits between the librdkafka (x 1.80) and Java
# (x 2.64) linger-0 producers, whom the brokers charge differently for requests the proxy cannot tell apart. The
# other per-KiB terms are not calibrated. Fetch's response bytes beyond the head are mostly record data sent by
# sendfile: cheap per KiB.
THREAD_COST_MS: Final[dict[int, tuple[float, float, float]]] = {
    PRODUCE:          (0.048, 0.003, 0.0),
    FETCH:            (0.050, 0.002, 0.0005),
    LIST_OFFSETS:     (0.046, 0.002, 0.002),
    METADATA:         (0.025, 0.002, 0.005),
    OFFSET_COMMIT:    (0.030, 0.002, 0.002),
    OFFSET_FETCH:     (0.025, 0.002, 0.002),
    FIND_COORDINATOR: (0.020, 0.002, 0.002),
    HEARTBEAT:        (0.020, 0.002, 0.002),
    JOIN_GROUP:       (0.030, 0.002, 0.002),
    SYNC_GROUP:       (0.030, 0.002, 0.002),
}
# fmt: on
FETCH_HEAD_BYTES: Final = 1024
FETCH_HEAD_MS_PER_KIB: Final = 0.17
"""A Fetch's response term is steep over the :data:`FETCH_HEAD_BYTES` after its first :data:`FETCH_BARE_BYTES`
(on top of the row's ``out``): a Fetch that returns record batches costs a broker more than an empty one: finding
and reading the data at all (index lookup, batch headers scanned from the index position, the network thread's
send), which does not keep growing with a large answer's bytes. Its brokers' own request log showed a tailing
consumer's Fetch at 0.02-0.1 ms of handler time (p50) against 0.003 ms an empty one; scaled with the base by run 8's
x 1.7 (BENCHMARKS.md)."""
FETCH_BARE_BYTES: Final = 128
"""What an answer without records takes before the head term starts: a one- or two-partition empty Fetch answer is
68-110 bytes (librdkafka's v16 answer for one partition 68, calibrate's v7 probe with a 33-character topic name
99). Counted from byte 0, the head's slope made those few header bytes a third of an empty Fetch's cost, so a
consumer's v16 Fetch was charged 30 % less than the calibrated probe's and the proxy let two no-wait consumers 1.38
x the requests the brokers did (issue 50, run 11). Bytes of an empty answer are headers, not data the broker read;
the empty Fetch's cost is its base. (The built-in base rose from 0.036 to 0.050 ms with it: what a ~90-byte answer
was charged before.)"""
PRODUCE_ACKS_ALL_MS: Final = 0.35
"""Added to an acks=-1 Produce. A broker completes, on the producer's request thread, the delayed Fetch of each
follower the append unblocked (ReplicaManager.addCompletePurgatoryAction, run by KafkaApis.handle's
tryCompleteActions before the request's thread time is stamped). Run 8's brokers charged a librdkafka acks=all
Produce to an RF-2 partition ~0.4-0.56 ms at load 2-3 (~0.15 ms at load 1 in run 7d, over 12-s phases, so
likely low); the term puts the whole at ~0.4 ms. The proxy does not know a partition's followers; a
producer asking acks=all almost always has some. (acks=1 to a replicated partition costs the same and is not
charged it; docs/quotas.md.)"""
DEFAULT_THREAD_COST_MS: tuple[float, float, float] = (0.030, 0.002, 0.005)
"""Any API :data:`THREAD_COST_MS` does not name (admin APIs, transactions, ...): not calibrated. Not Final, nor
``_DEFAULT_PERCENT``: mypyc left a Final tuple of floats unset ("value for final name was not set")."""


def fetch_head_bytes(response_bytes: int) -> int:
    """The bytes of a Fetch answer the head term charges: past the bare :data:`FETCH_BARE_BYTES`, at most
    :data:`FETCH_HEAD_BYTES`."""
    head = response_bytes - FETCH_BARE_BYTES
    return 0 if head <= 0 else (head if head < FETCH_HEAD_BYTES else FETCH_HEAD_BYTES)


Cost = tuple[float, float, float]
"""(base ms, ms per KiB of request, ms per KiB of response): one API's row of the cost table."""


def _percent_per_byte(c: Cost) -> Cost:
    return (request_time_to_percent(c[0]), request_time_to_percent(c[1] / 1024), request_time_to_percent(c[2] / 1024))


class RequestCosts:
    """What each request costs a broker's threads (KIP-124's ``request_percentage`` charge): the built-in table
    (:data:`BUILTIN_COSTS`, fitted to one host's brokers), or the cluster's own, measured against its brokers'
    enforcement (docs/quotas.md) and written in the configuration (``quotas.request_costs``). Why a table an
    operator can replace: a broker's charge is its threads' time, which depends on its hardware, load, version and
    configuration; on another host of the same kind the brokers charged about half what this table says (issue 50).

    The figures are kept both in ms (what an operator reads and writes) and in percent-seconds per request and per
    byte (what the charge path adds up, a list slot by api key: no dict, no default, per request)."""

    __slots__ = ("by_api", "default", "fetch_head_ms_per_kib", "replicated_ms", "source", "alone", "_percent",
                 "_default", "_fetch_head", "_replicated", "_alone")  # fmt: skip

    def __init__(
        self,
        by_api: dict[int, Cost],
        default: Cost,
        fetch_head_ms_per_kib: float,
        replicated_ms: float,
        source: str,
        alone: dict[int, float] | None = None,
    ) -> None:
        self.by_api = dict(by_api)
        self.default = default
        """Any API :attr:`by_api` does not name."""
        self.alone = dict(alone or {})
        """API key -> its base (ms) for a request sent *alone*: nothing else of its connection awaits an answer, as a
        consumer's Fetch (one a broker at a time) or a request/response loop sends them. The brokers hold such a
        client to about half the requests of a pipelining one under the same ``request_percentage`` (a fresh
        3-broker cluster, 2026-12-07: an empty Fetch v12 one at a time 0.044 and 0.037 ms a request, sixteen in
        flight 0.018-0.025 ms, whatever its version or isolation level), so one base cannot hold both kinds of
        client within 0.7-1.3 of the brokers (issue 50: the no-wait consumers read 1.18-1.45). An API not named here
        charges its :attr:`by_api` base either way (the built-in table names none: it was fitted to pipelining
        clients)."""
        self.fetch_head_ms_per_kib = fetch_head_ms_per_kib
        """Fetch's steep :data:`FETCH_HEAD_BYTES` of response after its bare :data:`FETCH_BARE_BYTES`
        (:data:`FETCH_HEAD_MS_PER_KIB`)."""
        self.replicated_ms = replicated_ms
        """Added to a Produce whose acks wait for the followers (acks=-1: :data:`PRODUCE_ACKS_ALL_MS`)."""
        self.source = source
        """Where the figures come from (``built-in``, or what the configuration says): ``check-config`` prints it."""
        self._default = _percent_per_byte(default)
        top = max(self.by_api) + 1 if self.by_api else 0
        self._percent = [_percent_per_byte(self.by_api.get(key, default)) for key in range(top)]
        self._fetch_head = request_time_to_percent(fetch_head_ms_per_kib / 1024)
        self._replicated = request_time_to_percent(replicated_ms)
        self._alone = [0.0] * top
        """:attr:`alone` by api key, in percent-seconds more than the pipelined base (0: the same), read per
        request alone."""
        for key, base in self.alone.items():
            if 0 <= key < top:
                self._alone[key] = request_time_to_percent(base) - self._percent[key][0]

    def scaled(
        self,
        scale: float,
        rows: dict[int, Cost],
        replicated_ms: float | None,
        fetch_head_ms_per_kib: float | None,
        source: str,
        alone: dict[int, float] | None = None,
    ) -> RequestCosts:
        """This table with every row and term times ``scale``, then ``rows`` (api key -> row) in place of theirs, the
        two terms where given, and ``alone`` (api key -> the base of a request sent alone, :attr:`alone`): what
        ``quotas.request_costs`` and a calibration both make of the built-in table."""
        by_api = {k: (b * scale, i * scale, o * scale) for k, (b, i, o) in self.by_api.items()}
        by_api.update(rows)
        d = self.default
        return RequestCosts(
            by_api,
            (d[0] * scale, d[1] * scale, d[2] * scale),
            self.fetch_head_ms_per_kib * scale if fetch_head_ms_per_kib is None else fetch_head_ms_per_kib,
            self.replicated_ms * scale if replicated_ms is None else replicated_ms,
            source,
            alone,
        )

    def cost(self, api_key: int) -> Cost:
        return self.by_api.get(api_key, self.default)

    def thread_ms(self, api_key: int, request_bytes: int, response_bytes: int) -> float:
        """Estimated broker thread time (ms) one request of API ``api_key`` costs: a fixed cost per API plus terms
        per KiB of request and of response. O(1) from figures the proxy has at the response; no clock read, so a
        wait (acks=all, max_wait, a rebalance) is never charged and the log replays it exactly."""
        c = self.cost(api_key)
        ms = c[0] + (c[1] * request_bytes + c[2] * response_bytes) / 1024
        if api_key == FETCH:
            ms += self.fetch_head_ms_per_kib * fetch_head_bytes(response_bytes) / 1024
        return ms

    def thread_percent(self, api_key: int, request_bytes: int, response_bytes: int) -> float:
        """:meth:`thread_ms` in percent-seconds of one thread (:func:`quotas.rate.request_time_to_percent`): what
        ``request_percentage`` records for one request."""
        pct = self._percent
        c = pct[api_key] if 0 <= api_key < len(pct) else self._default
        a = c[0] + c[1] * request_bytes + c[2] * response_bytes
        if api_key == FETCH:
            a += self._fetch_head * fetch_head_bytes(response_bytes)
        return a

    def request_percent(
        self,
        api_key: int,
        request_bytes: int,
        last_response_bytes: int,
        acks: int = 1,
        replication: int = -1,
        alone: bool = False,
    ) -> float:
        """What ``request_percentage`` records for one request when it arrives (percent-seconds of one thread):
        :meth:`thread_percent` of its size and of the last response of that API on the connection. A Produce's
        ``acks`` (the policy reads it through the session; quotas/ reads no wire): 0 charges nothing, as a broker
        records an acks=0 Produce exempt from the request quota (``KafkaApis.handleProduceRequest``:
        ``sendNoOpResponseExemptThrottle``). Its ``replication``, the largest replication factor of the topics it
        writes to (-1: not known), says whether it adds :attr:`replicated_ms`: a broker completes, on the producer's
        thread, the fetches of the followers the append unblocked, with acks 1 and -1 alike; not known, only an
        acks=-1 Produce is taken to have followers. ``alone``: nothing else of its connection awaits an answer; the
        API's :attr:`alone` base replaces its pipelined one where the table has one."""
        if api_key == PRODUCE and acks == 0:
            return 0.0
        a = self.thread_percent(api_key, request_bytes, last_response_bytes)
        if alone:
            extra = self._alone
            if 0 <= api_key < len(extra):
                a += extra[api_key]
        if api_key == PRODUCE and (replication >= 2 or (replication < 0 and acks == -1)):
            return a + self._replicated
        return a

    def has_response_term(self, api_key: int) -> bool:
        """Whether :meth:`thread_percent` of this API grows with the response (Produce's does not: its response is
        a few bytes an acknowledged partition, so nothing is charged at its response)."""
        pct = self._percent
        c = pct[api_key] if 0 <= api_key < len(pct) else self._default
        return c[2] > 0 or (api_key == FETCH and self._fetch_head > 0)


BUILTIN_COSTS: Final = RequestCosts(
    THREAD_COST_MS, DEFAULT_THREAD_COST_MS, FETCH_HEAD_MS_PER_KIB, PRODUCE_ACKS_ALL_MS, "built-in"
)
"""The table above: the default until ``quotas.request_costs`` gives the cluster's own."""


def thread_ms(api_key: int, request_bytes: int, response_bytes: int) -> float:
    """:meth:`RequestCosts.thread_ms` of the built-in table."""
    return BUILTIN_COSTS.thread_ms(api_key, request_bytes, response_bytes)


def thread_percent(api_key: int, request_bytes: int, response_bytes: int) -> float:
    """:meth:`RequestCosts.thread_percent` of the built-in table."""
    return BUILTIN_COSTS.thread_percent(api_key, request_bytes, response_bytes)


def request_percent(
    api_key: int, request_bytes: int, last_response_bytes: int, acks: int = 1, replication: int = -1
) -> float:
    """:meth:`RequestCosts.request_percent` of the built-in table."""
    return BUILTIN_COSTS.request_percent(api_key, request_bytes, last_response_bytes, acks, replication)


def has_response_term(api_key: int) -> bool:
    """:meth:`RequestCosts.has_response_term` of the built-in table."""
    return BUILTIN_COSTS.has_response_term(api_key)


REPLICA_APIS: Final = frozenset({FETCH})
"""The APIs brokers send each other as replicas (and that ``exempt_replicas`` kinds leave uncharged)."""

MUTATION_APIS: Final = BY_KEY[CONTROLLER_MUTATION_RATE].apis
MUTATION_STRICT_SINCE: Final = {CREATE_TOPICS: 6, DELETE_TOPICS: 5, CREATE_PARTITIONS: 3}
"""KIP-599: the first version whose clients understand THROTTLING_QUOTA_EXCEEDED (error 89) per topic; older
versions are admitted whole and muted."""


def keys_of(kinds: int) -> list[str]:
    """The quota keys of the set ``kinds`` (bits of :data:`BIT`), in catalogue order."""
    return [k.key for i, k in enumerate(KINDS) if kinds >> i & 1]


def mutation_is_strict(api_key: int, api_version: int) -> bool:
    """Whether this mutation request may get per-topic THROTTLING_QUOTA_EXCEEDED answers (and so be split)."""
    since = MUTATION_STRICT_SINCE.get(api_key)
    return since is not None and api_version >= since


@lru_cache(maxsize=4096)  # api keys come from clients: bounded, least recently used first
def charged_at(key: int, at: str, active: frozenset[str]) -> tuple[QuotaKind, ...]:
    """The generic kinds among ``active`` keys that charge API ``key`` at ``at`` ("request" or "response")."""
    if key in NEVER_CHARGED_APIS:
        return ()
    kinds = (
        k for k in KINDS if k.measure is not None and k.at == at and k.key in active and (not k.apis or key in k.apis)
    )
    if key in REPLICA_APIS:
        return tuple(kinds)
    # Why: the policy reads a replica id from the request of any API charged to an exempting kind; ShareFetch
    # (charged to consumer_byte_rate) starts with a group id, which would read as a broker's id and be exempted.
    return tuple(replace(k, exempt_replicas=False) if k.exempt_replicas else k for k in kinds)


Basis = Literal["request_bytes", "response_bytes", "thread_time", "requests"]


def basis(kind: QuotaKind, api_key: int) -> Basis:
    """What a request of API ``api_key`` is charged to generic ``kind`` from: the kind's measure. Fixed per
    (kind, API), so the policy works it out once and :func:`amount` applies it per request."""
    measure = kind.measure
    if measure is None:
        raise ValueError(f"{kind.key} is not a generic kind: it has a manager of its own")
    return measure


def amount(kind: QuotaKind, api_key: int, request_bytes: int = 0, response_bytes: int = 0) -> float:
    """What one request of API ``api_key`` charges a generic ``kind``: the same figure live and in replay."""
    return amount_from(basis(kind, api_key), request_bytes, response_bytes, api_key)


def amount_from(
    b: Basis, request_bytes: int = 0, response_bytes: int = 0, api_key: int = -1, costs: RequestCosts = BUILTIN_COSTS
) -> float:
    """:func:`amount` for a :func:`basis` already worked out (``costs``: the request-cost table in force)."""
    if b == "request_bytes":
        return request_bytes
    if b == "response_bytes":
        return response_bytes
    if b == "requests":
        return 1
    return costs.thread_percent(api_key, request_bytes, response_bytes)
