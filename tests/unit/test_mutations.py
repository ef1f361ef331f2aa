"""KIP-599 request splitting and response merging for CreateTopics, DeleteTopics and CreatePartitions."""

import random
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

from protocol.apis import DecodeError
from protocol.mutations import (
    STRICT_SINCE,
    THROTTLING_QUOTA_EXCEEDED,
    CreateTopic,
    DeleteTopic,
    NewPartitions,
    is_strict,
    merge_response,
    parse_request,
    parse_results,
    quota_message,
    reject_all,
    subset_request,
)
from protocol.skim import layout

CT, DT, CP = 19, 20, 37
REQ = {CT: CreateTopicsRequest, DT: DeleteTopicsRequest, CP: CreatePartitionsRequest}
RESP = {CT: CreateTopicsResponse, DT: DeleteTopicsResponse, CP: CreatePartitionsResponse}
RESULTS = {CT: "topics", DT: "responses", CP: "results"}
ALL = [(api, v) for api in (CT, DT, CP) for v in range(REQ[api].max_version + 1)]
STRICT = [(api, v) for api, v in ALL if v >= STRICT_SINCE[api]]


def _id(i):
    return uuid.UUID(int=0x1000 + i)


def topic_spec(i, rnd=None):
    """Varied per-topic parameters, deterministic for index i unless a Random is given."""
    r = rnd or random.Random(i)
    return {
        "name": f"topic-{i}-{r.randrange(1000)}",
        "partitions": r.choice([-1, 1, 3, 12]),
        "rf": r.choice([-1, 1, 3]),
        "assign": r.choice([0, 0, 2]),
        "configs": r.choice([0, 1]),
        "by_id": r.random() < 0.5,
        "count": r.randrange(2, 50),
    }


def build_request(api, version, specs, timeout=30000, validate_only=False):
    cls = REQ[api]
    if api == CT:
        T = cls.CreatableTopic
        A = T.fields["assignments"].array_of.data_class
        C = T.fields["configs"].array_of.data_class
        topics = [
            T(
                name=s["name"],
                num_partitions=-1 if s["assign"] else s["partitions"],
                replication_factor=s["rf"],
                assignments=[A(partition_index=p, broker_ids=[1, 2]) for p in range(s["assign"])],
                configs=[C(name="cleanup.policy", value="compact")] * s["configs"],
            )
            for s in specs
        ]
        return cls(topics=topics, timeout_ms=timeout, validate_only=validate_only, version=version)
    if api == CP:
        T = cls.CreatePartitionsTopic
        A = T.fields["assignments"].array_of.data_class
        topics = [
            T(
                name=s["name"],
                count=s["count"],
                assignments=None if not s["assign"] else [A(broker_ids=[1]) for _ in range(s["assign"])],
            )
            for s in specs
        ]
        return cls(topics=topics, timeout_ms=timeout, validate_only=validate_only, version=version)
    if version >= 6:
        S = cls.DeleteTopicState
        topics = [
            S(name=None, topic_id=_id(i)) if s["by_id"] else S(name=s["name"], topic_id=None)
            for i, s in enumerate(specs)
        ]
        return cls(topics=topics, timeout_ms=timeout, version=version)
    return cls(topic_names=[s["name"] for s in specs], timeout_ms=timeout, version=version)


def broker_answer(api, version, sent_body, throttle, rnd=None):
    """What a broker would answer to the (subset) request ``sent_body``: success per topic, maybe reordered."""
    req = REQ[api].decode(sent_body, version=version)
    cls = RESP[api]
    R = cls._struct.fields[RESULTS[api]].array_of.data_class
    items = []
    if api == CT:
        for t in req.topics:
            items.append(
                R(
                    version=version,
                    name=t.name,
                    topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, t.name),
                    error_code=0,
                    error_message=None,
                    num_partitions=max(t.num_partitions, 1),
                    replication_factor=3,
                    configs=[],
                )
            )
    elif api == CP:
        items = [R(version=version, name=t.name, error_code=0, error_message=None) for t in req.topics]
    elif version >= 6:
        for t in req.topics:  # the broker resolves names <-> ids
            items.append(
                R(
                    version=version,
                    name=t.name or f"resolved-{t.topic_id}",
                    topic_id=t.topic_id or uuid.uuid5(uuid.NAMESPACE_DNS, t.name),
                    error_code=0,
                    error_message=None,
                )
            )
    else:
        items = [R(version=version, name=n, error_code=0, error_message=None) for n in req.topic_names]
    if rnd is not None:
        rnd.shuffle(items)
    return cls(version=version, throttle_time_ms=throttle, **{RESULTS[api]: items}).encode()


def results_of(api, version, body):
    return getattr(RESP[api].decode(body, version=version), RESULTS[api])


# --- which versions exist ------------------------------------------------------------------------------


def test_versions_kafka_python_knows():
    assert [REQ[a].max_version for a in (CT, DT, CP)] == [7, 6, 3]
    assert [RESP[a].max_version for a in (CT, DT, CP)] == [7, 6, 3]
    assert not is_strict(CT, 5) and is_strict(CT, 6) and is_strict(CT, 7)
    assert not is_strict(DT, 4) and is_strict(DT, 5)
    assert not is_strict(CP, 2) and is_strict(CP, 3)
    assert not is_strict(3, 12)


def test_kafka_python_decodes_flexible_versions_as_specified():
    """Hand-encoded per the Kafka protocol spec (compact strings/arrays = length + 1, tag sections)."""
    # DeleteTopics v6 request: topics [ {name: null, id}, {name: "ab", id: 0} ], timeout 7, no tags
    body = b"\x03" + b"\x00" + _id(1).bytes + b"\x00" + b"\x03ab" + bytes(16) + b"\x00" + struct.pack(">i", 7) + b"\x00"
    req = parse_request(DT, 6, body)
    assert req.topics == (DeleteTopic(0, None, _id(1)), DeleteTopic(1, "ab", None)) and req.timeout_ms == 7
    # CreateTopics v5 request: one topic "t", 4 partitions, rf 2, no assignments, one config (k, null)
    body = (
        b"\x02"
        + b"\x02t"
        + struct.pack(">ih", 4, 2)
        + b"\x01"
        + b"\x02"
        + b"\x02k"
        + b"\x00"
        + b"\x00"
        + b"\x00"
        + struct.pack(">i", 100)
        + b"\x01"
        + b"\x00"
    )
    req = parse_request(CT, 5, body)
    assert req.topics == (CreateTopic(0, "t", 4, 2, 0),) and req.validate_only and req.timeout_ms == 100
    # CreatePartitions v3 response: throttle 9, results [ {"x", 89, "m"} ], no tags
    body = struct.pack(">i", 9) + b"\x02" + b"\x02x" + struct.pack(">h", 89) + b"\x02m" + b"\x00" + b"\x00"
    msg = CreatePartitionsResponse.decode(body, version=3)
    assert (msg.throttle_time_ms, msg.results[0].name, msg.results[0].error_code, msg.results[0].error_message) == (
        9,
        "x",
        89,
        "m",
    )
    assert msg.encode() == body


# --- requests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "version"), ALL)
def test_request_round_trip_every_version(api, version):
    specs = [topic_spec(i) for i in range(6)]
    validate = api != DT and (api == CP or version >= 1)
    msg = build_request(api, version, specs, timeout=1234, validate_only=validate)
    body = msg.encode()
    req = parse_request(api, version, memoryview(body))
    assert len(req.topics) == 6 and [t.index for t in req.topics] == list(range(6))
    assert req.timeout_ms == 1234 and req.validate_only == validate and not req.duplicates
    assert req.strict == is_strict(api, version) and req.splittable == req.strict
    for t, s, i in zip(req.topics, specs, range(6), strict=True):
        if api == CT:
            assert isinstance(t, CreateTopic) and t.name == s["name"] and t.replication_factor == s["rf"]
            assert t.assignments == s["assign"]
            expected = s["assign"] or (None if s["partitions"] < 0 else s["partitions"])
            assert t.partitions == expected
        elif api == CP:
            assert t == NewPartitions(i, s["name"], s["count"], s["assign"])
        elif version >= 6 and s["by_id"]:
            assert t == DeleteTopic(i, None, _id(i)) and t.key == _id(i)
        else:
            assert t == DeleteTopic(i, s["name"], None) and t.key == s["name"]
    # keeping everything gives back the very same bytes
    assert subset_request(req, range(6)) == body
    # a subset is what kafka-python would encode for those topics, everything else preserved
    keep = [4, 1, 3]  # order of the argument does not matter: request order is kept
    expected = build_request(api, version, [specs[i] for i in sorted(keep)], timeout=1234, validate_only=validate)
    if api == DT and version >= 6:
        expected.topics = [msg.topics[i] for i in sorted(keep)]
    sub = subset_request(req, keep)
    assert sub == expected.encode()
    assert REQ[api].decode(sub, version=version) == expected
    assert REQ[api].decode(subset_request(req, []), version=version).timeout_ms == 1234


@pytest.mark.parametrize(("api", "version"), [(CT, 5), (CT, 7), (DT, 4), (DT, 6), (CP, 2), (CP, 3)])
def test_subset_keeps_unknown_tagged_fields(api, version):
    """kafka-python drops unknown tags on re-encode; splicing must not."""
    specs = [topic_spec(i) for i in range(3)]
    body = bytearray(build_request(api, version, specs).encode())
    assert body[-1] == 0
    body[-1:] = b"\x01\x05\x02\xaa\xbb"  # top-level tag 5, two bytes
    cls = REQ[api]
    field = "topic_names" if api == DT and version < 6 else "topics"
    lay = layout(cls, version, bytes(body))
    if field == "topics":  # tag the last topic too: its tag section is the byte just before the array end
        end = lay.fields[field][1]
        assert body[end - 1] == 0
        body[end - 1 : end] = b"\x01\x07\x01\xcc"
    req = parse_request(api, version, bytes(body))
    sub = subset_request(req, [0, 2])
    sub_lay = layout(cls, version, sub)
    assert sub_lay.tags == {5: (sub_lay.tags[5][0], sub_lay.tags[5][0] + 2)}
    assert sub.endswith(b"\x01\x05\x02\xaa\xbb")
    if field == "topics":
        assert b"\x01\x07\x01\xcc" in sub
    assert len(getattr(REQ[api].decode(sub, version=version), field)) == 2


@pytest.mark.parametrize(("api", "version"), [(CT, 7), (CT, 2), (DT, 6), (DT, 5), (CP, 3)])
def test_duplicates_are_flagged_and_not_split(api, version):
    specs = [topic_spec(i) for i in range(4)]
    specs[3] = dict(specs[1])
    if api == DT and version >= 6:
        specs = [dict(s, by_id=False) for s in specs]
    req = parse_request(api, version, build_request(api, version, specs).encode())
    assert req.duplicates == {specs[1]["name"]} and not req.splittable
    with pytest.raises(ValueError, match="more than once"):
        subset_request(req, [0])


def test_delete_topics_v6_duplicate_ids_and_name_vs_id():
    S = DeleteTopicsRequest.DeleteTopicState
    msg = DeleteTopicsRequest(
        topics=[
            S(name=None, topic_id=_id(1)),
            S(name="a", topic_id=None),
            S(name="x", topic_id=_id(1)),
            S(name=None, topic_id=_id(2)),
        ],
        timeout_ms=1,
        version=6,
    )
    req = parse_request(DT, 6, msg.encode())
    assert req.duplicates == {_id(1)}  # Kafka keys an entry by its id when it has one
    ok = parse_request(
        DT,
        6,
        DeleteTopicsRequest(
            topics=[S(name="a", topic_id=None), S(name=None, topic_id=_id(3))], timeout_ms=1, version=6
        ).encode(),
    )
    assert ok.splittable and not ok.duplicates


def test_create_topic_partitions_rule():
    assert CreateTopic(0, "t", -1, -1, 0).partitions is None  # broker default, caller resolves
    assert CreateTopic(0, "t", 6, 3, 0).partitions == 6
    assert CreateTopic(0, "t", -1, -1, 4).partitions == 4  # explicit assignments decide


@pytest.mark.parametrize(("api", "version"), [(CT, 7), (DT, 6), (DT, 3), (CP, 3), (CP, 0)])
def test_bad_bodies_raise_decode_error_naming_api_and_version(api, version):
    body = build_request(api, version, [topic_spec(i) for i in range(3)]).encode()
    for bad in (body[: len(body) // 2], body[:3], b"", b"\xff" * 40):
        with pytest.raises(DecodeError, match=rf"v{version}"):
            parse_request(api, version, bad)
    with pytest.raises(DecodeError):
        parse_request(api, REQ[api].max_version + 1, body)
    with pytest.raises(ValueError):
        parse_request(3, 1, body)
    # a broker body that does not parse
    if is_strict(api, version):
        req = parse_request(api, version, body)
        with pytest.raises(DecodeError):
            merge_response(req, b"\x00\x00\x00\x01\x00\x00\x00\x09", [0], 10)


# --- responses -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "version"), STRICT)
def test_reject_all_decodes_at_every_strict_version(api, version):
    specs = [topic_spec(i) for i in range(5)]
    req = parse_request(api, version, build_request(api, version, specs).encode())
    body = reject_all(req, 4321)
    msg = RESP[api].decode(body, version=version)
    assert msg.throttle_time_ms == 4321
    results = getattr(msg, RESULTS[api])
    assert len(results) == 5
    for t, r in zip(req.topics, results, strict=True):
        assert r.error_code == THROTTLING_QUOTA_EXCEEDED == 89
        assert r.error_message == quota_message(4321) and "controller_mutation_rate" in r.error_message
        assert "4321 ms" in r.error_message
        if api == CT:
            assert (r.name, r.num_partitions, r.replication_factor, r.configs) == (t.name, -1, -1, [])
        elif api == DT and version >= 6:
            assert (r.name, r.topic_id) == (t.name, t.topic_id)
            if t.topic_id is not None:
                assert r.name is None  # by id: echo the id, the name is unknown
        else:
            assert r.name == t.name
    custom = RESP[api].decode(reject_all(req, 2**40, message="m", error_code=7), version=version)
    assert custom.throttle_time_ms == 2**31 - 1 and getattr(custom, RESULTS[api])[0].error_message == "m"
    assert getattr(custom, RESULTS[api])[0].error_code == 7


@pytest.mark.parametrize(("api", "version"), [(a, v) for a, v in ALL if not is_strict(a, v)])
def test_response_builders_refuse_versions_without_error_89(api, version):
    req = parse_request(api, version, build_request(api, version, [topic_spec(0)]).encode())
    assert not req.splittable
    with pytest.raises(ValueError, match="predates"):
        reject_all(req, 10)
    with pytest.raises(ValueError, match="predates"):
        merge_response(req, b"", [0], 10)


@pytest.mark.parametrize(("api", "version"), STRICT)
@pytest.mark.parametrize(("broker_ms", "proxy_ms"), [(0, 2500), (9000, 2500)])
def test_merge_interleaves_in_request_order(api, version, broker_ms, proxy_ms):
    specs = [topic_spec(i) for i in range(7)]
    req = parse_request(api, version, build_request(api, version, specs).encode())
    rejected = [0, 2, 3, 6]
    admitted = [1, 4, 5]
    sent = subset_request(req, admitted)
    answer = broker_answer(api, version, sent, broker_ms, rnd=random.Random(3))  # out of order
    merged = merge_response(req, answer, rejected, proxy_ms)
    msg = RESP[api].decode(merged, version=version)
    assert msg.throttle_time_ms == max(broker_ms, proxy_ms)
    results = getattr(msg, RESULTS[api])
    assert len(results) == 7
    for t, r in zip(req.topics, results, strict=True):
        if t.index in rejected:
            assert r.error_code == 89
        else:
            assert r.error_code == 0
        if api == DT and version >= 6 and t.topic_id is not None:
            assert r.topic_id == t.topic_id
        else:
            assert r.name == t.name


@pytest.mark.parametrize(("api", "version"), [(CT, 7), (DT, 6), (CP, 3)])
def test_merge_keeps_broker_extras(api, version):
    """Unknown tags from the broker survive; a result matching no admitted topic is kept, at the end; an
    admitted topic the broker did not answer is not invented."""
    specs = [dict(topic_spec(i), by_id=False) for i in range(3)]
    req = parse_request(api, version, build_request(api, version, specs).encode())
    answer = bytearray(broker_answer(api, version, subset_request(req, [1, 2]), 5))
    answer[-1:] = b"\x01\x09\x01\xee"
    merged = merge_response(req, bytes(answer), [0], 1)
    assert merged.endswith(b"\x01\x09\x01\xee")
    assert [r.name for r in results_of(api, version, merged)] == [s["name"] for s in specs]
    # broker answered an extra, unknown topic and skipped topic 2
    cls = RESP[api]
    R = cls._struct.fields[RESULTS[api]].array_of.data_class
    extra = R(version=version, name="stranger", error_code=37, error_message=None)
    mine = results_of(api, version, broker_answer(api, version, subset_request(req, [1]), 5))
    odd = cls(version=version, throttle_time_ms=5, **{RESULTS[api]: [extra, *mine]}).encode()
    names = [r.name for r in results_of(api, version, merge_response(req, odd, [0], 1))]
    assert names == [specs[0]["name"], specs[1]["name"], "stranger"]


@settings(max_examples=150, deadline=None)
@given(
    api_version=st.sampled_from(STRICT),
    n=st.integers(1, 9),
    data=st.data(),
    broker_ms=st.integers(0, 20000),
    proxy_ms=st.integers(0, 20000),
    seed=st.integers(0, 2**16),
)
def test_random_splits_merge_back_in_order(api_version, n, data, broker_ms, proxy_ms, seed):
    api, version = api_version
    rnd = random.Random(seed)
    specs = [topic_spec(i, rnd) for i in range(n)]
    for i, s in enumerate(specs):
        s["name"] = f"t{i}-{s['name']}"  # unique
    req = parse_request(api, version, build_request(api, version, specs, validate_only=api != DT).encode())
    assert req.splittable
    rejected = sorted(data.draw(st.sets(st.integers(0, n - 1))))
    admitted = [i for i in range(n) if i not in rejected]
    sent = subset_request(req, admitted)
    sent_req = parse_request(api, version, sent)
    assert [t.key for t in sent_req.topics] == [req.topics[i].key for i in admitted]
    assert (sent_req.timeout_ms, sent_req.validate_only) == (req.timeout_ms, req.validate_only)
    if admitted:
        merged = merge_response(req, broker_answer(api, version, sent, broker_ms, rnd), rejected, proxy_ms)
        expected_ms = max(broker_ms, proxy_ms)
    else:
        merged = reject_all(req, proxy_ms)
        expected_ms = proxy_ms
    msg = RESP[api].decode(merged, version=version)
    assert msg.throttle_time_ms == expected_ms
    results = getattr(msg, RESULTS[api])
    assert [r.error_code for r in results] == [89 if i in rejected else 0 for i in range(n)]
    for t, r in zip(req.topics, results, strict=True):
        if isinstance(t, DeleteTopic) and t.topic_id is not None:
            assert r.topic_id == t.topic_id
        else:
            assert r.name == t.name


@pytest.mark.parametrize(("api", "version"), ALL)
def test_results_say_what_the_cluster_did_with_each_topic_at_every_version(api, version):
    """What the proxy learns counts from (proxy.rules.topic_counts): names, ids and created partitions where the version
    carries them, and every error code."""
    specs = [topic_spec(i) for i in range(3)]
    body = bytes(build_request(api, version, specs).encode())
    results = parse_results(api, version, broker_answer(api, version, body, throttle=0))
    assert len(results) == 3 and {r.error_code for r in results} == {0}
    if api == CT:
        assert [r.name for r in results] == [s["name"] for s in specs]
        assert all(
            r.num_partitions == (max(s["partitions"], 1) if version >= 5 else -1)
            for r, s in zip(results, specs, strict=True)
        )
        assert all((r.topic_id is not None) == (version >= 7) for r in results)
    else:
        assert {r.num_partitions for r in results} == {-1}
    if api == DT and version >= 6:
        assert all(r.topic_id is not None for r in results)
    with pytest.raises(DecodeError, match=f"v{version}"):
        parse_results(api, version, b"\x00")
