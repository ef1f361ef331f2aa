import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import ProduceResponse

from protocol.addresses import BrokerEndpoint, decode_addressed
from protocol.api_versions import cap_api_versions
from protocol.skim import SMALL_BODY_BYTES, layout, top_level_tags
from protocol.varint import TruncatedError, read_tagged_fields, skip_tagged_fields

FT = FetchResponse.FetchableTopicResponse
PD = FT.PartitionData
PT = ProduceResponse.TopicProduceResponse
PP = PT.PartitionProduceResponse


def _fetch(version, partitions, node_endpoints=()):
    parts = [
        PD(
            partition_index=i,
            error_code=err,
            high_watermark=10,
            last_stable_offset=10,
            log_start_offset=0,
            aborted_transactions=None if i % 2 else [PD.AbortedTransaction(producer_id=i, first_offset=3)],
            preferred_read_replica=-1,
            records=rec,
        )
        for i, (err, rec) in enumerate(partitions)
    ]
    ne = [FetchResponse.NodeEndpoint(node_id=n, host=h, port=p, rack=None) for n, h, p in node_endpoints]
    return FetchResponse(
        throttle_time_ms=17,
        error_code=0,
        session_id=5,
        responses=[FT(topic="t", topic_id=uuid.uuid4(), partitions=parts)],
        node_endpoints=ne,
        version=version,
    )


@settings(max_examples=60, deadline=None)
@given(
    version=st.integers(4, 18),
    partitions=st.lists(st.tuples(st.sampled_from([0, 6]), st.one_of(st.none(), st.binary(max_size=400))), max_size=6),
    with_endpoints=st.booleans(),
)
def test_fetch_layout_spans_the_whole_body(version, partitions, with_endpoints):
    eps = [(1, "broker-1", 9092)] if with_endpoints else []
    body = _fetch(version, partitions, eps).encode()
    lay = layout(FetchResponse, version, body)
    assert lay.end == len(body)
    start, end = lay.fields["throttle_time_ms"]
    assert struct.unpack(">i", body[start:end]) == (17,)
    assert (0 in lay.tags) == (with_endpoints and version >= 16)


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_layout_finds_throttle_after_the_responses(version):
    msg = ProduceResponse(
        responses=[
            PT(
                name="t",
                topic_id=uuid.uuid4(),
                partition_responses=[
                    PP(
                        index=0,
                        error_code=0,
                        base_offset=5,
                        log_append_time_ms=-1,
                        log_start_offset=0,
                        record_errors=[],
                        error_message=None,
                    )
                ],
            )
        ],
        throttle_time_ms=1234,
        node_endpoints=[],
        version=version,
    )
    body = msg.encode()
    lay = layout(ProduceResponse, version, body)
    start, end = lay.fields["throttle_time_ms"]
    assert struct.unpack(">i", body[start:end]) == (1234,)
    assert lay.end == len(body)


@settings(max_examples=80, deadline=None)
@given(
    version=st.integers(4, 18),
    partitions=st.lists(st.tuples(st.sampled_from([0, 6]), st.one_of(st.none(), st.binary(max_size=300))), max_size=4),
    with_endpoints=st.booleans(),
    cut=st.integers(0, 40),
    big=st.booleans(),
)
def test_top_level_tags_agree_with_the_layout(version, partitions, with_endpoints, cut, big):
    """The one-skip walk (every Produce v10+/Fetch v16+ response) sees the tags the per-field layout sees, and
    refuses exactly the bodies the layout refuses: small bodies (walked as bytes) and large ones (in place)."""
    eps = [(1, "broker-1", 9092)] if with_endpoints else []
    if big:
        partitions = [*partitions, (0, b"r" * (SMALL_BODY_BYTES + 1))]
    body = _fetch(version, partitions, eps).encode()
    body = body[: len(body) - cut]
    try:
        expected = tuple(layout(FetchResponse, version, body).tags)
    except TruncatedError:
        with pytest.raises(TruncatedError):
            top_level_tags(FetchResponse, version, body)
        return
    assert top_level_tags(FetchResponse, version, memoryview(body)) == expected
    if cut == 0:
        assert (0 in expected) == (with_endpoints and version >= 16)


def test_truncated_body_is_an_error():
    body = _fetch(16, [(0, b"x" * 50)]).encode()
    with pytest.raises(TruncatedError):
        layout(FetchResponse, 16, body[:-20])


def _to_proxy(ep: BrokerEndpoint):
    return "proxy", 20000 + ep.node_id


def test_tagged_fields_read_and_skipped_alike():
    # two tags (one with a 200-byte value: two-byte size varint), then a byte after the section
    section = b"\x02" + b"\x00\x03abc" + b"\x05\xc8\x01" + b"x" * 200
    buf = b"\xff" + section + b"!"
    fields, end = read_tagged_fields(buf, 1)
    assert fields == [(0, 4, 7), (5, 10, 210)]
    assert end == skip_tagged_fields(buf, 1) == len(buf) - 1
    assert skip_tagged_fields(b"\x00", 0) == 1
    with pytest.raises(TruncatedError):
        skip_tagged_fields(section[:-1], 0)
    with pytest.raises(TruncatedError):
        read_tagged_fields(b"\x01\x00", 0)


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_addresses_rewritten(version):
    B = MetadataResponse.MetadataResponseBroker
    T = MetadataResponse.MetadataResponseTopic
    tid = uuid.uuid4()
    msg = MetadataResponse(
        throttle_time_ms=0,
        brokers=[B(node_id=1, host="b1", port=9092, rack=None), B(node_id=2, host="b2", port=9093, rack="r")],
        cluster_id="c",
        controller_id=1,
        topics=[T(error_code=0, name="orders", topic_id=tid, is_internal=False, partitions=[])],
        error_code=0,
        version=version,
    )
    decoded = decode_addressed(3, version, msg.encode())
    assert [(e.node_id, e.host, e.port) for e in decoded.endpoints()] == [(1, "b1", 9092), (2, "b2", 9093)]
    if version >= 10:
        assert decoded.topic_ids() == {tid: "orders"}
    out = MetadataResponse.decode(decoded.encode(_to_proxy), version=version)
    assert [(b.host, b.port) for b in out.brokers] == [("proxy", 20001), ("proxy", 20002)]
    assert out.topics[0].name == "orders"


@pytest.mark.parametrize("version", range(0, 7))
def test_find_coordinator_single_and_list(version):
    C = FindCoordinatorResponse.Coordinator
    msg = FindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        node_id=3,
        host="b3",
        port=9094,
        coordinators=[
            C(key="g", node_id=3, host="b3", port=9094, error_code=0, error_message=None),
            C(key="h", node_id=-1, host="", port=-1, error_code=15, error_message="x"),
        ],
        version=version,
    )
    decoded = decode_addressed(10, version, msg.encode())
    assert [e.node_id for e in decoded.endpoints()] == [3]
    out = FindCoordinatorResponse.decode(decoded.encode(_to_proxy), version=version)
    if version >= 4:
        assert (out.coordinators[0].host, out.coordinators[0].port) == ("proxy", 20003)
        assert (out.coordinators[1].host, out.coordinators[1].port) == ("", -1)
    else:
        assert (out.host, out.port) == ("proxy", 20003)


@pytest.mark.parametrize("version", range(0, 3))
def test_describe_cluster(version):
    B = DescribeClusterResponse.DescribeClusterBroker
    msg = DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        endpoint_type=1,
        cluster_id="c",
        controller_id=1,
        brokers=[B(broker_id=7, host="b7", port=1, rack=None, is_fenced=False)],
        authorized_operations=None,
        version=version,
    )
    out = DescribeClusterResponse.decode(decode_addressed(60, version, msg.encode()).encode(_to_proxy), version=version)
    assert (out.brokers[0].host, out.brokers[0].port) == ("proxy", 20007)


def test_fetch_node_endpoints_rewritten_only_when_present():
    assert decode_addressed(1, 16, _fetch(16, [(0, b"abc")]).encode()) is None
    assert decode_addressed(1, 15, _fetch(15, [(6, None)]).encode()) is None
    decoded = decode_addressed(1, 16, _fetch(16, [(6, None)], [(2, "b2", 9093)]).encode())
    out = FetchResponse.decode(decoded.encode(_to_proxy), version=16)
    assert [(e.node_id, e.host, e.port) for e in out.node_endpoints] == [(2, "proxy", 20002)]


def test_api_versions_capped():
    K = ApiVersionsResponse.ApiVersion
    msg = ApiVersionsResponse(
        error_code=0,
        api_keys=[
            K(api_key=3, min_version=0, max_version=99),
            K(api_key=78, min_version=1, max_version=1),
            K(api_key=12, min_version=0, max_version=4),
        ],
        throttle_time_ms=0,
        version=3,
    )
    out = ApiVersionsResponse.decode(cap_api_versions(msg.encode(), 3, {3: 13}), version=3)
    assert [(k.api_key, k.max_version) for k in out.api_keys] == [(3, 13), (78, 1), (12, 4)]  # ShareFetch offered
    unchanged = ApiVersionsResponse(
        error_code=0, api_keys=[K(api_key=12, min_version=0, max_version=4)], throttle_time_ms=0, version=3
    )
    assert cap_api_versions(unchanged.encode(), 3, {3: 13}) is None


@pytest.mark.parametrize("version", [0, 7, 10, 12, 13])
def test_metadata_tells_each_topics_replication_factor(version):
    """The request quota's replicated-Produce term reads it (issue 50): a topic's largest replica count; a topic in
    error or with no partitions is not known."""
    T = MetadataResponse.MetadataResponseTopic
    P = T.MetadataResponsePartition

    def part(i: int, replicas: list[int]):
        return P(error_code=0, partition_index=i, leader_id=1, leader_epoch=0, replica_nodes=replicas, isr_nodes=[1],
                 offline_replicas=[])  # fmt: skip

    msg = MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=1, host="b1", port=9092, rack=None)],
        cluster_id="c",
        controller_id=1,
        topics=[
            T(error_code=0, name="three", topic_id=uuid.uuid4(), is_internal=False,
              partitions=[part(0, [1, 2]), part(1, [1, 2, 3])]),
            T(error_code=0, name="one", topic_id=uuid.uuid4(), is_internal=False, partitions=[part(0, [1])]),
            T(error_code=3, name="gone", topic_id=None, is_internal=False, partitions=[]),
        ],
        error_code=0,
        version=version,
    )  # fmt: skip
    decoded = decode_addressed(3, version, msg.encode())
    assert decoded.replication() == {"three": 3, "one": 1}
