"""The proxy's own topics out of every client's reach (issue 29): protocol.topic_guard, and the policy using it.

Every API that names topics is refused per topic with TOPIC_AUTHORIZATION_FAILED in its own response shape (the
answers are decoded back with kafka-python's classes, as a client would); mixed requests go on without the
protected topics and get the refusals merged in; listings leave the topics out; records on the fleet's topics
count only with a member's MAC.
"""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.model import ProxyConfig
from protocol.apis import REQUESTS, RESPONSES
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader, encode_response_header, parse_request_header
from protocol.inflight import Pending
from protocol.request import Request, read_request
from protocol.topic_guard import (
    TOPIC_AUTHORIZATION_FAILED,
    ProtectedTopicError,
    ProtectedTopics,
    check,
    filter_listing,
)
from proxy.rules.policy import Decision, Policy
from proxy.rules.verdicts import Answer, Replace
from proxy.stats import Stats, Traffic
from quotas.fleet_reports import MAC_HEADER, authentic, record_mac

OWN = "__ktp_fleet_prod"
LOG = "decisions"
_SIZE = struct.Struct(">i")


def _guard() -> ProtectedTopics:
    return ProtectedTopics([LOG])


def _cls(api: int, *path: str, response: bool = False):
    cls = (RESPONSES if response else REQUESTS)[api]
    for p in path:
        cls = cls._struct.fields[p].array_of.data_class
    return cls


def _body(api: int, version: int, **fields) -> bytes:
    return bytes(REQUESTS[api](version=version, **fields).encode())


def _answer(api: int, version: int, refusal):
    assert refusal is not None and refusal.answer is not None
    return RESPONSES[api].decode(refusal.answer, version=version)


def _errors(entry) -> list[int | None]:
    """Every error code of one response entry: its own, or each of its partitions' (None: a partition without one)."""
    for f in ("error_code", "partition_error_code"):
        if hasattr(entry, f):
            return [getattr(entry, f)]
    for f in ("partitions", "partition_responses", "results_by_partition", "partition_result"):
        parts = getattr(entry, f, None)
        if parts:
            return [getattr(p, "error_code", getattr(p, "partition_error_code", None)) for p in parts]
    return []


def _produce(version: int, topics: list[str], acks: int = -1) -> bytes:
    TD, PD = _cls(0, "topic_data"), _cls(0, "topic_data", "partition_data")
    return _body(
        0,
        version,
        transactional_id=None,
        acks=acks,
        timeout_ms=1000,
        topic_data=[
            TD(version=version, name=t, partition_data=[PD(version=version, index=i, records=b"x" * 10)])
            for i, t in enumerate(topics)
        ],
    )


# ------------------------------------------------------------------------------------------ per-API shapes


@pytest.mark.parametrize("version", [3, 7, 9, 12])
def test_a_produce_to_an_own_topic_is_refused_per_partition(version):
    answer = _answer(0, version, check(_guard(), 0, version, _produce(version, [OWN])))
    (topic,) = answer.responses
    assert topic.name == OWN
    (part,) = topic.partition_responses
    assert (part.error_code, part.base_offset) == (TOPIC_AUTHORIZATION_FAILED, -1)


def test_the_decision_log_topic_and_the_whole_namespace_are_protected():
    g = _guard()
    assert g.protects(LOG) and g.protects(OWN) and g.protects("__ktp_anything")
    assert not g.protects("decisions2") and not g.protects("_ktp_fleet") and not g.protects(None)


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16])
def test_a_fetch_by_name_or_by_id_is_refused(version):
    g = _guard()
    topic_id = uuid.uuid4()
    g.learn({topic_id: OWN, uuid.uuid4(): "someone-elses"})
    assert g.ids == {topic_id: OWN}
    FT, FP = _cls(1, "topics"), _cls(1, "topics", "partitions")
    ident = {"topic": OWN} if version < 13 else {"topic_id": topic_id}
    body = _body(
        1,
        version,
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        topics=[
            FT(version=version, partitions=[FP(version=version, partition=p, fetch_offset=0) for p in (0, 1)], **ident)
        ],
    )
    answer = _answer(1, version, check(g, 1, version, body))
    (topic,) = answer.responses
    assert (topic.topic if version < 13 else topic.topic_id) == (OWN if version < 13 else topic_id)
    assert [p.partition_index for p in topic.partitions] == [0, 1]
    assert _errors(topic) == [TOPIC_AUTHORIZATION_FAILED] * 2


def _list_offsets(v):
    LT, LP = _cls(2, "topics"), _cls(2, "topics", "partitions")
    return _body(2, v, replica_id=-1, topics=[LT(version=v, name=OWN, partitions=[LP(version=v, partition_index=0)])])


def _offset_fetch(v):
    if v >= 8:
        G, GT = _cls(9, "groups"), _cls(9, "groups", "topics")
        return _body(9, v, groups=[G(version=v, group_id="g", topics=[GT(version=v, name=OWN, partition_indexes=[0])])])
    T = _cls(9, "topics")
    return _body(9, v, group_id="g", topics=[T(version=v, name=OWN, partition_indexes=[0, 1])])


def _offset_commit(v):
    T, P = _cls(8, "topics"), _cls(8, "topics", "partitions")
    return _body(8, v, group_id="g", topics=[T(version=v, name=OWN, partitions=[P(version=v, partition_index=0)])])


def _describe_configs(v):
    R = _cls(32, "resources")
    return _body(32, v, resources=[R(version=v, resource_type=2, resource_name=LOG, configuration_keys=None)])


def _alter_configs(v):
    R = _cls(33, "resources")
    return _body(33, v, resources=[R(version=v, resource_type=2, resource_name=OWN, configs=[])])


def _incremental_alter_configs(v):
    R = _cls(44, "resources")
    return _body(44, v, resources=[R(version=v, resource_type=2, resource_name=OWN, configs=[])])


def _delete_topics(v):
    if v >= 6:
        return _body(20, v, topics=[_cls(20, "topics")(version=v, name=OWN, topic_id=None)], timeout_ms=100)
    return _body(20, v, topic_names=[OWN], timeout_ms=100)


def _delete_records(v):
    T, P = _cls(21, "topics"), _cls(21, "topics", "partitions")
    return _body(
        21, v, topics=[T(version=v, name=OWN, partitions=[P(version=v, partition_index=0, offset=5)])], timeout_ms=100
    )


def _create_partitions(v):
    return _body(37, v, topics=[_cls(37, "topics")(version=v, name=OWN, count=4, assignments=None)], timeout_ms=100)


def _create_topics(v):
    return _body(
        19,
        v,
        topics=[_cls(19, "topics")(version=v, name="__ktp_fleet_squat", num_partitions=1, replication_factor=1)],
        timeout_ms=100,
    )


def _txn_offset_commit(v):
    T, P = _cls(28, "topics"), _cls(28, "topics", "partitions")
    return _body(
        28,
        v,
        transactional_id="t",
        group_id="g",
        producer_id=1,
        producer_epoch=0,
        topics=[T(version=v, name=OWN, partitions=[P(version=v, partition_index=0, committed_offset=1)])],
    )


def _offset_for_leader_epoch(v):
    T, P = _cls(23, "topics"), _cls(23, "topics", "partitions")
    return _body(23, v, topics=[T(version=v, topic=OWN, partitions=[P(version=v, partition=0, leader_epoch=1)])])


def _describe_topic_partitions(v):
    return _body(75, v, topics=[_cls(75, "topics")(version=v, name=OWN)], response_partition_limit=10)


CASES = [
    (2, 1, _list_offsets),
    (2, 7, _list_offsets),
    (8, 2, _offset_commit),
    (8, 8, _offset_commit),
    (9, 1, _offset_fetch),
    (9, 7, _offset_fetch),
    (9, 8, _offset_fetch),
    (32, 1, _describe_configs),
    (32, 4, _describe_configs),
    (33, 1, _alter_configs),
    (44, 1, _incremental_alter_configs),
    (20, 4, _delete_topics),
    (20, 6, _delete_topics),
    (21, 2, _delete_records),
    (37, 3, _create_partitions),
    (19, 7, _create_topics),
    (28, 3, _txn_offset_commit),
    (23, 4, _offset_for_leader_epoch),
    (75, 0, _describe_topic_partitions),
]


@pytest.mark.parametrize("api, version, make", CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_every_api_naming_an_own_topic_gets_topic_authorization_failed(api, version, make):
    answer = _answer(api, version, check(_guard(), api, version, make(version)))
    entries = []
    for field in ("topics", "responses", "results", "groups"):
        for e in getattr(answer, field, None) or []:
            entries.extend(e.topics if field == "groups" else [e])
    assert entries, answer
    for e in entries:
        assert _errors(e) and set(_errors(e)) == {TOPIC_AUTHORIZATION_FAILED}, e


def test_a_config_resource_of_another_type_with_the_name_passes():
    R = _cls(32, "resources")
    body = _body(32, 4, resources=[R(version=4, resource_type=4, resource_name=LOG, configuration_keys=None)])
    assert check(_guard(), 32, 4, body) is None


def test_an_api_without_per_topic_answers_is_refused_whole_or_closed():
    body = _body(76, 1, group_id="g", member_id="m", member_epoch=0, subscribed_topic_names=[OWN])
    answer = _answer(76, 1, check(_guard(), 76, 1, body))
    assert answer.error_code == TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(ProtectedTopicError):
        check(_guard(), 0, 9, _produce(9, [OWN], acks=0))  # nothing reads an answer: closed, as a broker does


# ------------------------------------------------------------------------------------------ mixed requests


def test_a_mixed_produce_forwards_the_rest_and_merges_the_refusal():
    refusal = check(_guard(), 0, 9, _produce(9, [OWN, "mine"]))
    assert refusal is not None and refusal.answer is None and refusal.topics == [OWN]
    forwarded = REQUESTS[0].decode(refusal.forward, version=9)
    assert [t.name for t in forwarded.topic_data] == ["mine"]
    TR, PR = _cls(0, "responses", response=True), _cls(0, "responses", "partition_responses", response=True)
    broker = RESPONSES[0](
        version=9,
        throttle_time_ms=7,
        responses=[
            TR(version=9, name="mine", partition_responses=[PR(version=9, index=1, error_code=0, base_offset=42)])
        ],
    )
    merged = RESPONSES[0].decode(refusal.merge(memoryview(bytes(broker.encode()))), version=9)
    assert merged.throttle_time_ms == 7
    by_name = {t.name: t for t in merged.responses}
    assert by_name["mine"].partition_responses[0].base_offset == 42
    assert _errors(by_name[OWN]) == [TOPIC_AUTHORIZATION_FAILED]


def test_metadata_naming_only_own_topics_is_still_forwarded_for_its_brokers():
    MT = _cls(3, "topics")
    refusal = check(_guard(), 3, 12, _body(3, 12, topics=[MT(version=12, name=OWN)], allow_auto_topic_creation=True))
    assert refusal is not None and refusal.answer is None
    assert REQUESTS[3].decode(refusal.forward, version=12).topics == []
    merged = RESPONSES[3].decode(refusal.merge(RESPONSES[3](version=12).encode()), version=12)
    (topic,) = merged.topics
    assert (topic.name, topic.error_code, topic.partitions) == (OWN, TOPIC_AUTHORIZATION_FAILED, [])


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", LOG, OWN, "__ktp_x", "ktp", "decisions_"]), st.integers(0, 3)),
        min_size=1,
        max_size=6,
    )
)
def test_exactly_the_protected_topics_are_refused_and_the_rest_forwarded(topics):
    g = _guard()
    names = [n for n, _ in topics]
    refusal = check(g, 0, 9, _produce(9, names))
    own = [n for n in names if g.protects(n)]
    if not own:
        assert refusal is None
        return
    assert refusal is not None and refusal.topics == own
    if len(own) == len(names):
        assert refusal.answer is not None and refusal.forward is None
    else:
        forwarded = REQUESTS[0].decode(refusal.forward, version=9)
        assert [t.name for t in forwarded.topic_data] == [n for n in names if not g.protects(n)]


# ------------------------------------------------------------------------------------------ the byte search


def _searched(api_key: int, frame: bytes) -> Request:
    """A request as the session read it, for the byte search (which reads its API key and frame only)."""
    return Request(RequestHeader(api_key, 9, 1, "c", 0), frame, True)


def test_the_byte_search_sees_names_and_ids_and_nothing_else():
    g = _guard()
    assert not g.may_name(_searched(0, _SIZE.pack(1) + _produce(9, ["mine"])))
    assert g.may_name(_searched(0, _produce(9, [OWN]))) and g.may_name(_searched(0, _produce(9, [LOG])))
    assert not g.may_name(_searched(18, b"__ktp_fleet_prod"))  # ApiVersions names no topic
    topic_id = uuid.uuid4()
    assert not g.may_name(_searched(1, b"x" + topic_id.bytes))
    g.learn({topic_id: OWN})
    assert g.may_name(_searched(1, b"x" + topic_id.bytes))


def test_a_large_produce_is_searched_outside_its_records_only():
    g = _guard()
    TD, PD = _cls(0, "topic_data"), _cls(0, "topic_data", "partition_data")

    def frame(topic: str, records: bytes) -> memoryview:
        body = _body(
            0,
            9,
            transactional_id=None,
            acks=-1,
            timeout_ms=1000,
            topic_data=[TD(version=9, name=topic, partition_data=[PD(version=9, index=0, records=records)])],
        )
        head = b"\x00\x00\x00\x09\x00\x00\x00\x01\x00\x01c\x00"  # Produce v9, client id "c", no tags (header v2)
        return memoryview(_SIZE.pack(len(head) + len(body)) + head + body)

    def read(frame: memoryview) -> Request:
        return read_request(parse_request_header(frame, 4), frame)

    big = b"__ktp_fleet_prod" * 8000  # records that merely contain the name: not a reason to decode
    assert not g.may_name(read(frame("mine", big)))
    assert g.may_name(read(frame(OWN, b"y" * 128_000)))


# ------------------------------------------------------------------------------------------ listings


def test_a_metadata_listing_leaves_the_own_topics_out_and_learns_their_ids():
    g = _guard()
    T = _cls(3, "topics", response=True)
    own_id, mine_id = uuid.uuid4(), uuid.uuid4()
    resp = RESPONSES[3](
        version=12,
        topics=[
            T(version=12, name=OWN, topic_id=own_id, error_code=0),
            T(version=12, name="mine", topic_id=mine_id, error_code=0),
        ],
    )
    body = filter_listing(g, 3, 12, bytes(resp.encode()))
    assert [t.name for t in RESPONSES[3].decode(body, version=12).topics] == ["mine"]
    assert g.ids == {own_id: OWN}
    assert filter_listing(g, 3, 12, RESPONSES[3](version=12).encode()) is None  # nothing to leave out: unchanged


# ------------------------------------------------------------------------------------------ the policy


class _Conn:
    def __init__(self) -> None:
        self.id, self.peer, self.label, self.client_id = "1", "127.0.0.1:1", "broker 1", "app"
        self.identity = type("I", (), {"principal": "mallory"})()
        self.upstream_addr = ("127.0.0.1", 9092)
        self.mute = None
        self.traffic = Traffic()
        self.policy_state = None


def _fleet_policy(monkeypatch, **quotas) -> Policy:
    monkeypatch.setenv("KTP_TEST_SECRET", "s" * 32)
    return Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "fleet": {"name": "prod", "secret_env": "KTP_TEST_SECRET"},
                "decision_log": {"topic": LOG, "directory": None},
                "quotas": {
                    "scope": "fleet",
                    "entities": [{"entity": {"user": "mallory"}, "quotas": quotas or {"consumer_byte_rate": 1e9}}],
                },
            }
        ),
        Stats(),
    )


def _frame(body: bytes, api: int, version: int) -> bytes:
    head = struct.pack(">hhih", api, version, 1, 3) + b"app"
    return _SIZE.pack(len(head) + len(body)) + head + body


def test_the_policy_answers_a_produce_to_the_fleet_topic_itself_and_counts_it(monkeypatch):
    policy = _fleet_policy(monkeypatch)
    assert policy.guard is not None
    frame = _frame(_produce(7, [OWN]), 0, 7)
    verdict = policy.on_request(_Conn(), read_request(parse_request_header(frame, 4), frame), 1.0)
    assert type(verdict) is Answer
    answer = RESPONSES[0].decode(verdict.frame[8:], version=7)
    assert _errors(answer.responses[0]) == [TOPIC_AUTHORIZATION_FAILED]
    assert policy.stats.protected_refusals == {"Produce": 1}


def test_the_policy_charges_what_a_mixed_produce_forwards_and_merges_the_refusal(monkeypatch):
    policy = _fleet_policy(monkeypatch, producer_byte_rate=1000)
    frame = _frame(_produce(7, ["mine", OWN]), 0, 7)
    header = parse_request_header(frame, 4)
    conn = _Conn()
    conn.mute = type(
        "M", (), {"hold": lambda self: None, "served": lambda self, s: None, "mute_for": lambda self, s: None}
    )()
    verdict = policy.on_request(conn, read_request(header, frame), 1.0)
    assert type(verdict) is Replace and verdict.whole
    d = verdict.decision
    assert type(d) is Decision and d.bytes_in == len(verdict.frame) - 4 < len(frame) - 4  # the bytes forwarded
    forwarded = REQUESTS[0].decode(verdict.frame[4 + header.body_offset :], version=7)
    assert [t.name for t in forwarded.topic_data] == ["mine"]
    TR, PR = _cls(0, "responses", response=True), _cls(0, "responses", "partition_responses", response=True)
    broker = bytes(
        RESPONSES[0](
            version=7, responses=[TR(version=7, name="mine", partition_responses=[PR(version=7, index=0)])]
        ).encode()
    )
    head = encode_response_header(1, False)
    pending = Pending(header, 1.0, d, whole=True)
    pieces = policy.on_response(conn, pending, memoryview(_SIZE.pack(len(head) + len(broker)) + head + broker), 1.0)
    merged = RESPONSES[0].decode(b"".join(bytes(p) for p in pieces)[8:], version=7)
    assert sorted(t.name for t in merged.responses) == sorted(["mine", OWN])


def test_without_own_topics_nothing_is_guarded():
    policy = Policy(ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]}}), Stats())
    assert policy.guard is None


def test_a_fleet_needs_a_secret():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="secret"):
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "fleet": {"name": "prod"},
                "quotas": {"scope": "fleet"},
            }
        )


def test_a_bad_frame_naming_an_own_topic_is_a_protocol_error(monkeypatch):
    policy = _fleet_policy(monkeypatch)
    frame = _frame(b"\x00\x00" + b"__ktp_fleet_prod" + b"\xff" * 3, 0, 7)
    with pytest.raises(ProtocolError):
        policy.on_request(_Conn(), read_request(parse_request_header(frame, 4), frame), 1.0)


# ------------------------------------------------------------------------------------------ the fleet's records


def test_only_records_with_a_members_mac_are_authentic():
    secret = b"k" * 32
    mac = record_mac(secret, "__ktp_fleet_a_quotas", b"key", b"value")
    good = [(MAC_HEADER, mac)]
    assert authentic(secret, "__ktp_fleet_a_quotas", b"key", b"value", good)
    assert not authentic(secret, "__ktp_fleet_a_quotas", b"key", b"value", None)
    assert not authentic(secret, "__ktp_fleet_a_quotas", b"key", b"value2", good)  # altered value
    assert not authentic(secret, "__ktp_fleet_a", b"key", b"value", good)  # replayed on the other topic
    assert not authentic(b"j" * 32, "__ktp_fleet_a_quotas", b"key", b"value", good)  # another secret
    assert record_mac(secret, "t", b"ab", b"c") != record_mac(secret, "t", b"a", b"bc")  # lengths frame the parts


def test_the_fleet_ignores_and_counts_a_forged_quota_record(monkeypatch):
    from proxy.fleet.member import FleetSync
    from proxy.fleet.parts import fleet_parts
    from quotas.fleet_reports import encode_quota_record

    monkeypatch.setenv("KTP_TEST_SECRET", "s" * 32)
    config = ProxyConfig.model_validate(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
            "fleet": {"name": "prod", "secret_env": "KTP_TEST_SECRET"},
            "quotas": {"scope": "fleet"},
        }
    )
    parts = fleet_parts(config)
    assert parts is not None
    policy = Policy(config, Stats(), fleet=parts)

    async def run():
        sync = FleetSync(config, policy.quotas, parts, policy.now_ms, policy.sources, policy.guard)
        from quotas.entities import QuotaEntity

        key, value = encode_quota_record(QuotaEntity(None, "mallory"), {"producer_byte_rate": 1e12})
        sync.take(sync.quota_topic, key, value, [])  # no MAC: what a tenant writes
        sync.take(sync.quota_topic, key, value, [(MAC_HEADER, b"\x00" * 32)])  # a wrong one
        assert sync.unauthenticated == 2
        assert policy.store.entities().get(QuotaEntity(None, "mallory")) is None
        sync.take(sync.quota_topic, key, value, sync._mac(sync.quota_topic, key, value))  # a member's
        assert sync.unauthenticated == 2 and sync.alters_taken_in == 1
        assert policy.store.entities()[QuotaEntity(None, "mallory")]["producer_byte_rate"] == 1e12

    asyncio.run(run())
