"""protocol.session.Session driven with bytes alone: request/response order, local answers, held requests,
SASL v0 raw mode, the proxy's own asks, and when a response may stream. No socket, no clock, no cluster."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.sasl import SaslHandshakeRequest

from protocol.apis import Api
from protocol.errors import ProtocolError, ProtocolViolation
from protocol.headers import encode_response_header, parse_request_header
from protocol.principal import ConnectionIdentity
from protocol.request import Request, read_request
from protocol.session import BYTES_PER_TURN, FRAMES_PER_TURN, RAW, Pause, Session
from tests.harness.request_bodies import fetch_request

_SIZE = struct.Struct(">i")
CAPS = {Api.API_VERSIONS: 3, Api.PRODUCE: 11, Api.FETCH: 17, Api.SASL_HANDSHAKE: 1}


def _session() -> Session:
    return Session(ConnectionIdentity(), CAPS)


def _frame(req, corr: int, client_id: str = "c") -> bytearray:
    req.with_header(correlation_id=corr, client_id=client_id)
    body = req.encode(header=True, framed=False)
    return bytearray(_SIZE.pack(len(body)) + body)


def metadata(corr: int, client_id: str = "c") -> bytearray:
    return _frame(MetadataRequest(topics=None, version=1), corr, client_id)


def produce(corr: int, acks: int = -1) -> bytearray:
    return _frame(ProduceRequest(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[], version=7), corr)


def fetch(corr: int) -> bytearray:
    return _frame(fetch_request(version=4), corr)


def response(corr: int, body: bytes = b"\x00\x00", flexible: bool = False) -> memoryview:
    head = encode_response_header(corr, flexible)
    return memoryview(_SIZE.pack(len(head) + len(body)) + head + body)


def test_requests_are_read_and_answered_in_order():
    s = _session()
    reqs = [s.receive(metadata(c), 0.0) for c in (1, 2, 3)]
    assert all(type(r) is Request for r in reqs)
    for r in reqs:
        s.forward(r, None, r.frame, 0.0)
    assert [s.response(response(c))[0].header.correlation_id for c in (1, 2, 3)] == [1, 2, 3]


def test_a_request_is_alone_when_nothing_else_of_its_connection_awaits_an_answer():
    """What request_percentage charges an alone base for (issue 50): a consumer's Fetch, a request/response loop.
    Behind a request still in flight it is pipelined; once that one is answered, the next is alone again."""
    s = _session()
    first = s.receive(fetch(1), 0.0)
    assert first.alone
    s.forward(first, None, first.frame, 0.0)
    second = s.receive(fetch(2), 0.0)
    assert not second.alone
    s.forward(second, None, second.frame, 0.0)
    s.response(response(1, bytes(12)))
    s.response(response(2, bytes(12)))
    assert s.receive(metadata(3), 0.0).alone


def test_a_response_out_of_order_is_a_protocol_error():
    s = _session()
    for c in (1, 2):
        r = s.receive(metadata(c), 0.0)
        s.forward(r, None, r.frame, 0.0)
    with pytest.raises(ProtocolError):
        s.response(response(2))


def test_client_id_is_remembered():
    s = _session()
    s.receive(metadata(1, "alpha"), 0.0)
    assert s.client_id == "alpha"


def test_local_answer_waits_for_everything_before_it():
    s = _session()
    first = s.receive(metadata(1), 0.0)
    s.forward(first, None, first.frame, 0.0)
    second = s.receive(metadata(2), 0.0)
    s.answer(second, "d", b"local", 0.0)
    third = s.receive(metadata(3), 0.0)
    s.forward(third, None, third.frame, 0.0)
    assert s.ready_answers() == []  # the broker still owes request 1
    s.response(response(1))
    ready = s.ready_answers()
    assert [(p.header.correlation_id, p.local, p.decision) for p in ready] == [(2, b"local", "d")]
    assert s.response(response(3))[0].header.correlation_id == 3


def test_produce_acks_0_expects_no_response_and_is_not_queued():
    s = _session()
    r = s.receive(produce(1, acks=0), 0.0)
    assert r.answered is False
    s.forward(r, None, r.frame, 0.0)
    assert len(s.inflight) == 0


def test_api_versions_beyond_the_proxy_is_answered_here_with_unsupported_version():
    s = _session()
    assert (
        s.receive(_frame(ApiVersionsRequest(version=3, client_software_name="x", client_software_version="1"), 7), 0.0)
        is not None
    )
    frame = _frame(ApiVersionsRequest(version=3, client_software_name="x", client_software_version="1"), 8)
    struct.pack_into(">h", frame, 6, 4)  # claim v4, past the cap of 3
    assert s.receive(frame, 0.0) is None
    (pending,) = s.ready_answers()
    assert pending.header.correlation_id == 8
    assert struct.unpack_from(">h", pending.local, 8)[0] == 35  # UNSUPPORTED_VERSION


def test_other_api_beyond_the_proxy_is_refused():
    s = Session(ConnectionIdentity(), {Api.PRODUCE: 6})
    frame = produce(1)  # v7
    with pytest.raises(ProtocolViolation, match="beyond what the proxy decodes"):
        s.receive(frame, 0.0)


def test_held_requests_are_copies_given_back_in_order():
    s = _session()
    frames = [metadata(c) for c in (1, 2, 3)]
    views = [memoryview(f) for f in frames]
    s.hold_rest(views[1:])
    assert s.holding_requests
    frames[1][-1] ^= 0xFF  # the receive buffer is reused: the held copy must not change
    held = s.take_held_requests()
    assert held == [bytes(metadata(2)), bytes(metadata(3))]
    assert not s.holding_requests and s.take_held_requests() == []


def test_after_a_request_the_rest_go_on_unless_something_holds_them():
    s = _session()
    frames = [metadata(c) for c in range(1, 5)]
    assert s.after(frames, 0, deferred=False, muted=False) is None
    assert not s.holding_requests
    assert s.after(frames, 1, deferred=True, muted=True) == Pause.DECIDING  # not forwarded yet: nothing behind it
    assert s.take_held_requests() == [bytes(f) for f in frames[2:]]


@pytest.mark.parametrize("why", ["muted", "sasl"])
def test_a_mute_or_a_sasl_handshake_holds_the_rest_until_it_ends(why):
    s = _session()
    frames = [metadata(c) for c in range(1, 4)]
    s.sasl_hold = why == "sasl"
    reason = s.after(frames, 0, deferred=False, muted=why == "muted")
    assert reason == (Pause.MUTED if why == "muted" else Pause.SASL_HANDSHAKE)
    assert s.queue([metadata(9)])  # read meanwhile: queues behind them
    if why == "muted":
        assert s.unmuted(hold_ended=False) is False  # a plain mute's end holds nothing back
        assert s.unmuted(hold_ended=True) is True
    else:
        assert not s.end_hold(Pause.SASL_HANDSHAKE, muted=False)  # not answered yet
        s.sasl_hold = False  # (Session.response clears it when the answer comes)
        assert not s.end_hold(Pause.SASL_HANDSHAKE, muted=True)  # a mute began meanwhile: it holds them still
        assert s.end_hold(Pause.SASL_HANDSHAKE, muted=False)
    assert s.take_held_requests() == [bytes(f) for f in frames[1:]] + [bytes(metadata(9))]
    assert not s.queue([metadata(10)])


def test_a_turn_ends_after_frames_per_turn_requests_of_one_read_and_only_if_more_follow():
    s = _session()
    frames = [metadata(c) for c in range(FRAMES_PER_TURN + 2)]
    assert all(s.after(frames, i, False, False) is None for i in range(FRAMES_PER_TURN - 1))
    assert s.after(frames, FRAMES_PER_TURN - 1, False, False) == Pause.TURN
    assert len(s.take_held_requests()) == 2
    exactly = frames[:FRAMES_PER_TURN]
    assert s.after(exactly, FRAMES_PER_TURN - 1, False, False) is None  # nothing left for a later turn


def test_a_turn_ends_after_bytes_per_turn_however_few_the_frames():
    """Issue 37: 64 frames of 1 MB are 64 MB; a turn is bounded in bytes too, and a frame larger than the budget
    still goes through whole (nothing follows it in its turn)."""
    s = _session()
    big = bytearray(BYTES_PER_TURN // 2 + 1)
    frames = [big, big, big, metadata(1)]
    assert s.after(frames, 0, False, False) is None
    assert s.after(frames, 1, False, False) == Pause.TURN  # a megabyte handled, more follows
    assert len(s.take_held_requests()) == 2
    s._holds.clear()
    huge = [bytearray(2 * BYTES_PER_TURN), metadata(2)]
    assert s.after(huge, 0, False, False) == Pause.TURN
    s.take_held_requests()
    s._holds.clear()
    assert s.after([metadata(3), metadata(4)], 0, False, False) is None  # a new turn starts counting afresh
    assert s.after(frames[2:], 0, False, False) is None  # (half the budget, counted from this turn's first frame)


def test_every_hold_must_end_before_the_held_requests_go_on():
    s = _session()
    frames = [metadata(c) for c in range(FRAMES_PER_TURN + 3)]
    for i in range(FRAMES_PER_TURN - 1):
        s.after(frames, i, False, False)
    assert s.after(frames, FRAMES_PER_TURN - 1, False, False) == Pause.TURN
    held = s.take_held_requests()
    s.hold_rest(held)  # (as if still held) a decision starts on the first of them before the turn came
    s._holds.add(Pause.DECIDING)
    assert not s.end_hold(Pause.TURN, muted=False)  # the decision still holds them
    assert s.end_hold(Pause.DECIDING, muted=False)


def test_a_deferred_decision_waits_out_the_mute_then_is_given_back():
    s = _session()
    frames = [metadata(1), metadata(2)]
    assert s.after(frames, 0, deferred=True, muted=False) == Pause.DECIDING
    request = read_request(parse_request_header(frames[0], 4), bytes(frames[0]))
    assert not s.defer_decision("verdict", request, muted=False)  # not muted: decided at once
    assert s.defer_decision("verdict", request, muted=True)
    assert s.deferred is not None
    assert s.unmuted(hold_ended=False) == ("verdict", request)  # decide it now, as it was read; the rest still wait
    assert s.deferred is None and s.holding_requests
    assert s.end_hold(Pause.DECIDING, muted=False)
    assert s.take_held_requests() == [bytes(frames[1])]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["read", "req", "defer", "mute", "sasl", "decided", "unmute", "answered", "turn"]), max_size=40
    )
)
def test_held_requests_come_back_once_in_order_and_only_when_nothing_holds_them(ops):
    """A model of the glue: frames come in reads; holds start and end in any order. Every frame read is handed
    on exactly once, in order, and never while a decision, the mute, a SASL answer or a turn still holds it."""
    s = _session()
    handled: list[bytes] = []
    sent = 0
    muted = deciding = turn = False

    def handle(frames, deferred=False):
        nonlocal deciding, turn
        for i, f in enumerate(frames):
            handled.append(bytes(f))
            reason = s.after(frames, i, deferred and i == 0, muted)
            if reason is not None:
                deciding = deciding or reason == Pause.DECIDING
                turn = turn or reason == Pause.TURN
                return

    def release(ok):
        if ok:
            assert not (muted or deciding or turn or s.sasl_hold)
            handle(s.take_held_requests())
        else:  # and never kept back once nothing holds them
            assert muted or deciding or turn or s.sasl_hold

    for op in ops:
        if op in ("read", "req", "defer", "sasl"):
            sent += 1
            frame = metadata(sent)
            if op == "sasl" and not s.holding_requests:
                s.sasl_hold = True
            if not s.queue([frame]):
                handle([frame], deferred=op == "defer")
        elif op == "mute":
            muted = True
        elif op == "decided" and deciding:
            deciding = False
            release(s.end_hold(Pause.DECIDING, muted))
        elif op == "unmute" and muted:
            muted = False
            release(s.unmuted(hold_ended=True) is True)
        elif op == "answered" and s.sasl_hold:
            s.sasl_hold = False
            release(s.end_hold(Pause.SASL_HANDSHAKE, muted))
        elif op == "turn" and turn:
            turn = False
            release(s.end_hold(Pause.TURN, muted))
    held = s.take_held_requests() if s.holding_requests else []
    assert handled + held == [bytes(metadata(c)) for c in range(1, sent + 1)]


def test_own_requests_are_answered_in_turn_and_never_reach_the_client():
    s = _session()
    r = s.receive(metadata(1), 0.0)
    s.forward(r, None, r.frame, 0.0)
    pieces = s.own_request(Api.METADATA, 1, b"\x00\x00\x00\x00", 0.0, token="mine")
    corr = struct.unpack_from(">i", pieces[1], 4)[0]
    assert corr < 0  # never a correlation id a client uses
    assert s.response(response(1))[0].internal is None
    assert s.response(response(corr))[0].internal == "mine"


def _handshake_v0(corr: int) -> bytearray:
    return _frame(SaslHandshakeRequest(mechanism="PLAIN", version=0), corr)


def test_sasl_v0_holds_what_follows_until_answered_then_raw_tokens_pass():
    s = _session()
    r = s.receive(_handshake_v0(1), 0.0)
    assert type(r) is Request and s.sasl_hold
    s.forward(r, None, r.frame, 0.0)
    pending, released = s.response(response(1, b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x05PLAIN"))
    assert released and not s.sasl_hold
    token = bytearray(_SIZE.pack(11) + b"\x00alice\x00pw\x00"[:11])
    assert s.receive(token, 0.0) is token  # forwarded as is: no Kafka header to read
    assert s.inflight.head().header is RAW
    pending, _ = s.response(memoryview(_SIZE.pack(0)))
    assert pending.header is RAW
    assert s.identity.principal == "alice"


def test_sasl_v1_holds_nothing():
    s = _session()
    s.receive(_frame(SaslHandshakeRequest(mechanism="PLAIN", version=1), 1), 0.0)
    assert not s.sasl_hold


def test_may_stream_only_a_plain_response_at_the_head():
    s = _session()
    r = s.receive(fetch(1), 0.0)
    s.forward(r, None, r.frame, 0.0)
    head = response(1)
    assert s.may_stream(head)
    assert not s.may_stream(response(2))  # not the oldest request's answer
    s.hold_responses()
    assert not s.may_stream(head)  # something is held before it
    assert s.take_held_responses() == []
    s.inflight.pop(1)
    s.forward(r, "decision", r.frame, 0.0, whole=True)
    assert not s.may_stream(head)  # the policy rewrites more than its leading bytes
    s.inflight.pop(1)
    s.answer(r, None, b"x", 0.0)
    assert not s.may_stream(head)  # the proxy's own answers are whole


def test_may_stream_never_a_response_the_proxy_rewrites_past_its_head():
    """Whole body or stream is decided here, once (issue 49): a Metadata answer names brokers anywhere in its body,
    so it is assembled however large; the Fetch beside it streams."""
    s = _session()
    r = s.receive(metadata(1), 0.0)
    s.forward(r, None, r.frame, 0.0)
    assert not s.may_stream(response(1))
    s.inflight.pop(1)
    r = s.receive(fetch(2), 0.0)
    s.forward(r, None, r.frame, 0.0)
    assert s.may_stream(response(2))


def test_streamed_head_pops_its_request():
    s = _session()
    r = s.receive(fetch(1), 0.0)
    s.forward(r, "d", r.frame, 0.0)
    assert s.streamed().decision == "d" and len(s.inflight) == 0


@settings(max_examples=200)
@given(st.lists(st.sampled_from(["forward", "answer", "own"]), min_size=1, max_size=30))
def test_every_interleaving_answers_the_client_in_request_order(ops):
    """Whatever mix of forwarded requests, local answers and own asks: the client gets one answer per
    request, in the order it asked, and own asks never reach it."""
    s = _session()
    client_order, broker_queue, corr = [], [], 0
    for op in ops:
        if op == "own":
            pieces = s.own_request(Api.METADATA, 1, b"\x00\x00\x00\x00", 0.0, token=True)
            broker_queue.append(struct.unpack_from(">i", pieces[1], 4)[0])
            continue
        corr += 1
        r = s.receive(metadata(corr), 0.0)
        client_order.append(corr)
        if op == "forward":
            s.forward(r, None, r.frame, 0.0)
            broker_queue.append(corr)
        else:
            s.answer(r, None, b"local", 0.0)
    delivered = [p.header.correlation_id for p in s.ready_answers()]
    for c in broker_queue:
        pending, _ = s.response(response(c))
        if pending.internal is None:
            delivered.append(c)
        delivered += [p.header.correlation_id for p in s.ready_answers()]
    assert delivered == client_order
    assert len(s.inflight) == 0
