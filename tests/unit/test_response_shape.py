"""The per-connection memo that lets a Produce/Fetch response shaped like the last one skip the node_endpoints walk
(``protocol.endpoint_apis.ResponseShape``): it must never hide a tag, nor accept a body the walk would refuse."""

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse

from protocol.apis import Api
from protocol.endpoint_apis import ResponseShape, tags_endpoints
from protocol.varint import TruncatedError

PT = ProduceResponse.TopicProduceResponse
PP = PT.PartitionProduceResponse


def _produce(
    version: int,
    offsets: list[int],
    throttle: int = 0,
    error_message: str | None = None,
    endpoints: bool = False,
    topic: str = "orders",
) -> bytes:
    parts = [
        PP(
            index=i,
            error_code=0 if error_message is None else 6,
            base_offset=o,
            log_append_time_ms=-1,
            log_start_offset=o // 2,
            record_errors=[],
            error_message=error_message,
        )
        for i, o in enumerate(offsets)
    ]
    ne = [ProduceResponse.NodeEndpoint(node_id=1, host="broker-1", port=9092, rack=None)] if endpoints else []
    body = ProduceResponse(
        responses=[PT(name=topic, topic_id=uuid.UUID(int=7), partition_responses=parts)],
        throttle_time_ms=throttle,
        node_endpoints=ne,
        version=version,
    ).encode()
    return bytes(body)


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_a_producers_next_response_is_not_walked(version):
    shape = ResponseShape()
    first = _produce(version, [100])
    assert not shape.matches(Api.PRODUCE, version, first)
    assert tags_endpoints(Api.PRODUCE, version, first, shape) is False
    # Only the offsets, the log start offset and the throttle time moved: fixed-size fields.
    following = _produce(version, [7_000_123], throttle=250)
    assert len(following) == len(first) and following != first
    assert shape.matches(Api.PRODUCE, version, following)
    assert tags_endpoints(Api.PRODUCE, version, following, shape) is False
    assert not shape.matches(Api.PRODUCE, version - 1, following)  # another version is walked again
    assert not shape.matches(Api.FETCH, version, following)


@pytest.mark.parametrize("version", [10, 12])
def test_a_response_that_changes_shape_is_walked_again(version):
    shape = ResponseShape()
    assert tags_endpoints(Api.PRODUCE, version, _produce(version, [1]), shape) is False
    # A new leader: error, current_leader and node_endpoints; the walk finds the tag.
    moved = _produce(version, [1], error_message="not leader", endpoints=True)
    assert not shape.matches(Api.PRODUCE, version, moved)
    assert tags_endpoints(Api.PRODUCE, version, moved, shape) is True
    # A topic name of another length is walked and kept; one of the same length is not walked (letters steer
    # nothing, lengths do).
    renamed = _produce(version, [1], topic="order")
    assert tags_endpoints(Api.PRODUCE, version, renamed, shape) is False
    assert shape.body == renamed
    assert shape.matches(Api.PRODUCE, version, _produce(version, [9], topic="bills"))


def test_a_truncated_body_is_still_refused():
    shape = ResponseShape()
    body = _produce(11, [5, 6])
    assert tags_endpoints(Api.PRODUCE, 11, body, shape) is False
    with pytest.raises(TruncatedError):
        tags_endpoints(Api.PRODUCE, 11, body[:-9], shape)


def _fetch(version: int, records: list[bytes | None], endpoints: bool) -> bytes:
    pd = FetchResponse.FetchableTopicResponse.PartitionData
    parts = [
        pd(
            partition_index=i,
            error_code=0,
            high_watermark=10 + i,
            last_stable_offset=10,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=r,
        )
        for i, r in enumerate(records)
    ]
    ne = [FetchResponse.NodeEndpoint(node_id=2, host="b", port=1, rack=None)] if endpoints else []
    body = FetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=5,
        node_endpoints=ne,
        version=version,
        responses=[FetchResponse.FetchableTopicResponse(topic="t", topic_id=uuid.UUID(int=1), partitions=parts)],
    ).encode()
    return bytes(body)


def _verdict(api_key: int, version: int, body: bytes, shape: ResponseShape | None):
    try:
        return tags_endpoints(api_key, version, body, shape)
    except TruncatedError:
        return "truncated"


@settings(max_examples=150, deadline=None)
@given(
    fetch=st.booleans(),
    version=st.integers(16, 17),
    seeds=st.lists(
        st.tuples(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=3), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    flips=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(1, 255)), max_size=12),
)
def test_the_memo_never_changes_a_verdict(fetch, version, seeds, flips):
    """Any run of bodies (real responses, then copies with bytes flipped anywhere, structure included) gets the
    same answer through one connection's memo as walked afresh: tag, no tag, or truncated."""
    version = version if fetch else version - 5  # Produce v11, v12
    api = Api.FETCH if fetch else Api.PRODUCE
    bodies = [
        _fetch(version, recs, eps) if fetch else _produce(version, [len(r or b"") for r in recs] or [0], endpoints=eps)
        for recs, eps in seeds
    ]
    for which, at, xor in flips:
        base = bytearray(bodies[which % len(bodies)])
        if base:
            base[at % len(base)] ^= xor
        bodies.append(bytes(base))
    shape = ResponseShape()
    for body in bodies:
        assert _verdict(api, version, body, shape) == _verdict(api, version, body, None)


def test_the_memo_holds_one_small_body():
    shape = ResponseShape()
    big = _fetch(16, [b"x" * 5000], endpoints=False)
    assert tags_endpoints(Api.FETCH, 16, big, shape) is False
    assert shape.body == b""  # large bodies are walked in place and not kept
    small = _fetch(16, [b"x" * 50], endpoints=False)
    tags_endpoints(Api.FETCH, 16, small, shape)
    tags_endpoints(Api.FETCH, 16, _fetch(16, [b"y" * 60], endpoints=False), shape)
    assert len(shape.body) < 200 and shape.gaps and len(shape.gaps) % 2 == 0
