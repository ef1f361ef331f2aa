"""Issue #35: every walk over a client's bytes fails as a malformed frame (one WARNING, the connection closed), never
as an internal error (a traceback). The fuzz drives real connections (``tests/harness/fuzz_frames.py``): every API
kafka-python has a schema for, every version, truncated at every offset, and mutated; ``bench.fuzz_walks`` runs
the same cases by the million."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from protocol.apis import REQUESTS, Api
from protocol.errors import ProtocolError
from protocol.headers import encode_request_header, parse_request_header
from protocol.inflight import produce_acks, requested_wait_ms
from protocol.skim import STR, Op, skip
from protocol.varint import TruncatedError, read_length
from tests.harness.fuzz_frames import FuzzRig, mutations, truncations, valid_cases


def _fuzz(cases, smooth: bool) -> FuzzRig:
    async def go() -> FuzzRig:
        rig = FuzzRig(smooth)
        with rig:
            for case in cases:
                await rig.run(case)
            await rig.settle()
        return rig

    return asyncio.run(go())


def test_every_truncation_of_every_request_closes_or_forwards_without_a_traceback():
    """Cut at every offset (size prefix fixed up), each on a fresh connection (``bench.fuzz_walks`` also sends each
    after the same request whole)."""
    cases = [t for case in valid_cases(large=False, warm=False) for t in truncations(case)]
    rig = _fuzz(cases, smooth=False)
    assert rig.cases == len(cases) > 15_000
    assert rig.closed > len(cases) // 4  # most are malformed to something that reads them: the walks ran


@pytest.mark.parametrize("smooth", [False, True])
def test_mutated_requests_close_or_forward_without_a_traceback(smooth):
    rng = random.Random(35 + smooth)
    cases = [m for case in valid_cases() for m in mutations(case, rng, 12)]
    rig = _fuzz(cases, smooth)
    assert rig.cases == len(cases) > 10_000
    assert rig.closed > len(cases) // 4


def _frame(api_key: int, version: int, body: bytes) -> bytes:
    head = encode_request_header(api_key, version, 1, "fuzz")
    return struct.pack(">i", len(head) + len(body)) + head + body


def test_a_truncated_join_group_is_the_brokers_to_refuse():
    """The traceback of #35: the group id's length cut short met ``requested_wait_ms``, which read it with
    ``struct`` and let ``struct.error`` out. The wait of a request that cannot be read is 0 (the broker refuses it)."""
    join_group = REQUESTS[Api.JOIN_GROUP]
    body = bytes(
        join_group(
            group_id="g", session_timeout_ms=10, rebalance_timeout_ms=10, member_id="", protocol_type="c", protocols=[]
        ).encode(version=2)
    )
    whole = _frame(Api.JOIN_GROUP, 2, body)
    header = parse_request_header(whole, 4)
    assert requested_wait_ms(whole, header, 4) > 0
    for cut in range(4 + header.body_offset, len(whole)):
        assert requested_wait_ms(whole[:cut], header, 4) >= 0


def test_walkers_raise_the_protocol_error_for_a_length_cut_short():
    with pytest.raises(TruncatedError, match="int16 length at byte 3 runs past the end"):
        read_length(b"\x00\x00\x00\x01", 3, False, 2)
    with pytest.raises(TruncatedError, match="int32 length at byte 1"):
        read_length(memoryview(b"\x00\x00\x00"), 1, False)
    with pytest.raises(ProtocolError):
        skip((Op(STR),), b"\x00", 0, 1)  # a string whose int16 length is one byte
    with pytest.raises(ProtocolError):
        skip((Op(STR, compact=True),), b"", 0, 0)


@pytest.mark.parametrize("version", [3, 8, 9])
def test_produce_acks_cut_short_is_a_protocol_error_naming_the_request(version):
    from kafka.protocol.producer import ProduceRequest

    body = bytes(ProduceRequest(transactional_id="tx", acks=1, timeout_ms=5, topic_data=[]).encode(version=version))
    frame = _frame(Api.PRODUCE, version, body)
    header = parse_request_header(frame, 4)
    assert header.body_offset is not None
    for cut in range(4 + header.body_offset, 4 + header.body_offset + 4 + (version < 9)):
        short = struct.pack(">i", cut - 4) + frame[4:cut]
        with pytest.raises(ProtocolError, match=f"Produce v{version} too short to hold acks"):
            produce_acks(short, header, 4)
