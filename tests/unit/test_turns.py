"""One connection's pipelined requests are handled a bounded number per turn of the event loop (issue 30, item 2:
no connection monopolises the loop). A real ``proxy.wire.connection.Connection`` with stand-in transports."""

from __future__ import annotations

import asyncio

from protocol.session import FRAMES_PER_TURN, Pause
from tests.harness.connection_rig import ConnectionRig, produce_request


def _frames_in(chunks: list[bytes]) -> int:
    data = b"".join(chunks)
    n = pos = 0
    while pos < len(data):
        pos += 4 + int.from_bytes(data[pos : pos + 4], "big")
        n += 1
    return n


def test_a_read_of_many_requests_is_handled_a_turn_at_a_time_in_order():
    count = FRAMES_PER_TURN * 3 + 5
    frames = [produce_request(corr) for corr in range(1, count + 1)]

    async def run() -> list[int]:
        h = ConnectionRig({})
        h.client_side.data_received(b"".join(frames))  # one read holding every request
        forwarded = [_frames_in(h.upstream.written)]
        assert Pause.TURN in h.conn.client.pauses  # the rest waits, unread meanwhile
        while _frames_in(h.upstream.written) < count:
            await asyncio.sleep(0)  # one turn of the loop: other connections' callbacks would run here
            forwarded.append(_frames_in(h.upstream.written))
            assert len(forwarded) < 20
        assert b"".join(h.upstream.written) == b"".join(frames)  # every request once, in order
        assert Pause.TURN not in h.conn.client.pauses
        return forwarded

    forwarded = asyncio.run(run())
    assert forwarded[0] == FRAMES_PER_TURN
    steps = [b - a for a, b in zip(forwarded, forwarded[1:], strict=False) if b > a]
    assert max(steps) <= FRAMES_PER_TURN and sum(steps) == count - FRAMES_PER_TURN


def test_a_few_requests_go_in_one_turn():
    async def run() -> int:
        h = ConnectionRig({})
        h.client_side.data_received(b"".join(produce_request(corr) for corr in range(1, 11)))
        assert Pause.TURN not in h.conn.client.pauses
        return _frames_in(h.upstream.written)

    assert asyncio.run(run()) == 10
