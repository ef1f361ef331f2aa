"""The streaming walk must find the top-level tagged section exactly where the one-shot walk does,
however the body is cut into pieces."""

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse

from protocol.skim import layout
from protocol.tail_watch import TailWatch
from protocol.varint import TruncatedError

FT = FetchResponse.FetchableTopicResponse
PD = FT.PartitionData


def _fetch(version, partitions, endpoints, leader=False):
    parts = [
        PD(
            partition_index=i,
            error_code=err,
            high_watermark=10,
            last_stable_offset=10,
            log_start_offset=0,
            aborted_transactions=None if i % 2 else [PD.AbortedTransaction(producer_id=i, first_offset=3)],
            current_leader=PD.LeaderIdAndEpoch(leader_id=2, leader_epoch=7) if leader else None,
            preferred_read_replica=-1,
            records=rec,
        )
        for i, (err, rec) in enumerate(partitions)
    ]
    ne = [FetchResponse.NodeEndpoint(node_id=n, host=h, port=p, rack=None) for n, h, p in endpoints]
    return FetchResponse(
        throttle_time_ms=17,
        error_code=0,
        session_id=5,
        responses=[FT(topic="t", topic_id=uuid.uuid4(), partitions=parts)] * 2,
        node_endpoints=ne,
        version=version,
    ).encode()


def _walk_in_pieces(cls, version, body, cuts):
    watch = TailWatch(cls, version)
    start = 0
    for end in [*sorted(cuts), len(body)]:
        found = watch.feed(memoryview(body)[start:end])
        if found is not None:
            return start + found
        start = end
    return None


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(12, 18),
    partitions=st.lists(st.tuples(st.sampled_from([0, 6]), st.one_of(st.none(), st.binary(max_size=300))), max_size=5),
    endpoints=st.lists(st.tuples(st.integers(0, 5), st.text(max_size=20), st.integers(1, 65535)), max_size=3),
    leader=st.booleans(),
    data=st.data(),
)
def test_finds_the_tagged_section_wherever_the_body_is_cut(version, partitions, endpoints, leader, data):
    body = bytes(_fetch(version, partitions, endpoints, leader))
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    assert _walk_in_pieces(FetchResponse, version, body, cuts) == layout(FetchResponse, version, body).tags_offset


def test_one_byte_at_a_time():
    body = bytes(_fetch(16, [(0, b"r" * 200), (6, None)], [(1, "h", 9)], leader=True))
    assert _walk_in_pieces(FetchResponse, 16, body, range(len(body))) == layout(FetchResponse, 16, body).tags_offset


def test_big_record_sets_are_skipped_not_read():
    body = bytes(_fetch(17, [(0, b"x" * 3_000_000)] * 3, []))
    watch = TailWatch(FetchResponse, 17)
    assert watch.feed(memoryview(body)[:100]) is None
    assert watch._carry is None  # nothing buffered while skipping
    assert watch.feed(memoryview(body)[100:]) == layout(FetchResponse, 17, body).tags_offset - 100


def test_a_body_that_ends_early_is_not_done():
    body = bytes(_fetch(16, [(0, b"x" * 50)], []))
    watch = TailWatch(FetchResponse, 16)
    assert watch.feed(body[:-30]) is None
    assert not watch.done


def test_produce_response_too():
    msg = ProduceResponse(responses=[], throttle_time_ms=3, node_endpoints=[], version=11).encode()
    assert _walk_in_pieces(ProduceResponse, 11, bytes(msg), [1, 2]) == layout(ProduceResponse, 11, msg).tags_offset


def test_a_varint_longer_than_five_bytes_is_refused():
    watch = TailWatch(FetchResponse, 16)
    with pytest.raises(TruncatedError):
        watch.feed(b"\0" * 10 + b"\xff" * 8)


def test_non_flexible_versions_have_nothing_to_watch():
    with pytest.raises(ValueError):
        TailWatch(FetchResponse, 11)


# --- rewriting the held tagged section in place -------------------------------------------------

from protocol.addresses import BrokerEndpoint, _empty_prefix, rewrite_endpoints_tail  # noqa: E402


def _section(version, endpoints):
    body = bytes(_fetch(version, [], endpoints))
    return body[layout(FetchResponse, version, body).tags_offset :]


@settings(max_examples=150, deadline=None)
@given(
    version=st.integers(16, 18),
    endpoints=st.lists(
        st.tuples(st.integers(0, 9), st.text(max_size=40), st.integers(1, 65535)),
        min_size=1,
        max_size=4,
        unique_by=lambda e: e[0],
    ),
    proxy_host=st.text(min_size=1, max_size=60),
    unknown=st.sets(st.integers(0, 9)),
)
def test_rewritten_section_keeps_its_length_and_never_leaks_a_broker_address(version, endpoints, proxy_host, unknown):
    section = _section(version, endpoints)

    def mapping(ep: BrokerEndpoint):
        return None if ep.node_id in unknown else (proxy_host, 30000 + ep.node_id)

    new, seen = rewrite_endpoints_tail(1, version, section, mapping)
    assert len(new) == len(section)
    assert [(e.node_id, e.host, e.port) for e in seen] == endpoints
    decoded = FetchResponse.decode(_empty_prefix(1, version) + new, version=version)
    got = [(e.node_id, e.host, e.port) for e in decoded.node_endpoints]
    wanted = [(n, proxy_host, 30000 + n) for n, _, _ in endpoints if n not in unknown]
    assert got == wanted[: len(got)]  # a prefix of them: those that fit
    room = len(section) - len(_section(version, wanted))
    if room == 0 or room >= 2:
        assert got == wanted  # every endpoint fits, padded by a filler of 2 bytes or more


def test_a_section_without_endpoints_is_left_alone():
    assert rewrite_endpoints_tail(1, 16, b"\x00", lambda ep: ("p", 1)) is None


def test_a_section_that_does_not_parse_is_an_error():
    with pytest.raises(ValueError):
        rewrite_endpoints_tail(1, 16, b"\x01\x00\x30\x01", lambda ep: ("p", 1))


# --- the proxy side: StreamedTail over a whole frame ------------------------------------------

from proxy.wire.brokers import BrokerDirectory  # noqa: E402
from proxy.wire.responses import StreamedTail  # noqa: E402


async def _no_listener(node_id: int, port: int) -> int:
    raise AssertionError("StreamedTail must not start listeners itself")


def _directory(known):
    d = BrokerDirectory("proxy.example", None, _no_listener)
    for node in known:
        d.upstream[node] = ("127.0.0.1", 9000 + node)
        d.ports[node] = 40000 + node
    return d


def _frame(body: bytes) -> bytes:
    # size prefix, correlation id 7, empty header tags (response header v1)
    return struct.pack(">i", len(body) + 5) + struct.pack(">i", 7) + b"\x00" + body


@settings(max_examples=100, deadline=None)
@given(
    partitions=st.lists(st.one_of(st.none(), st.binary(max_size=500)), max_size=4),
    endpoints=st.lists(
        st.sampled_from([(1, "broker-1.internal", 9092), (2, "broker-2.internal", 9092), (5, "b5", 9)]),
        max_size=3,
        unique=True,
    ),
    data=st.data(),
)
def test_streamed_frame_comes_out_whole_with_addresses_rewritten(partitions, endpoints, data):
    body = bytes(_fetch(17, [(0, r) for r in partitions], endpoints))
    frame = _frame(body)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(frame) - 1), max_size=8))))
    pieces = [memoryview(frame)[a:b] for a, b in zip([0, *cuts], [*cuts, len(frame)], strict=True)]
    tail = StreamedTail(1, 17, 9, _directory(known=[1, 2]))
    out: list = []
    for i, piece in enumerate(pieces):
        tail.pass_on([piece], i == len(pieces) - 1, out)
        if i < len(pieces) - 1:  # nothing but the tagged section is ever held back
            section_at = 9 + layout(FetchResponse, 17, body).tags_offset
            assert sum(map(len, out)) == min(section_at, sum(map(len, pieces[: i + 1])))
    result = b"".join(bytes(p) for p in out)
    assert len(result) == len(frame)
    assert result[:9] == frame[:9]
    decoded = FetchResponse.decode(result[9:], version=17)
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [
        (n, "proxy.example", 40000 + n) for n, _, _ in endpoints if n in (1, 2)
    ][: len(decoded.node_endpoints)]
    assert [(e.node_id, e.host) for e in tail.missing] == [(n, h) for n, h, _ in endpoints if n == 5]
    assert all(b"internal" not in bytes(p) for p in out)


def test_a_frame_that_ends_before_its_tagged_section_is_an_error():
    body = bytes(_fetch(17, [(0, b"x" * 100)], []))
    frame = _frame(body)
    truncated = frame[:-40]
    tail = StreamedTail(1, 17, 9, _directory([]))
    with pytest.raises(ValueError, match="before its tagged fields"):
        tail.pass_on([memoryview(truncated)], True, [])
