"""Quota entities, the quota store, and Kafka's precedence / bucket-sharing rules.

Pure policy: no I/O and no clocks. The rate trackers (byte rate, request time, token buckets, producer-id
filters) live elsewhere; this module only answers "which limit applies to this (user, client-id), and which
bucket is it charged to?", and holds the configuration the proxy will later serve through
DescribeClientQuotas (key 48) and AlterClientQuotas (key 49).

Reference: Apache Kafka's ``ClientQuotaManager`` and its ``DefaultQuotaCallback`` (``quotaMetricTags``,
``quotaLimit``), ``ClientQuotaControlManager`` (AlterClientQuotas validation) and ``ClientQuotasImage``
(DescribeClientQuotas filtering). Behaviour is reproduced, code is not copied.

Entities
--------
An entity is a pair (user, client-id) whose components are each a name, :data:`DEFAULT` (Kafka's null entity
name, shown as ``<default>``) or absent (``None``). Names must be non-empty (Kafka rejects an empty user or
client-id entity name), and at least one component must be present. ``ip`` entities (connection-rate quotas)
are not handled here.

Quota keys
----------
Kafka's: ``producer_byte_rate`` and ``consumer_byte_rate`` (KIP-13, bytes/s, must be integral),
``request_percentage`` (KIP-124, % of one thread), ``controller_mutation_rate`` (KIP-599, partitions/s);
plus ``producer_ids_rate`` (KIP-936, new producer ids per second; not in Apache Kafka) which is allowed only on
``<user>`` and ``<default user>`` entities, because KIP-936 keys the producer-id cache by principal only.
Every value must be > 0; byte rates must be integral (a fractional part of at most 1e-6 is tolerated, as Kafka
does) and at most 2**63. One deliberate deviation: NaN and infinities are rejected (Kafka's check lets NaN
through for the double-typed keys, which would silently disable the quota).

Each key is resolved on its own: Kafka runs one quota manager per quota type, each seeing only the entities
that carry its key, so ``<user U>`` with only ``producer_byte_rate`` does not shadow a ``<U, C>`` entity's
``consumer_byte_rate``.

Precedence (first match wins)
-----------------------------
For a request from user ``U`` with client id ``C``::

    1  <user, client-id>                   (U, C)
    2  <user, default client-id>           (U, DEFAULT)
    3  <user>                              (U, -)
    4  <default user, client-id>           (DEFAULT, C)
    5  <default user, default client-id>   (DEFAULT, DEFAULT)
    6  <default user>                      (DEFAULT, -)
    7  <client-id>                         (-, C)
    8  <default client-id>                 (-, DEFAULT)

Sharing: the bucket key
-----------------------
Which requests share one rate tracker is decided by the metric tags Kafka's ``DefaultQuotaCallback`` gives a
client (``quotaMetricTags``); its sensors are keyed by those tags. :class:`BucketKey` is that pair of tags,
``(user, client-id)``, with ``""`` for an unused tag. The user tag is the *sanitized* principal name
(:func:`sanitize_user`), exactly as in Kafka's metrics; the client-id tag is the raw client id::

    level matched                        bucket (user, client-id)   who shares one bucket
    1  <user, client-id>                 (U, C)                     that user with that client id
    2  <user, default client-id>         (U, C)                     nobody: each client id of U has its own
    3  <user>                            (U, "")                    all of U's client ids together
    4  <default user, client-id>         (U, C)                     nobody: each user of C has its own
    5  <default user, default client-id> (U, C)                     nobody: each (user, client id) pair
    6  <default user>                    (U, "")                    all client ids of one user; per user
    7  <client-id>                       ("", C)                    every user of client id C together
    8  <default client-id>               ("", C)                    all users of one client id; per client id

So a default entity never pools its matches: it hands each matching user / client / pair its own bucket with
the default bound. (Kafka's single-level fast path, used while quotas were only ever configured at one entity
shape, yields the same tags whenever a quota applies.)

Empty names (Kafka's quirk, reproduced)
---------------------------------------
Kafka looks the *limit* up again from the tags (``quotaLimit``): both tags set -> levels 1, 2, 4, 5; only the
user tag -> levels 3, 6; only the client-id tag -> levels 7, 8; neither -> unlimited. For non-empty names this is
the same as "first match wins". For an empty client id (the broker turns a null header client id into ``""``,
and so does :meth:`QuotaStore.resolve`) only ``<user>`` and ``<default user>`` can apply; client-id and
``<user, default client-id>``-style quotas never do. An empty user name (impossible for a principal Kafka
builds itself) can be left unlimited by a ``<default user>`` quota. :meth:`QuotaStore.resolve` performs both
steps, so it matches Kafka here too.

Unauthenticated clients
-----------------------
Kafka's principal for an unauthenticated connection (PLAINTEXT, or SSL without client auth) is
``User:ANONYMOUS``; quota lookup uses the principal's *name*, so such clients are user :data:`ANONYMOUS`: they
match a ``<user ANONYMOUS>`` entity and every ``<default user>`` entity, and all of them share one
``<user>`` bucket. Pass the principal name (no ``User:`` prefix) as ``user``.

Fast path
---------
:meth:`QuotaStore.resolve` runs for every request, so results (including "unlimited", ``None``) are cached per
``(user, client_id, key)``. Every effective change to the store bumps :attr:`QuotaStore.generation` and clears
the cache. The cache is bounded (it is cleared when full) because client ids are chosen by clients. Callers that
keep a :class:`Resolved` must resolve again after the generation changes: both the limit and the bucket key can
change (adding a ``<user>`` quota moves ``<U, C>`` traffic from bucket (U, C) to (U, "")); in Kafka that is a
different sensor, i.e. fresh rate state. Not thread-safe; the proxy runs on one event loop.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias

from quotas.kinds import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    INTEGRAL_KEYS,
    PRODUCER_BYTE_RATE,
    PRODUCER_IDS_RATE,
    QUOTA_KEYS,
    REQUEST_PERCENTAGE,
    USER_ONLY_KEYS,
)

__all__ = [
    "ANONYMOUS",
    "CONSUMER_BYTE_RATE",
    "CONTROLLER_MUTATION_RATE",
    "DEFAULT",
    "ENTITY_CLIENT_ID",
    "ENTITY_IP",
    "ENTITY_USER",
    "INTEGRAL_KEYS",
    "PRECEDENCE",
    "PRODUCER_BYTE_RATE",
    "PRODUCER_IDS_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "USER_ONLY_KEYS",
    "BucketKey",
    "EntityName",
    "FilterComponent",
    "Level",
    "MatchType",
    "QuotaEntity",
    "QuotaEntityError",
    "QuotaFilterError",
    "QuotaStore",
    "QuotaValueError",
    "Resolved",
    "UnsupportedEntityTypeError",
    "sanitize_user",
    "validate_quota",
]


class _Default(enum.Enum):
    """Type of the :data:`DEFAULT` sentinel (an enum so type checkers can narrow on it)."""

    DEFAULT = "<default>"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default.DEFAULT
"""The default entity name: Kafka's null entity name, ``<default>`` in ``kafka-configs``."""

EntityName: TypeAlias = str | _Default | None
"""One entity component: a name, :data:`DEFAULT`, or ``None`` (absent)."""

ANONYMOUS: Final = "ANONYMOUS"
"""User name Kafka gives unauthenticated clients (``KafkaPrincipal.ANONYMOUS``)."""

ENTITY_USER: Final = "user"
ENTITY_CLIENT_ID: Final = "client-id"
ENTITY_IP: Final = "ip"

_LONG_MAX_AS_DOUBLE: Final = float(2**63 - 1)  # what Java's `value > Long.MAX_VALUE` compares against (2**63)
_FRACTION_EPSILON: Final = 1e-6  # Kafka's tolerance for "integral" LONG quota values


# --------------------------------------------------------------------------------------------------- errors


class QuotaEntityError(ValueError):
    """An entity that Kafka would reject (AlterClientQuotas answers INVALID_REQUEST)."""


class QuotaValueError(ValueError):
    """A quota key or value that Kafka would reject; names the entity, the key and the reason.

    The proxy maps it to INVALID_REQUEST for that entity in an AlterClientQuotas response.
    """

    def __init__(self, entity: QuotaEntity, key: str, value: object, reason: str) -> None:
        self.entity = entity
        self.key = key
        self.value = value
        self.reason = reason
        super().__init__(f"quota {key}={value!r} for {entity}: {reason}")


class QuotaFilterError(ValueError):
    """A DescribeClientQuotas filter Kafka rejects with INVALID_REQUEST."""


class UnsupportedEntityTypeError(QuotaFilterError):
    """A filter entity type other than user / client-id / ip; Kafka answers UNSUPPORTED_VERSION."""


# --------------------------------------------------------------------------------------------------- entities


def _check_component(kind: str, name: object) -> None:
    if name is None or name is DEFAULT:
        return
    if not isinstance(name, str):
        raise QuotaEntityError(f"{kind} entity name must be a str, DEFAULT or None, not {type(name).__name__}")
    if not name:
        # Kafka: "Empty user not supported" / "Empty client-id not supported".
        raise QuotaEntityError(f"empty {kind} entity name not supported (use DEFAULT for the default entity)")


def _describe_component(kind: str, name: EntityName) -> str | None:
    if name is None:
        return None
    if name is DEFAULT:
        return f"default {kind}"
    return f"{kind} {name!r}"


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A quota entity: ``(user, client_id)``, each a name, :data:`DEFAULT` or ``None`` (absent).

    ``QuotaEntity(user="alice")`` is ``<user alice>``; ``QuotaEntity(DEFAULT, "c1")`` is
    ``<default user, client-id c1>``; ``QuotaEntity(client_id=DEFAULT)`` is ``<default client-id>``.
    """

    user: EntityName = None
    client_id: EntityName = None

    def __post_init__(self) -> None:
        _check_component(ENTITY_USER, self.user)
        _check_component(ENTITY_CLIENT_ID, self.client_id)
        if self.user is None and self.client_id is None:
            raise QuotaEntityError("invalid empty client quota entity: give a user, a client-id, or both")

    def __str__(self) -> str:
        parts = [
            p
            for p in (
                _describe_component(ENTITY_USER, self.user),
                _describe_component(ENTITY_CLIENT_ID, self.client_id),
            )
            if p
        ]
        return "<" + ", ".join(parts) + ">"

    def components(self) -> dict[str, str | None]:
        """Wire form (entity type -> entity name, ``None`` for the default), as DescribeClientQuotas returns it."""
        out: dict[str, str | None] = {}
        if self.user is not None:
            out[ENTITY_USER] = None if self.user is DEFAULT else self.user
        if self.client_id is not None:
            out[ENTITY_CLIENT_ID] = None if self.client_id is DEFAULT else self.client_id
        return out

    @classmethod
    def from_components(cls, components: Iterable[tuple[str, str | None]]) -> QuotaEntity:
        """Build from wire form ``(entity_type, entity_name or None)`` pairs, as AlterClientQuotas sends them.

        Rejects what Kafka rejects (duplicate types, unknown types, empty names, no components); ``ip``
        entities are refused because this store does not hold connection-rate quotas.
        """
        user: EntityName = None
        client_id: EntityName = None
        seen: set[str] = set()
        for entity_type, name in components:
            if entity_type in seen:
                raise QuotaEntityError(f"invalid client quota entity, duplicate entity entry {entity_type}")
            seen.add(entity_type)
            value: EntityName = DEFAULT if name is None else name
            if entity_type == ENTITY_USER:
                user = value
            elif entity_type == ENTITY_CLIENT_ID:
                client_id = value
            elif entity_type == ENTITY_IP:
                raise QuotaEntityError("ip entities (connection-rate quotas) are not handled by this quota store")
            else:
                raise QuotaEntityError(f"unhandled client quota entity type: {entity_type}")
        return cls(user, client_id)


# --------------------------------------------------------------------------------------------------- validation


def validate_quota(entity: QuotaEntity, key: str, value: object) -> float:
    """Check one ``key = value`` for ``entity`` as Kafka's AlterClientQuotas does; return the value as a float.

    Raises :class:`QuotaValueError` naming the entity, key and reason.
    """
    if key not in QUOTA_KEYS:
        raise QuotaValueError(entity, key, value, f"unknown quota key; valid keys are {', '.join(sorted(QUOTA_KEYS))}")
    if key in USER_ONLY_KEYS and (entity.user is None or entity.client_id is not None):
        raise QuotaValueError(entity, key, value, "allowed only on <user> and <default user> entities (KIP-936)")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QuotaValueError(entity, key, value, "must be a number")
    try:
        v = float(value)
    except OverflowError:
        raise QuotaValueError(entity, key, value, "is too large") from None
    if math.isnan(v) or math.isinf(v):
        raise QuotaValueError(entity, key, value, "must be a finite number")
    if v <= 0.0:
        raise QuotaValueError(entity, key, value, "must be greater than 0")
    if key in INTEGRAL_KEYS:
        if v > _LONG_MAX_AS_DOUBLE:
            raise QuotaValueError(entity, key, value, "is too large for a LONG")
        if abs(math.fmod(v, 1.0)) > _FRACTION_EPSILON:
            raise QuotaValueError(entity, key, value, "cannot be a fractional value (byte rates are integral)")
    return v


# --------------------------------------------------------------------------------------------------- resolution


class Level(enum.IntEnum):
    """The eight precedence levels; the value is the rank (1 wins over everything)."""

    USER_CLIENT_ID = 1
    USER_DEFAULT_CLIENT_ID = 2
    USER = 3
    DEFAULT_USER_CLIENT_ID = 4
    DEFAULT_USER_DEFAULT_CLIENT_ID = 5
    DEFAULT_USER = 6
    CLIENT_ID = 7
    DEFAULT_CLIENT_ID = 8


PRECEDENCE: Final = tuple(Level)
"""Levels in the order Kafka consults them."""

_NAMED = object()
"""In :data:`_LEVEL_PARTS`: the connection's own user or client id."""

# The config entity each level consults, as (user part, client-id part): the connection's name, DEFAULT or absent.
_LEVEL_PARTS: Final[dict[Level, tuple[object, object]]] = {
    Level.USER_CLIENT_ID: (_NAMED, _NAMED),
    Level.USER_DEFAULT_CLIENT_ID: (_NAMED, DEFAULT),
    Level.USER: (_NAMED, None),
    Level.DEFAULT_USER_CLIENT_ID: (DEFAULT, _NAMED),
    Level.DEFAULT_USER_DEFAULT_CLIENT_ID: (DEFAULT, DEFAULT),
    Level.DEFAULT_USER: (DEFAULT, None),
    Level.CLIENT_ID: (None, _NAMED),
    Level.DEFAULT_CLIENT_ID: (None, DEFAULT),
}


# Which tags a level's bucket keeps (Kafka's quotaMetricTags): (keeps user tag, keeps client-id tag): the parts
# its config entity has.
_TAG_SHAPE: Final[dict[Level, tuple[bool, bool]]] = {
    level: (u is not None, c is not None) for level, (u, c) in _LEVEL_PARTS.items()
}

# Kafka's quotaLimit: which levels are searched for a given tag shape.
_BOTH_TAGS_LEVELS: Final = (
    Level.USER_CLIENT_ID,
    Level.USER_DEFAULT_CLIENT_ID,
    Level.DEFAULT_USER_CLIENT_ID,
    Level.DEFAULT_USER_DEFAULT_CLIENT_ID,
)
_USER_TAG_LEVELS: Final = (Level.USER, Level.DEFAULT_USER)
_CLIENT_TAG_LEVELS: Final = (Level.CLIENT_ID, Level.DEFAULT_CLIENT_ID)

_EntityKey: TypeAlias = tuple[EntityName, EntityName]


def _level_key(level: Level, user: str, client_id: str) -> _EntityKey:
    """The store key of the config entity consulted at ``level`` for (user, client_id)."""
    u, c = _LEVEL_PARTS[level]
    return (user if u is _NAMED else u, client_id if c is _NAMED else c)  # type: ignore[return-value]


_URL_SAFE: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def sanitize_user(name: str) -> str:
    """Kafka's ``Sanitizer.sanitize``: Java URL-encoding of the UTF-8 name, with ``*`` -> ``%2A``, space -> ``%20``.

    Kafka stores user entities and tags user metrics with this form. It is injective, so matching on raw names
    is equivalent; only the bucket key's user tag carries it, to line up with the broker's metric names.
    """
    if all(c.isascii() and (c.isalnum() or c in ".-_") for c in name):
        return name
    out: list[str] = []
    for b in name.encode("utf-8", errors="replace"):  # Java encodes unpaired surrogates as '?'
        out.append(chr(b) if b in _URL_SAFE else f"%{b:02X}")
    return "".join(out)


class BucketKey(NamedTuple):
    """The rate-tracker key: Kafka's quota metric tags ``user`` (sanitized) and ``client-id``; ``""`` = unused."""

    user: str
    client_id: str

    def metric_tags(self) -> dict[str, str]:
        """As Kafka names them on its ``byte-rate`` / ``throttle-time`` / ``request-time`` metrics."""
        return {"user": self.user, "client-id": self.client_id}


@dataclass(frozen=True, slots=True)
class Resolved:
    """The quota that applies to one (user, client id) for one key, and the bucket it is charged to."""

    key: str
    limit: float
    level: Level
    entity: QuotaEntity
    """The configured entity the limit comes from."""
    bucket: BucketKey
    """Requests with equal bucket keys (for the same key) share one rate tracker."""


# --------------------------------------------------------------------------------------------------- filters


class MatchType(enum.IntEnum):
    """DescribeClientQuotas component match types, with their wire values."""

    EXACT = 0
    """The entity has this component with exactly this name."""
    DEFAULT = 1
    """The entity has this component set to the default."""
    SPECIFIED = 2
    """The entity has this component, with any name or the default."""


@dataclass(frozen=True, slots=True)
class FilterComponent:
    """One DescribeClientQuotas filter component."""

    entity_type: str
    match_type: MatchType | int
    match: str | None = None


def _parse_filter(components: Iterable[FilterComponent]) -> tuple[dict[str, EntityName], set[str]]:
    """Validate a filter as Kafka's ``ClientQuotasImage.describe`` does; return (exact matches, type matches)."""
    exact: dict[str, EntityName] = {}
    typed: set[str] = set()
    for comp in components:
        et = comp.entity_type
        if not et:
            raise QuotaFilterError("invalid empty entity type")
        if et in exact or et in typed:
            raise QuotaFilterError(f"entity type {et} cannot appear more than once in the filter")
        if et not in (ENTITY_USER, ENTITY_CLIENT_ID, ENTITY_IP):
            raise UnsupportedEntityTypeError(f"unsupported entity type {et}")
        if comp.match_type == MatchType.EXACT:
            if comp.match is None:
                raise QuotaFilterError("MATCH_TYPE_EXACT needs a match string")
            exact[et] = comp.match
        elif comp.match_type == MatchType.DEFAULT:
            if comp.match is not None:
                raise QuotaFilterError("MATCH_TYPE_DEFAULT must not have a match string")
            exact[et] = DEFAULT
        elif comp.match_type == MatchType.SPECIFIED:
            if comp.match is not None:
                raise QuotaFilterError("MATCH_TYPE_SPECIFIED must not have a match string")
            typed.add(et)
        else:
            raise QuotaFilterError(f"unknown match type {comp.match_type}")
    if (ENTITY_IP in exact or ENTITY_IP in typed) and ({ENTITY_USER, ENTITY_CLIENT_ID} & (exact.keys() | typed)):
        raise QuotaFilterError(
            "invalid entity filter component combination: ip cannot be combined with user or client-id"
        )
    return exact, typed


def _matches(entity: QuotaEntity, exact: Mapping[str, EntityName], typed: set[str], strict: bool) -> bool:
    present: dict[str, EntityName] = {}
    if entity.user is not None:
        present[ENTITY_USER] = entity.user
    if entity.client_id is not None:
        present[ENTITY_CLIENT_ID] = entity.client_id
    if strict and len(present) != len(exact) + len(typed):
        return False
    for et, want in exact.items():
        if et not in present or present[et] != want:
            return False
    return all(et in present for et in typed)


# --------------------------------------------------------------------------------------------------- the store


class QuotaStore:
    """Quota configuration: entity -> {key: value}, with Kafka's resolution and a per-request cache."""

    leased = False
    """Whether :meth:`resolve` answers a fleet member's lease, its share of each quota (:meth:`quota_limit` still
    answers the quota): the manager then exports both (the ``lease-limit`` metric)."""

    def __init__(self, *, cache_max_entries: int = 65_536) -> None:
        if cache_max_entries < 1:
            raise ValueError("cache_max_entries must be at least 1")
        self._quotas: dict[_EntityKey, dict[str, float]] = {}
        self._entities: dict[_EntityKey, QuotaEntity] = {}
        self._cache: dict[tuple[str, str, str], Resolved | None] = {}
        self._cache_max = cache_max_entries
        self.generation = 0
        """Bumped on every effective change; a changed generation means cached resolutions are stale."""
        self._listeners: list[Callable[[], None]] = []

    # ----------------------------------------------------------------------------------------- state

    def __len__(self) -> int:
        return len(self._quotas)

    def __contains__(self, entity: object) -> bool:
        return isinstance(entity, QuotaEntity) and (entity.user, entity.client_id) in self._quotas

    def get(self, entity: QuotaEntity) -> dict[str, float]:
        """A copy of the entity's quotas (empty when it has none)."""
        return dict(self._quotas.get((entity.user, entity.client_id), {}))

    def entities(self) -> dict[QuotaEntity, dict[str, float]]:
        """A copy of the whole configuration."""
        return {self._entities[k]: dict(v) for k, v in self._quotas.items()}

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every effective change. Why: the manager's stamp, read on every request (and
        through it the policy's plans), is compiled and counts the changes itself, a native read, where reading
        :attr:`generation` of this interpreted class is a generic attribute lookup."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self.generation += 1
        self._cache.clear()
        for listener in self._listeners:
            listener()

    # ----------------------------------------------------------------------------------------- mutation

    def set(self, entity: QuotaEntity, key: str, value: float) -> None:
        """Set one quota after validating it (:class:`QuotaValueError` on a bad key or value)."""
        v = validate_quota(entity, key, value)
        ek = (entity.user, entity.client_id)
        quotas = self._quotas.get(ek)
        if quotas is not None and quotas.get(key) == v:
            return  # unchanged: keep the cache, as Kafka writes no record for an unchanged value
        if quotas is None:
            quotas = self._quotas[ek] = {}
            self._entities[ek] = entity
        quotas[key] = v
        self._changed()

    def remove(self, entity: QuotaEntity, key: str) -> bool:
        """Remove one quota; the entity disappears with its last quota. Returns whether anything was removed.

        Like Kafka, removing a key that is not set (whatever its name) is a successful no-op.
        """
        ek = (entity.user, entity.client_id)
        quotas = self._quotas.get(ek)
        if quotas is None or key not in quotas:
            return False
        del quotas[key]
        if not quotas:
            del self._quotas[ek]
            del self._entities[ek]
        self._changed()
        return True

    def alter(self, entity: QuotaEntity, ops: Mapping[str, float | None], *, validate_only: bool = False) -> None:
        """One AlterClientQuotas entry: ``key -> value`` sets, ``key -> None`` removes.

        All-or-nothing for the entity, as Kafka: every value is validated before anything changes, and a
        :class:`QuotaValueError` leaves the store untouched. ``validate_only`` checks without applying.
        """
        checked: dict[str, float | None] = {}
        for key, value in ops.items():
            checked[key] = None if value is None else validate_quota(entity, key, value)
        if validate_only:
            return
        for key, v in checked.items():
            if v is None:
                self.remove(entity, key)
            else:
                self.set(entity, key, v)

    # ----------------------------------------------------------------------------------------- describe

    def describe(
        self, components: Iterable[FilterComponent] = (), *, strict: bool = False
    ) -> dict[QuotaEntity, dict[str, float]]:
        """DescribeClientQuotas: the entities matching every filter component, with copies of their quotas.

        EXACT matches a component by name, DEFAULT matches the default entity name, SPECIFIED matches any name
        or the default. Non-strict: entities may have further components (an empty filter returns everything).
        Strict: the entity has exactly the filtered components and no others. Raises :class:`QuotaFilterError`
        (INVALID_REQUEST) or :class:`UnsupportedEntityTypeError` (UNSUPPORTED_VERSION) as Kafka would. An ``ip``
        component is accepted and matches nothing, since this store holds no ip entities.
        """
        exact, typed = _parse_filter(components)
        out: dict[QuotaEntity, dict[str, float]] = {}
        for ek, quotas in self._quotas.items():
            entity = self._entities[ek]
            if _matches(entity, exact, typed, strict):
                out[entity] = dict(quotas)
        return out

    # ----------------------------------------------------------------------------------------- resolution

    def resolve(self, user: str, client_id: str | None, key: str) -> Resolved | None:
        """The quota for ``key`` that applies to ``user`` (principal name) and ``client_id``; ``None`` = unlimited.

        A ``None`` client id is treated as ``""``, as Kafka's request header parsing does. Cached per
        ``(user, client_id, key)`` until the store changes.
        """
        cid = "" if client_id is None else client_id
        ck = (user, cid, key)
        try:
            return self._cache[ck]
        except KeyError:
            pass
        if key not in QUOTA_KEYS:
            raise ValueError(f"unknown quota key {key!r}")
        result = self._resolve_uncached(user, cid, key)
        if len(self._cache) >= self._cache_max:
            self._cache.clear()
        self._cache[ck] = result
        return result

    def _has(self, ek: _EntityKey, key: str) -> bool:
        quotas = self._quotas.get(ek)
        return quotas is not None and key in quotas

    def _resolve_uncached(self, user: str, client_id: str, key: str) -> Resolved | None:
        # Step 1, Kafka's quotaMetricTags: the first level holding the key decides which tags are kept.
        walked = next((lvl for lvl in PRECEDENCE if self._has(_level_key(lvl, user, client_id), key)), None)
        if walked is None:
            return None
        keep_user, keep_client = _TAG_SHAPE[walked]
        tag_user = user if keep_user else ""
        tag_client = client_id if keep_client else ""
        # Step 2, Kafka's quotaLimit: the limit is looked up from the tags alone. For non-empty names this
        # finds `walked` again; it differs only for empty names (see the module docstring).
        found = self._from_tags(tag_user, tag_client, key)
        if found is None:
            return None
        lvl, ek, limit = found
        return Resolved(
            key=key,
            limit=limit,
            level=lvl,
            entity=self._entities[ek],
            bucket=BucketKey(sanitize_user(tag_user), tag_client),
        )

    def _from_tags(self, tag_user: str, tag_client: str, key: str) -> tuple[Level, _EntityKey, float] | None:
        """Kafka's quotaLimit: the level, entity and quota a bucket's tags (the user's raw name) find."""
        search: tuple[Level, ...]
        if tag_user and tag_client:
            search = _BOTH_TAGS_LEVELS
        elif tag_user:
            search = _USER_TAG_LEVELS
        elif tag_client:
            search = _CLIENT_TAG_LEVELS
        else:
            return None
        for lvl in search:
            ek = _level_key(lvl, tag_user, tag_client)
            quotas = self._quotas.get(ek)
            if quotas is not None and key in quotas:
                return lvl, ek, quotas[key]
        return None

    def quota_limit(self, key: str, user: str, client_id: str) -> float | None:
        """The quota configured now for the bucket of ``key`` whose tags are ``user`` (the user's *raw* name, not
        the sanitized tag; ``""`` when the bucket has no user tag) and ``client_id`` (``""``: none); None when
        none applies. Kafka's quotaLimit, which is also how a broker updates a sensor's quota after an alter.

        Why beside :meth:`resolve`: a fleet member's store (:class:`quotas.fleet_leases.LeasedStore`) resolves to
        its lease, a share of the quota; this answers the quota itself (the ``quota-limit`` metric), and at scrape
        time, so an alter shows at once even on a bucket no request has bound again. Uncached: called per bucket
        per scrape, never per request."""
        found = self._from_tags(user, client_id, key)
        return None if found is None else found[2]
