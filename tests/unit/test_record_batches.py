"""Producer-id scanning of Produce requests, checked against kafka-python's own encoders and record readers."""

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from protocol.headers import parse_request_header
from protocol.record_batches import (
    RecordBatchError,
    batch_producer_ids,
    iter_partition_records,
    producer_ids,
    producer_ids_and_shape,
    single_producer_id,
)

TD = ProduceRequest.TopicProduceData
PD = TD.PartitionProduceData
VERSIONS = list(range(ProduceRequest.min_version, ProduceRequest.max_version + 1))
FLEXIBLE = [v for v in VERSIONS if ProduceRequest.flexible_version_q(v)]


def _records(pid: int = -1, magic: int = 2, count: int = 3, value_size: int = 50, compression: int = 0) -> bytes:
    """One batch (magic 2) or legacy message set (magic 0/1) built by kafka-python's producer code."""
    if magic == 2 and pid != -1:
        b = MemoryRecordsBuilder(2, compression, 1 << 20, producer_id=pid, producer_epoch=3, base_sequence=0)
    else:
        b = MemoryRecordsBuilder(magic, compression, 1 << 20)
    for i in range(count):
        assert b.append(1_700_000_000_000 + i, b"key%d" % i, b"v" * value_size) is not None
    b.close()
    return bytes(b.buffer())


def _produce(version: int, topics: list[list[bytes | None]], txn: str | None = None) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=txn,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            TD(
                name=f"topic-{t}",
                topic_id=uuid.UUID(int=t + 1),
                partition_data=[PD(index=p, records=r) for p, r in enumerate(parts)],
            )
            for t, parts in enumerate(topics)
        ],
        version=version,
    )


def _oracle(topics: list[list[bytes | None]]) -> set[int]:
    """Producer ids as kafka-python's full record reader sees them (the independent answer)."""
    out = set()
    for parts in topics:
        for rec in parts:
            if rec is None:
                continue
            mr = MemoryRecords(rec)
            while mr.has_next():
                batch = mr.next_batch()
                pid = getattr(batch, "producer_id", None)
                if pid is not None and pid != -1:
                    out.add(pid)
    return out


MIXED = [
    [_records(1000) + _records(1001, compression=1) + _records(-1), None, _records(1000)],
    [_records(magic=0), _records(magic=1) + _records(2**62 + 5)],
    [],
    [_records(-1)],
]


def test_produce_versions_cover_flexible_and_topic_ids():
    assert VERSIONS[0] == 0 and VERSIONS[-1] >= 13
    assert FLEXIBLE[0] == 9


@pytest.mark.parametrize("version", VERSIONS)
def test_mixed_batches_at_every_version(version):
    body = bytes(_produce(version, MIXED, txn="tx-1").encode())
    assert producer_ids(body, version) == _oracle(MIXED) == {1000, 1001, 2**62 + 5}
    spans = [bytes(mv) for mv in iter_partition_records(body, version)]
    assert spans == [r for parts in MIXED for r in parts if r is not None]


@pytest.mark.parametrize("version", [3, 8, 9, 12, 13])
def test_whole_frame_with_header_offset(version):
    msg = _produce(version, MIXED)
    msg.with_header(correlation_id=9, client_id="producer-1")
    frame = bytes(msg.encode(header=True))
    header = parse_request_header(frame)
    assert header.body_offset is not None
    assert producer_ids(memoryview(frame), version, header.body_offset) == {1000, 1001, 2**62 + 5}


def test_records_are_not_copied():
    body = bytearray(_produce(11, MIXED).encode())
    views = list(iter_partition_records(body, 11))
    assert views and all(mv.obj is body for mv in views)


def test_v13_names_topics_by_id_only():
    a, b = _records(7), _records(8)
    body = bytes(_produce(13, [[a], [b]]).encode())
    assert b"topic-0" not in body  # really the topic-id layout
    assert producer_ids(body, 13) == {7, 8}


def test_no_topics_null_records_and_non_idempotent():
    assert producer_ids(bytes(_produce(9, []).encode()), 9) == set()
    assert producer_ids(bytes(_produce(3, [[None, None]]).encode()), 3) == set()
    assert producer_ids(bytes(_produce(10, [[_records(-1)], [_records(magic=1)]]).encode()), 10) == set()


def test_batch_producer_ids_in_order():
    rec = _records(5) + _records(-1) + _records(magic=0) + _records(5) + _records(6)
    assert batch_producer_ids(rec) == [5, -1, 5, 6]


def test_many_partitions_and_large_records():
    topics = [[_records(i % 3, count=16, value_size=1024) for i in range(50)]]
    body = bytes(_produce(11, topics).encode())
    assert producer_ids(body, 11) == {0, 1, 2}


@pytest.mark.parametrize(
    ("records", "needle"),
    [
        (_records(5)[:-1], "past the end of the records field"),
        (_records(5) + b"\x00" * 10, "shorter than a batch header"),
        (_records(5)[:16] + b"\x07" + _records(5)[17:], "unknown magic 7"),
        (_records(5)[:8] + (20).to_bytes(4, "big") + _records(5)[12:32], "shorter than a magic 2 header"),
        (_records(5)[:8] + (-5).to_bytes(4, "big", signed=True) + _records(5)[12:], "length -5"),
    ],
)
def test_malformed_batches_name_the_problem(records, needle):
    body = bytes(_produce(9, [[_records(1), records]]).encode())
    with pytest.raises(RecordBatchError, match=needle) as info:
        producer_ids(body, 9)
    assert "Produce v9" in str(info.value)
    with pytest.raises(RecordBatchError):
        batch_producer_ids(records)


def test_records_length_past_the_body():
    body = bytearray(_produce(3, [[_records(1)]]).encode())
    with pytest.raises(RecordBatchError, match="run past the end of the body"):
        producer_ids(body[:-1], 3)
    with pytest.raises(RecordBatchError, match=r"topic #0 partition #0"):
        producer_ids(body[:-1], 3)


def test_unsupported_version():
    with pytest.raises(RecordBatchError, match="Produce v99 is not supported"):
        producer_ids(b"", 99)


_batch = st.one_of(
    st.integers(0, 2**63 - 1).map(_records),
    st.just(-1).map(_records),
    st.sampled_from([0, 1]).map(lambda m: _records(magic=m)),
)
_records_field = st.one_of(st.none(), st.lists(_batch, min_size=1, max_size=3).map(b"".join))
_topics = st.lists(st.lists(_records_field, max_size=3), max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(VERSIONS), topics=_topics, txn=st.one_of(st.none(), st.text(max_size=5)))
def test_truncated_at_every_byte(version, topics, txn):
    body = bytes(_produce(version, topics, txn=txn).encode())
    expected = _oracle(topics)
    assert producer_ids(body, version) == expected
    for cut in range(len(body)):
        try:
            got = producer_ids(body[:cut], version)
        except RecordBatchError:
            continue
        assert got == expected, cut


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=_topics, data=st.data())
def test_corrupted_bytes_only_raise_record_batch_error(version, topics, data):
    body = bytearray(_produce(version, topics).encode())
    if not body:
        return
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    try:
        got = producer_ids(body, version)
    except RecordBatchError:
        return
    assert all(isinstance(p, int) and p != -1 for p in got)


# ----------------------------------------------------------------------------- the per-connection skeleton memo


def _one_field(topics) -> bytes | None:
    """The only non-null records field of a request, or None when there are none or several."""
    fields = [r for parts in topics for r in parts if r is not None]
    return fields[0] if len(fields) == 1 else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(VERSIONS), first=_topics, second=_topics, data=st.data())
def test_the_skeleton_memo_reads_what_the_full_walk_reads_or_declines(version, first, second, data):
    """A shape taken from one request may be used on any other: it answers the id the full walk finds, or None.
    The second request is often the first with other batches in the same places (a producer's next request),
    sometimes corrupted in a byte (a hostile client)."""
    body1 = bytes(_produce(version, first, txn="t").encode())
    ids1, shape = producer_ids_and_shape(body1, version)
    assert ids1 == _oracle(first)
    assert (shape is not None) == (_one_field(first) is not None)
    if shape is None:
        return
    if data.draw(st.booleans()):  # the same skeleton, new batches in the fields that had one
        pid = data.draw(st.integers(-(2**63), 2**63 - 1))  # negative ones too: the memo signs the high word
        second = [
            [None if r is None else _records(pid, count=data.draw(st.integers(1, 4))) for r in parts] for parts in first
        ]
    body2 = bytearray(_produce(version, second, txn="t").encode())
    if data.draw(st.booleans()) and body2:
        i = data.draw(st.integers(0, len(body2) - 1))
        body2[i] = data.draw(st.integers(0, 255))
    start = data.draw(st.sampled_from([0, 4]))  # 4: the frame with its size prefix, as the policy passes it
    got = single_producer_id(bytes(start) + bytes(body2), start, version, 0, shape)
    if got is None:
        return
    # It answered: the full walk must agree, and the request must be one batch in one field.
    full = producer_ids(body2, version)
    assert full == ({got} if got != -1 else set())


def test_the_memo_answers_a_producers_next_request_without_a_walk():
    for version in VERSIONS:
        if version < 3:
            continue
        body1 = bytes(_produce(version, [[None, _records(7)]], txn="tx").encode())
        _ids, shape = producer_ids_and_shape(body1, version)
        assert shape is not None
        body2 = bytes(_produce(version, [[None, _records(7, count=9, value_size=300)]], txn="tx").encode())
        assert single_producer_id(body2, 0, version, 0, shape) == 7
        assert single_producer_id(b"\0\0\0\0" + body2, 4, version, 0, shape) == 7  # a frame, prefix included
        body3 = bytes(_produce(version, [[None, _records(8)]], txn="ty").encode())  # another transactional id
        assert single_producer_id(body3, 0, version, 0, shape) is None
        assert single_producer_id(body2, 0, version, 1, shape) is None  # another header length
        big = bytes(_produce(version, [[None, _records(2**63 - 5, count=3)]], txn="tx").encode())
        assert single_producer_id(big, 0, version, 0, shape) == 2**63 - 5
        none = bytes(_produce(version, [[None, _records(-1)]], txn="tx").encode())
        assert single_producer_id(none, 0, version, 0, shape) == -1
        for pid in (-2, -(2**31), -(2**32) - 1, -(2**63), 2**32, 2**31 - 1):  # each word's edges, both signs
            body = bytes(_produce(version, [[None, _records(pid)]], txn="tx").encode())
            assert single_producer_id(body, 0, version, 0, shape) == pid


def test_a_padded_records_length_is_never_memoised():
    """A flexible request may encode the records length as a padded varint (0x85 0x80 0x00 for 5); the memo
    would then mistake where the length starts, so no shape is taken from such a request."""
    version = FLEXIBLE[-2] if len(FLEXIBLE) > 1 else FLEXIBLE[-1]
    records = _records(9)
    body = bytearray(_produce(version, [[records]]).encode())
    n = len(records) + 1
    canonical = bytearray()
    v = n
    while v >= 0x80:
        canonical.append((v & 0x7F) | 0x80)
        v >>= 7
    canonical.append(v)
    at = body.index(bytes(canonical) + records)
    padded = bytes(canonical[:-1]) + bytes([canonical[-1] | 0x80, 0x00])
    body[at : at + len(canonical)] = padded
    ids, shape = producer_ids_and_shape(bytes(body), version)
    assert ids == {9} and shape is None


def test_the_memo_declines_a_request_that_differs_only_after_the_records():
    """Same bytes up to the one records field, then a second topic with a batch where the first request had
    none: only the tail tells them apart, and the full walk finds both ids."""
    for version in VERSIONS:
        body1 = bytes(_produce(version, [[_records(5)], [None]]).encode())
        _ids, shape = producer_ids_and_shape(body1, version)
        assert shape is not None
        body2 = bytes(_produce(version, [[_records(5)], [_records(6)]]).encode())
        assert single_producer_id(body2, 0, version, 0, shape) is None
        assert producer_ids(body2, version) == {5, 6}


@pytest.mark.parametrize("version", [3, 7, 9, 12, 13])
def test_produce_topics_are_read_in_request_order(version):
    """Names up to v12, ids from v13 (what the request quota looks a replication factor up by)."""
    from protocol.record_batches import produce_topics

    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=-1, producer_epoch=-1, base_sequence=-1)
    b.append(0, None, b"v")
    b.close()
    td = ProduceRequest.TopicProduceData
    ids = [uuid.uuid4(), uuid.uuid4()]
    keys = ids if version >= 13 else ["alpha", "beta"]
    data = [
        td(**({"topic_id": k} if version >= 13 else {"name": k}),
           partition_data=[td.PartitionProduceData(index=0, records=b.buffer())])
        for k in keys
    ]  # fmt: skip
    body = ProduceRequest(transactional_id=None, acks=1, timeout_ms=1, topic_data=data).encode(version=version)
    assert produce_topics(body, version) == keys
    assert produce_topics(b"\x00\x00" + body, version, 2) == keys  # at an offset, as in a whole frame
