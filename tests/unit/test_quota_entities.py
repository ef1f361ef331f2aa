"""Quota entities: Kafka's eight-level precedence, bucket sharing (metric tags), validation, cache, describe."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.entities import (
    ANONYMOUS,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    PRODUCER_IDS_RATE,
    REQUEST_PERCENTAGE,
    BucketKey,
    FilterComponent,
    Level,
    MatchType,
    QuotaEntity,
    QuotaEntityError,
    QuotaFilterError,
    QuotaStore,
    QuotaValueError,
    UnsupportedEntityTypeError,
    sanitize_user,
)

U, C = "alice", "app-1"

# The eight levels, top first, as (level, entity for user U / client C, expected bucket for U / C).
LEVELS = [
    (Level.USER_CLIENT_ID, QuotaEntity(U, C), BucketKey(U, C)),
    (Level.USER_DEFAULT_CLIENT_ID, QuotaEntity(U, DEFAULT), BucketKey(U, C)),
    (Level.USER, QuotaEntity(U), BucketKey(U, "")),
    (Level.DEFAULT_USER_CLIENT_ID, QuotaEntity(DEFAULT, C), BucketKey(U, C)),
    (Level.DEFAULT_USER_DEFAULT_CLIENT_ID, QuotaEntity(DEFAULT, DEFAULT), BucketKey(U, C)),
    (Level.DEFAULT_USER, QuotaEntity(DEFAULT), BucketKey(U, "")),
    (Level.CLIENT_ID, QuotaEntity(client_id=C), BucketKey("", C)),
    (Level.DEFAULT_CLIENT_ID, QuotaEntity(client_id=DEFAULT), BucketKey("", C)),
]


def _store(*entries: tuple[QuotaEntity, str, float]) -> QuotaStore:
    s = QuotaStore()
    for entity, key, value in entries:
        s.set(entity, key, value)
    return s


# ------------------------------------------------------------------------------------------- precedence


@pytest.mark.parametrize("index", range(len(LEVELS)), ids=[lvl.name for lvl, _, _ in LEVELS])
@pytest.mark.parametrize("key", [PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE])
def test_each_level_wins_over_all_lower_levels(index, key):
    store = QuotaStore()
    for j in range(index, len(LEVELS)):
        store.set(LEVELS[j][1], key, 1000 * (j + 1))
    level, entity, bucket = LEVELS[index]
    r = store.resolve(U, C, key)
    assert r is not None
    assert (r.level, r.entity, r.limit, r.bucket, r.key) == (level, entity, 1000.0 * (index + 1), bucket, key)
    # And it is not consulted for someone it does not name: lower levels still decide for them.
    if entity.user == U or entity.client_id == C:
        other = store.resolve("mallory", "other-app", key)
        assert other is None or other.level > level


def test_nothing_configured_is_unlimited():
    store = QuotaStore()
    assert store.resolve(U, C, PRODUCER_BYTE_RATE) is None
    store.set(QuotaEntity("bob"), PRODUCER_BYTE_RATE, 10)
    store.set(QuotaEntity(U), CONSUMER_BYTE_RATE, 10)  # another key does not apply
    assert store.resolve(U, C, PRODUCER_BYTE_RATE) is None


def test_keys_resolve_independently():
    """One quota manager per key in Kafka: an entity without the key does not shadow lower levels."""
    store = _store(
        (QuotaEntity(U), PRODUCER_BYTE_RATE, 100),
        (QuotaEntity(U, C), CONSUMER_BYTE_RATE, 200),
        (QuotaEntity(client_id=DEFAULT), REQUEST_PERCENTAGE, 5.5),
    )
    assert store.resolve(U, C, PRODUCER_BYTE_RATE).level is Level.USER
    assert store.resolve(U, C, CONSUMER_BYTE_RATE).level is Level.USER_CLIENT_ID
    r = store.resolve(U, C, REQUEST_PERCENTAGE)
    assert (r.level, r.limit, r.bucket) == (Level.DEFAULT_CLIENT_ID, 5.5, BucketKey("", C))
    assert store.resolve(U, C, CONTROLLER_MUTATION_RATE) is None


# ------------------------------------------------------------------------------------------- sharing


def test_user_quota_is_shared_by_all_client_ids_but_user_default_client_is_not():
    store = _store((QuotaEntity(U), PRODUCER_BYTE_RATE, 1000))
    a, b = store.resolve(U, "c1", PRODUCER_BYTE_RATE), store.resolve(U, "c2", PRODUCER_BYTE_RATE)
    assert a.bucket == b.bucket == BucketKey(U, "")

    store.set(QuotaEntity(U, DEFAULT), PRODUCER_BYTE_RATE, 500)
    a, b = store.resolve(U, "c1", PRODUCER_BYTE_RATE), store.resolve(U, "c2", PRODUCER_BYTE_RATE)
    assert (a.level, b.level) == (Level.USER_DEFAULT_CLIENT_ID, Level.USER_DEFAULT_CLIENT_ID)
    assert a.limit == b.limit == 500
    assert (a.bucket, b.bucket) == (BucketKey(U, "c1"), BucketKey(U, "c2"))


def test_default_user_gives_each_user_its_own_bucket_shared_across_its_client_ids():
    store = _store((QuotaEntity(DEFAULT), CONSUMER_BYTE_RATE, 1000))
    buckets = {(u, c): store.resolve(u, c, CONSUMER_BYTE_RATE).bucket for u in ("alice", "bob") for c in ("c1", "c2")}
    assert buckets[("alice", "c1")] == buckets[("alice", "c2")] == BucketKey("alice", "")
    assert buckets[("bob", "c1")] == buckets[("bob", "c2")] == BucketKey("bob", "")


@pytest.mark.parametrize(
    "entity, expected",
    [
        (QuotaEntity(DEFAULT, DEFAULT), {("alice", "c1"), ("alice", "c2"), ("bob", "c1"), ("bob", "c2")}),
        (QuotaEntity(DEFAULT, "c1"), {("alice", "c1"), ("bob", "c1")}),
    ],
)
def test_default_user_with_client_gives_each_pair_its_own_bucket(entity, expected):
    store = _store((entity, PRODUCER_BYTE_RATE, 1000))
    got = set()
    for u in ("alice", "bob"):
        for c in ("c1", "c2"):
            r = store.resolve(u, c, PRODUCER_BYTE_RATE)
            if r is not None:
                assert r.bucket == BucketKey(u, c)
                got.add((u, c))
    assert got == expected


def test_client_id_quotas_are_shared_across_users_and_split_per_client_id():
    store = _store((QuotaEntity(client_id="c1"), PRODUCER_BYTE_RATE, 1000))
    assert store.resolve("alice", "c1", PRODUCER_BYTE_RATE).bucket == BucketKey("", "c1")
    assert store.resolve("bob", "c1", PRODUCER_BYTE_RATE).bucket == BucketKey("", "c1")
    assert store.resolve("bob", "c2", PRODUCER_BYTE_RATE) is None
    store.set(QuotaEntity(client_id=DEFAULT), PRODUCER_BYTE_RATE, 10)
    r = store.resolve("bob", "c2", PRODUCER_BYTE_RATE)
    assert (r.limit, r.bucket) == (10, BucketKey("", "c2"))


def test_user_tag_is_sanitized_like_kafka_metrics_and_client_tag_is_raw():
    store = _store((QuotaEntity("CN=a b,O=x*"), PRODUCER_BYTE_RATE, 1000))
    r = store.resolve("CN=a b,O=x*", "my app*", PRODUCER_BYTE_RATE)
    assert r.bucket == BucketKey("CN%3Da%20b%2CO%3Dx%2A", "")
    assert r.bucket.metric_tags() == {"user": "CN%3Da%20b%2CO%3Dx%2A", "client-id": ""}
    store.set(QuotaEntity(client_id="my app*"), CONSUMER_BYTE_RATE, 5)
    assert store.resolve("u", "my app*", CONSUMER_BYTE_RATE).bucket == BucketKey("", "my app*")


@pytest.mark.parametrize(
    "raw, sanitized",
    [("alice", "alice"), ("a.b-c_d", "a.b-c_d"), ("a b", "a%20b"), ("x*", "x%2A"), ("ü~", "%C3%BC%7E"), ("", "")],
)
def test_sanitize_user_matches_java_url_encoding(raw, sanitized):
    assert sanitize_user(raw) == sanitized


def test_anonymous_is_an_ordinary_user_matching_default_user():
    store = _store((QuotaEntity(DEFAULT), PRODUCER_BYTE_RATE, 100))
    r = store.resolve(ANONYMOUS, "c1", PRODUCER_BYTE_RATE)
    assert (r.level, r.bucket) == (Level.DEFAULT_USER, BucketKey("ANONYMOUS", ""))
    store.set(QuotaEntity(ANONYMOUS), PRODUCER_BYTE_RATE, 7)
    r = store.resolve(ANONYMOUS, "c2", PRODUCER_BYTE_RATE)
    assert (r.level, r.limit, r.bucket) == (Level.USER, 7, BucketKey("ANONYMOUS", ""))


def test_empty_client_id_only_sees_user_levels_as_in_kafka():
    """Kafka re-derives the limit from the tags: with client id "" only <user> / <default user> apply."""
    store = _store(
        (QuotaEntity(U, DEFAULT), PRODUCER_BYTE_RATE, 1),
        (QuotaEntity(DEFAULT, DEFAULT), PRODUCER_BYTE_RATE, 2),
        (QuotaEntity(client_id=DEFAULT), PRODUCER_BYTE_RATE, 3),
    )
    assert store.resolve(U, "", PRODUCER_BYTE_RATE) is None
    assert store.resolve(U, None, PRODUCER_BYTE_RATE) is None  # a null header client id is ""
    store.set(QuotaEntity(DEFAULT), PRODUCER_BYTE_RATE, 4)
    r = store.resolve(U, None, PRODUCER_BYTE_RATE)
    assert (r.level, r.limit, r.bucket) == (Level.DEFAULT_USER, 4, BucketKey(U, ""))
    store.set(QuotaEntity(U), PRODUCER_BYTE_RATE, 5)
    assert store.resolve(U, "", PRODUCER_BYTE_RATE).limit == 5
    # With a real client id the ordinary precedence applies.
    assert store.resolve(U, C, PRODUCER_BYTE_RATE).level is Level.USER_DEFAULT_CLIENT_ID


def test_empty_user_quirk_as_in_kafka():
    store = _store((QuotaEntity(client_id=C), PRODUCER_BYTE_RATE, 9))
    r = store.resolve("", C, PRODUCER_BYTE_RATE)
    assert (r.level, r.bucket) == (Level.CLIENT_ID, BucketKey("", C))
    store.set(QuotaEntity(DEFAULT, DEFAULT), PRODUCER_BYTE_RATE, 8)  # tags ("", C): levels 7, 8 still decide
    assert store.resolve("", C, PRODUCER_BYTE_RATE).limit == 9
    store.remove(QuotaEntity(DEFAULT, DEFAULT), PRODUCER_BYTE_RATE)
    store.set(QuotaEntity(DEFAULT), PRODUCER_BYTE_RATE, 7)  # tags ("", ""): Kafka finds no limit
    assert store.resolve("", C, PRODUCER_BYTE_RATE) is None


# ------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "entity, key, value, reason",
    [
        (QuotaEntity(U), PRODUCER_BYTE_RATE, 0, "greater than 0"),
        (QuotaEntity(U), REQUEST_PERCENTAGE, -1.5, "greater than 0"),
        (QuotaEntity(U), CONSUMER_BYTE_RATE, -3, "greater than 0"),
        (QuotaEntity(U), PRODUCER_BYTE_RATE, 1024.5, "fractional"),
        (QuotaEntity(U), CONSUMER_BYTE_RATE, 0.25, "fractional"),
        (QuotaEntity(U), CONSUMER_BYTE_RATE, 2.0**64, "too large"),
        (QuotaEntity(U, C), PRODUCER_IDS_RATE, 10, "<user> and <default user>"),
        (QuotaEntity(client_id=C), PRODUCER_IDS_RATE, 10, "<user> and <default user>"),
        (QuotaEntity(DEFAULT, DEFAULT), PRODUCER_IDS_RATE, 10, "<user> and <default user>"),
        (QuotaEntity(U), "producer_bytes_rate", 10, "unknown quota key"),
        (QuotaEntity(U), "connection_creation_rate", 10, "unknown quota key"),
        (QuotaEntity(U), REQUEST_PERCENTAGE, float("nan"), "finite"),
        (QuotaEntity(U), CONTROLLER_MUTATION_RATE, float("inf"), "finite"),
        (QuotaEntity(U), REQUEST_PERCENTAGE, "10", "number"),
        (QuotaEntity(U), REQUEST_PERCENTAGE, True, "number"),
    ],
)
def test_invalid_quotas_are_rejected_naming_entity_key_and_reason(entity, key, value, reason):
    store = QuotaStore()
    with pytest.raises(QuotaValueError, match=reason) as info:
        store.set(entity, key, value)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.entity, err.key) == (entity, key)
    assert key in str(err) and str(entity) in str(err)
    assert len(store) == 0 and store.generation == 0


@pytest.mark.parametrize(
    "entity, key, value",
    [
        (QuotaEntity(U), PRODUCER_BYTE_RATE, 1),
        (QuotaEntity(U), PRODUCER_BYTE_RATE, 1024.0000001),  # Kafka's 1e-6 tolerance
        (QuotaEntity(U), CONSUMER_BYTE_RATE, 2**62),
        (QuotaEntity(U), REQUEST_PERCENTAGE, 0.01),
        (QuotaEntity(client_id=C), CONTROLLER_MUTATION_RATE, 2.5),
        (QuotaEntity(U), PRODUCER_IDS_RATE, 0.5),
        (QuotaEntity(DEFAULT), PRODUCER_IDS_RATE, 50),
    ],
)
def test_valid_quotas_are_accepted(entity, key, value):
    store = _store((entity, key, value))
    assert store.get(entity) == {key: float(value)}


def test_producer_ids_rate_resolves_per_user():
    store = _store((QuotaEntity(DEFAULT), PRODUCER_IDS_RATE, 50), (QuotaEntity("bob"), PRODUCER_IDS_RATE, 5))
    assert store.resolve("alice", "c1", PRODUCER_IDS_RATE).bucket == BucketKey("alice", "")
    r = store.resolve("bob", "c9", PRODUCER_IDS_RATE)
    assert (r.limit, r.level, r.bucket) == (5, Level.USER, BucketKey("bob", ""))


@pytest.mark.parametrize(
    "make",
    [
        lambda: QuotaEntity(),
        lambda: QuotaEntity(""),
        lambda: QuotaEntity(U, ""),
        lambda: QuotaEntity(3),  # type: ignore[arg-type]  # not a name, on purpose: refused at run time
        lambda: QuotaEntity.from_components([("user", "a"), ("user", "b")]),
        lambda: QuotaEntity.from_components([("ip", "10.0.0.1")]),
        lambda: QuotaEntity.from_components([("group", "g")]),
        lambda: QuotaEntity.from_components([]),
    ],
)
def test_invalid_entities(make):
    with pytest.raises(QuotaEntityError):
        make()


def test_entity_wire_form_round_trips():
    for entity in (e for _, e, _ in LEVELS):
        assert QuotaEntity.from_components(entity.components().items()) == entity
    assert QuotaEntity(DEFAULT, "c").components() == {"user": None, "client-id": "c"}
    assert str(QuotaEntity(DEFAULT, "c")) == "<default user, client-id 'c'>"


def test_unknown_key_in_resolve_is_an_error():
    with pytest.raises(ValueError, match="unknown quota key"):
        QuotaStore().resolve(U, C, "bytes")


# ------------------------------------------------------------------------------------------- mutation and cache


def test_remove_drops_key_then_entity():
    e = QuotaEntity(U)
    store = _store((e, PRODUCER_BYTE_RATE, 10), (e, CONSUMER_BYTE_RATE, 20))
    assert store.remove(e, PRODUCER_BYTE_RATE) is True
    assert e in store and store.get(e) == {CONSUMER_BYTE_RATE: 20}
    assert store.remove(e, PRODUCER_BYTE_RATE) is False
    assert store.remove(e, "no_such_key") is False  # Kafka: removing an unset key is a no-op
    assert store.remove(e, CONSUMER_BYTE_RATE) is True
    assert e not in store and len(store) == 0 and store.entities() == {}


def test_cache_is_invalidated_by_set_and_remove():
    store = _store((QuotaEntity(client_id=DEFAULT), PRODUCER_BYTE_RATE, 100))
    first = store.resolve(U, C, PRODUCER_BYTE_RATE)
    assert store.resolve(U, C, PRODUCER_BYTE_RATE) is first  # served from the cache
    g = store.generation

    store.set(QuotaEntity(U), PRODUCER_BYTE_RATE, 50)
    assert store.generation > g
    r = store.resolve(U, C, PRODUCER_BYTE_RATE)
    assert (r.level, r.limit, r.bucket) == (Level.USER, 50, BucketKey(U, ""))

    store.set(QuotaEntity(U), PRODUCER_BYTE_RATE, 60)  # value change of the same entity
    assert store.resolve(U, C, PRODUCER_BYTE_RATE).limit == 60

    g = store.generation
    store.set(QuotaEntity(U), PRODUCER_BYTE_RATE, 60)  # no change, no invalidation
    assert store.generation == g

    store.remove(QuotaEntity(U), PRODUCER_BYTE_RATE)
    assert store.resolve(U, C, PRODUCER_BYTE_RATE) == first

    store.remove(QuotaEntity(client_id=DEFAULT), PRODUCER_BYTE_RATE)
    assert store.resolve(U, C, PRODUCER_BYTE_RATE) is None  # a cached "unlimited" ...
    store.set(QuotaEntity(DEFAULT, DEFAULT), PRODUCER_BYTE_RATE, 7)
    assert store.resolve(U, C, PRODUCER_BYTE_RATE).limit == 7  # ... is invalidated too


def test_cache_is_bounded():
    store = QuotaStore(cache_max_entries=4)
    store.set(QuotaEntity(client_id=DEFAULT), PRODUCER_BYTE_RATE, 100)
    for i in range(50):
        assert store.resolve(U, f"c{i}", PRODUCER_BYTE_RATE).bucket == BucketKey("", f"c{i}")
    assert len(store._cache) <= 4


def test_alter_is_all_or_nothing_and_validate_only_changes_nothing():
    e = QuotaEntity(U, C)
    store = _store((e, PRODUCER_BYTE_RATE, 10))
    with pytest.raises(QuotaValueError, match="fractional"):
        store.alter(e, {PRODUCER_BYTE_RATE: None, CONSUMER_BYTE_RATE: 1.5})
    assert store.get(e) == {PRODUCER_BYTE_RATE: 10}
    g = store.generation
    store.alter(e, {PRODUCER_BYTE_RATE: None, CONSUMER_BYTE_RATE: 15}, validate_only=True)
    assert store.get(e) == {PRODUCER_BYTE_RATE: 10} and store.generation == g
    store.alter(e, {PRODUCER_BYTE_RATE: None, CONSUMER_BYTE_RATE: 15, REQUEST_PERCENTAGE: 12.5})
    assert store.get(e) == {CONSUMER_BYTE_RATE: 15, REQUEST_PERCENTAGE: 12.5}


# ------------------------------------------------------------------------------------------- describe


@pytest.fixture
def described() -> QuotaStore:
    return _store(*[(entity, PRODUCER_BYTE_RATE, 100 * lvl) for lvl, entity, _ in LEVELS])


def _f(entity_type: str, match_type: MatchType, match: str | None = None) -> FilterComponent:
    return FilterComponent(entity_type, match_type, match)


E = {lvl: entity for lvl, entity, _ in LEVELS}


@pytest.mark.parametrize(
    "components, strict, expected",
    [
        ([], False, set(Level)),
        ([], True, set()),
        ([_f("user", MatchType.EXACT, U)], False, {Level.USER_CLIENT_ID, Level.USER_DEFAULT_CLIENT_ID, Level.USER}),
        ([_f("user", MatchType.EXACT, U)], True, {Level.USER}),
        ([_f("user", MatchType.EXACT, "nobody")], False, set()),
        (
            [_f("user", MatchType.DEFAULT)],
            False,
            {Level.DEFAULT_USER_CLIENT_ID, Level.DEFAULT_USER_DEFAULT_CLIENT_ID, Level.DEFAULT_USER},
        ),
        ([_f("user", MatchType.DEFAULT)], True, {Level.DEFAULT_USER}),
        ([_f("user", MatchType.SPECIFIED)], True, {Level.USER, Level.DEFAULT_USER}),
        ([_f("client-id", MatchType.SPECIFIED)], True, {Level.CLIENT_ID, Level.DEFAULT_CLIENT_ID}),
        (
            [_f("client-id", MatchType.EXACT, C)],
            False,
            {Level.USER_CLIENT_ID, Level.DEFAULT_USER_CLIENT_ID, Level.CLIENT_ID},
        ),
        ([_f("client-id", MatchType.DEFAULT), _f("user", MatchType.EXACT, U)], True, {Level.USER_DEFAULT_CLIENT_ID}),
        (
            [_f("client-id", MatchType.SPECIFIED), _f("user", MatchType.SPECIFIED)],
            True,
            {
                Level.USER_CLIENT_ID,
                Level.USER_DEFAULT_CLIENT_ID,
                Level.DEFAULT_USER_CLIENT_ID,
                Level.DEFAULT_USER_DEFAULT_CLIENT_ID,
            },
        ),
        (
            [_f("user", MatchType.DEFAULT), _f("client-id", MatchType.DEFAULT)],
            False,
            {Level.DEFAULT_USER_DEFAULT_CLIENT_ID},
        ),
        ([_f("ip", MatchType.SPECIFIED)], False, set()),
    ],
)
def test_describe_filters(described, components, strict, expected):
    got = described.describe(components, strict=strict)
    assert set(got) == {E[lvl] for lvl in expected}
    for lvl in expected:
        assert got[E[lvl]] == {PRODUCER_BYTE_RATE: 100.0 * lvl}


def test_describe_returns_copies(described):
    got = described.describe()
    got[E[Level.USER]][PRODUCER_BYTE_RATE] = 1
    assert described.get(E[Level.USER]) == {PRODUCER_BYTE_RATE: 300.0}


@pytest.mark.parametrize(
    "components, error",
    [
        ([_f("", MatchType.SPECIFIED)], QuotaFilterError),
        ([_f("user", MatchType.SPECIFIED), _f("user", MatchType.EXACT, U)], QuotaFilterError),
        ([_f("group", MatchType.SPECIFIED)], UnsupportedEntityTypeError),
        ([_f("user", MatchType.EXACT)], QuotaFilterError),
        ([_f("user", MatchType.DEFAULT, U)], QuotaFilterError),
        ([_f("user", MatchType.SPECIFIED, U)], QuotaFilterError),
        ([FilterComponent("user", 7)], QuotaFilterError),
        ([_f("ip", MatchType.SPECIFIED), _f("client-id", MatchType.SPECIFIED)], QuotaFilterError),
    ],
)
def test_describe_rejects_bad_filters(described, components, error):
    with pytest.raises(error):
        described.describe(components)


# ------------------------------------------------------------------------------------------- property


def _reference_resolve(config: dict[tuple, dict[str, float]], user: str, client: str, key: str):
    """Plain restatement of Kafka's documented precedence, for non-empty names: first match wins."""
    candidates = [
        ((user, client), (user, client)),
        ((user, DEFAULT), (user, client)),
        ((user, None), (user, "")),
        ((DEFAULT, client), (user, client)),
        ((DEFAULT, DEFAULT), (user, client)),
        ((DEFAULT, None), (user, "")),
        ((None, client), ("", client)),
        ((None, DEFAULT), ("", client)),
    ]
    for rank, (entity, bucket) in enumerate(candidates, start=1):
        if key in config.get(entity, {}):
            return rank, config[entity][key], bucket
    return None


_USERS = ["alice", ANONYMOUS, "x y*"]
_CLIENTS = ["c1", "c2"]
_ALL_KEYS = [PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE, PRODUCER_IDS_RATE]
# Few names and keys, so that stores often hold several levels for the same key and probe.
_SET_KEYS = [PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, PRODUCER_IDS_RATE]
_PROBES = [(u, c, k) for u in [*_USERS, "carol"] for c in [*_CLIENTS, "other"] for k in _ALL_KEYS]
_entity_parts = st.tuples(
    st.sampled_from([*_USERS, DEFAULT, None]), st.sampled_from([*_CLIENTS, DEFAULT, None])
).filter(lambda p: p != (None, None))


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(st.tuples(_entity_parts, st.sampled_from(_SET_KEYS), st.integers(1, 10**6)), max_size=30),
    removals=st.lists(st.tuples(_entity_parts, st.sampled_from(_SET_KEYS)), max_size=6),
)
def test_resolve_matches_first_matching_level(entries, removals):
    store = QuotaStore()
    config: dict[tuple, dict[str, float]] = {}
    for (user, client), key, value in entries:
        if key == PRODUCER_IDS_RATE and (user is None or client is not None):
            continue
        store.set(QuotaEntity(user, client), key, value)
        config.setdefault((user, client), {})[key] = float(value)
    _check_against_reference(store, config)  # also fills the cache ...
    for (user, client), key in removals:
        store.remove(QuotaEntity(user, client), key)
        if key in config.get((user, client), {}):
            del config[(user, client)][key]
            if not config[(user, client)]:
                del config[(user, client)]
    _check_against_reference(store, config)  # ... which must not answer from before the removals


def _check_against_reference(store: QuotaStore, config: dict[tuple, dict[str, float]]) -> None:
    assert {(e.user, e.client_id): q for e, q in store.entities().items()} == config
    for user, client, key in _PROBES:
        got = store.resolve(user, client, key)
        want = _reference_resolve(config, user, client, key)
        if want is None:
            assert got is None
        else:
            rank, value, (bucket_user, bucket_client) = want
            assert got is not None
            assert (int(got.level), got.limit) == (rank, value)
            assert got.bucket == BucketKey(sanitize_user(bucket_user), bucket_client)
            assert (got.entity.user, got.entity.client_id) in config
        assert store.resolve(user, client, key) is got  # cached
