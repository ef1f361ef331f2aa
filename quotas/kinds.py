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
    """When it is charged: on the request's arrival or on its response's."""
    measure: Literal["request_bytes", "response_bytes", "service_time", "requests"] | None
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
              window="rate", throttle="request", apis=frozenset(), at="response", measure="service_time",
              logged="upstream_ms"),
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
"""APIs whose upstream time is a wait the client asked for (Produce acks=all replication, Fetch max_wait,
JoinGroup/SyncGroup rebalances, ...): charged no service time to ``request_percentage``."""

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


Basis = Literal["request_bytes", "response_bytes", "service_time", "requests", "nothing"]


def basis(kind: QuotaKind, api_key: int) -> Basis:
    """What a request of API ``api_key`` is charged to generic ``kind`` from: the kind's measure, except that a
    wait the client asked for is no load (``service_time`` of a :data:`WAITING_APIS` request is ``nothing``).
    Fixed per (kind, API), so the policy works it out once and :func:`amount` applies it per request."""
    measure = kind.measure
    if measure is None:
        raise ValueError(f"{kind.key} is not a generic kind: it has a manager of its own")
    if measure == "service_time" and api_key in WAITING_APIS:
        return "nothing"
    return measure


def amount(
    kind: QuotaKind, api_key: int, request_bytes: int = 0, response_bytes: int = 0, service_ms: float = 0.0
) -> float:
    """What one request of API ``api_key`` charges a generic ``kind``: the same figure live and in replay."""
    return amount_from(basis(kind, api_key), request_bytes, response_bytes, service_ms)


def amount_from(b: Basis, request_bytes: int = 0, response_bytes: int = 0, service_ms: float = 0.0) -> float:
    """:func:`amount` for a :func:`basis` already worked out."""
    if b == "request_bytes":
        return request_bytes
    if b == "response_bytes":
        return response_bytes
    if b == "requests":
        return 1
    if b == "nothing":
        return 0.0
    return request_time_to_percent(service_ms)  # Kafka records request time as a percentage of one thread
