"""One client connection paired with one upstream broker connection.

Built on asyncio Protocols rather than streams because this is the hot path: a received chunk is
split into frames without copying (``FrameReader``), each request header is read, and the frames are
written on in one ``writelines`` call, usually as views of the very chunk that arrived. Responses,
the bulk on consume, are read with a BufferedProtocol into one reused receive buffer
(``FrameReceiver``), and a large response that the proxy never rewrites is forwarded piece by piece
as it arrives instead of being assembled first. Reading is paused, never buffered without bound:
when the other side's write buffer is full (backpressure), while a response waits for a new broker
listener, while connecting, and while draining.

Anything malformed closes this connection only, with one log line naming the peer, api and reason.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from time import monotonic
from typing import Any

from protocol.apis import Api, api_label, api_name
from protocol.endpoint_apis import carries_endpoints_tail
from protocol.errors import ProtocolError
from protocol.frames import (
    SMALL_RESPONSE_BYTES,
    FrameError,
    StreamHead,
    StreamPiece,
)
from protocol.headers import response_body_offset
from protocol.inflight import Pending
from protocol.request import Request
from protocol.session import RAW, Pause
from protocol.text import printable
from proxy.rules.policy import Decision, Verdict
from proxy.rules.verdicts import Answer, Defer, Replace
from proxy.stats import ApiCounters
from proxy.wire.connection_life import ConnectionLife, Services
from proxy.wire.responses import AddressEdit, StreamedTail, inspect_response

log = logging.getLogger(__name__)

__all__ = ["Connection", "Services"]

_SIZE = struct.Struct(">i")


class Connection(ConnectionLife):
    """Requests in, decided and forwarded; responses out, inspected, charged and rewritten (the life of the
    connection, its admission, link, pauses, timeouts and closing, is :class:`ConnectionLife`'s)."""

    def requests_received(self, data: bytes) -> None:
        if self.closed or self._refused_timer is not None:
            return
        self.services.stats.bytes_from_clients += len(data)
        self.traffic.bytes_in += len(data)
        self.last_active = now = monotonic()  # bound at import: time.monotonic is a lookup each call
        if self._timeline is not None:
            self._timeline.append(("in", self.id, self.session.client_id, len(data), now))
        if self.upstream.transport is None:
            # Kept (one chunk, and at most one more that raced the pause) and replayed once the broker
            # connection is up.
            if not self._connecting:
                if self.services.spoke(self) is not None:  # no fd for a broker connection, none could be shed
                    self._admitted = False  # no longer counted
                    self.close()
                    return
                self._connecting = True
                self._spawn(self._connect_upstream())
            self._early.append(data)
            self.pause(self.client, Pause.CONNECTING)
            return
        reader = self._requests
        try:
            frames = reader.feed(data)
        except FrameError as exc:
            self.close(f"request stream: {exc}", exc.kind)
            return
        if reader.idle:
            self._frame_since = None
        elif self._frame_since is None:
            self._frame_since = now
        if reader.waiting and self._pool_waiter is None:
            self.pause(self.client, Pause.MEMORY)
            self._pool_waiter = self.services.request_pool.wait(reader.waiting, self._pool_granted)
        if self.session.queue(frames):  # a read that raced the pause
            return
        self._process_requests(frames, now)

    def _pool_granted(self) -> None:
        """The request pool reserved this connection's next large frame (called from another connection's
        release: the work is put off to the loop, so no connection runs inside another's)."""
        self._pool_waiter = None
        self._requests.granted()
        asyncio.get_running_loop().call_soon(self._pool_resume)

    def _pool_resume(self) -> None:
        if self.closed:
            return
        self.resume(self.client, Pause.MEMORY)
        self.requests_received(b"")

    def _release_requests(self) -> None:
        """Give the pool back the bytes of large frames once they are with the broker connection, not held
        in a write buffer above its high-water mark or in a queue of requests waiting here."""
        if not self.session.holding_requests and Pause.BACKPRESSURE not in self.client.pauses:
            self._requests.release_forwarded()

    def _process_requests(self, frames: Any, now: float) -> None:
        """Handle the requests of one read (or those that stopped waiting), in order, until the session says the
        rest wait: then carry that out. ``now``: the clock when the frames were read, or stopped waiting."""
        out: list[Any] = []
        session = self.session
        try:
            for i, frame in enumerate(frames):
                item = self._on_request(frame, now)
                deferred = type(item) is Defer
                if item is not None and not deferred:
                    out.append(item)
                reason = session.after(frames, i, deferred, self.mute.held)
                if reason is not None:
                    self.pause(self.client, reason)
                    if deferred:
                        self._start_decision(item, item.request.copied())
                    elif reason is Pause.TURN:  # other connections go first
                        asyncio.get_running_loop().call_soon(self._next_turn)
                    break
        except ProtocolError as exc:  # the client's bytes: one line, its connection only
            if out:
                self.upstream.transport.writelines(out)
            self.close(str(exc), exc.kind)
            return
        except Exception as exc:  # a bug or a body that breaks a decoder: this connection only, never the proxy
            if out:
                self.upstream.transport.writelines(out)
            log.exception("%s via %s: cannot process a request", self.peer, self.label)
            self.close(f"cannot process a request: {type(exc).__name__}: {exc}", "internal")
            return
        if out:
            self.upstream.transport.writelines(out)
        self._release_requests()

    def _next_turn(self) -> None:
        """The turn the held requests yielded came (``FRAMES_PER_TURN``)."""
        if self.closed:
            return
        self.resume(self.client, Pause.TURN)
        if self.session.end_hold(Pause.TURN, self.mute.held):
            self._release_deferred()

    def _on_request(self, frame: bytes | bytearray | memoryview, now: float) -> Any:
        """Return what to forward for this frame (itself, a replacement), None (answered here), or a Defer."""
        request = self.session.receive(frame, now)
        if type(request) is not Request:
            if request is None:  # answered here (an ApiVersions beyond the proxy's versions)
                self._flush_answers(now)
            return request
        header = request.header
        if not self.buffered_reads and (header.api_key == Api.FETCH or header.api_key == Api.SHARE_FETCH):
            self._buffer_reads()
        services = self.services
        stats = services.stats
        stats.requests += 1
        self.traffic.requests += 1
        self._api_counters(header.api_key).requests += 1
        verdict = services.policy.on_request(self, request, now, self.policy_state)
        item = self._apply(verdict, request, now)
        if self._timeline is not None:
            self._note_request(request, now, item)
        return item

    def _note_request(self, request: Request, now: float, item: Any) -> None:
        """Timeline: the request was read (or stopped waiting) at ``now`` and is forwarded now, answered here, or
        deferred (its forwarding is noted when it is decided)."""
        assert self._timeline is not None
        header = request.header
        what = "defer" if type(item) is Defer else "fwd" if item is not None else "local"
        self._timeline.append(
            ("req", self.id, header.client_id, header.api_key, header.correlation_id, len(request.frame), now,
             monotonic(), what)
        )  # fmt: skip

    def _apply(self, verdict: Verdict, request: Request, now: float) -> Any:
        """Carry out the policy's verdict: what to write to the broker (the frame), None (answered here) or the
        Defer to start."""
        session = self.session
        if verdict is None or type(verdict) is Decision:  # the usual verdicts first: the others are interpreted
            if request.answered:  # classes, whose names are looked up in a dict at each use
                session.forward(request, verdict, request.frame, now)
            elif verdict is not None:
                self.services.policy.on_unanswered(self, verdict)
            return request.frame
        if type(verdict) is Defer:
            verdict.request = request
            return verdict
        if type(verdict) is Replace:
            session.forward(request, verdict.decision, verdict.frame, now, whole=verdict.whole)
            return verdict.frame
        if type(verdict) is Answer:  # released in order, once everything before it has been answered
            session.answer(request, verdict.decision, verdict.frame, now)
            self._flush_answers(now)
            return None
        raise TypeError(f"the policy returned a {type(verdict).__name__}, which is no verdict")

    def _flush_answers(self, now: float) -> None:
        out: list[Any] = []
        self._release_local(out, now)
        if out:
            self.client.transport.writelines(out)

    async def _decide(self, defer: Defer[Verdict], request: Request) -> None:
        try:
            verdict = await defer.decide()
        except Exception as exc:  # noqa: BLE001 - a failed lookup closes this connection, never the proxy
            self.close(f"cannot decide on a request: {type(exc).__name__}: {exc}", "decide_failed")
            return
        if self.closed:
            return
        # A task: what escapes it is no WARNING and no close but "Task exception was never retrieved", long after.
        try:
            item = self._apply(verdict, request, monotonic())
        except ProtocolError as exc:  # the client's bytes: one line, its connection only (as _process_requests)
            self.close(str(exc), exc.kind)
            return
        except Exception as exc:  # noqa: BLE001 - a bug: this connection only, never the proxy
            log.exception("%s via %s: cannot process a request", self.peer, self.label)
            self.close(f"cannot process a request: {type(exc).__name__}: {exc}", "internal")
            return
        if type(item) is Defer:  # it waits again (a paced request whose rate moved): still deciding, in order
            self._start_decision(item, request)
            return
        if item is not None:
            self.upstream.transport.write(item)
        if self._timeline is not None:
            self._timeline.append(("decided", self.id, request.header.correlation_id, monotonic()))
        self.resume(self.client, Pause.DECIDING)
        if self.session.end_hold(Pause.DECIDING, self.mute.held):
            self._release_deferred()

    def _release_deferred(self) -> None:
        held = self.session.take_held_requests()
        if held:
            self._process_requests(held, monotonic())
        else:
            self._release_requests()

    def _start_decision(self, defer: Defer[Verdict], request: Request) -> None:
        """Decide a deferred request (``request``: its frame a copy of its own) now, or once the mute it asks for (a
        KIP-936 hold) has run out."""
        if defer.wait_s > 0:
            self.mute.mute_for(defer.wait_s)
            if self.session.defer_decision(defer, request, self.mute.muted):
                return
        self._spawn(self._decide(defer, request))

    def _unmuted(self, hold_ended: bool) -> None:
        if self.closed:
            return
        self.resume(self.client, Pause.MUTED)
        then = self.session.unmuted(hold_ended)
        if type(then) is tuple:  # a decision that waited out the mute
            self._spawn(self._decide(*then))
        elif then:
            self._release_deferred()

    def _sasl_handshake_answered(self) -> None:
        """The broker answered a SaslHandshake v0: the identity now knows whether raw tokens follow, so what
        the client sent behind it can be read (put off to the loop: the answer itself goes out first)."""
        if self.closed:
            return
        self.resume(self.client, Pause.SASL_HANDSHAKE)
        if self.session.end_hold(Pause.SASL_HANDSHAKE, self.mute.held):
            self._release_deferred()

    def ask(self, api_key: int, api_version: int, body: bytes) -> asyncio.Future[bytes]:
        """Send a request of the proxy's own on this connection's broker link; the future gets the response
        body (after its header). It is answered in order, like the client's requests, so it sees the cluster
        as the client's next request will."""
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.upstream.transport.writelines(self.session.own_request(api_key, api_version, body, monotonic(), fut))
        return fut

    # -- responses: broker → client ----------------------------------------------------------------
    def response_buffer(self) -> memoryview:
        """Where the next read from the broker lands. The bytes already handed on may be overwritten
        only once the client transport has sent them all (it keeps views, not copies) and nothing is
        held for a new listener; otherwise the read goes to fresh space."""
        transport = self.client.transport
        reusable = self.session.held_responses is None and (transport is None or transport.get_write_buffer_size() == 0)
        return self._responses.get_buffer(reusable)

    def _may_stream(self, head: memoryview) -> bool:
        """Whether a large response, of which ``head`` is the first bytes, is forwarded as it arrives: the
        session decides (``Session.may_stream``); counted for the connection's closing line. Called lazily by
        FrameReceiver, after every earlier response was handled."""
        stream = self.session.may_stream(head)
        pending = self.inflight.head()
        if pending is not None:
            header = pending.header
            self._decided[(f"{api_name(header.api_key)} v{header.api_version}", stream)] += 1
        return stream

    def _buffer_reads(self) -> None:
        """From now on the broker's reads land in the receive buffer: a Fetch is going out, and its response
        may be megabytes, which stream on from there without a copy. Before the request is written, so its
        response cannot come first; for good, since a connection that fetches keeps fetching."""
        self.buffered_reads = True
        if self.upstream.transport is not None:
            self.upstream.transport.set_protocol(self.upstream)  # the loop reads on with the buffered callbacks

    def response_chunk(self, data: bytes) -> None:
        """A read from the broker as ``bytes`` (see proxy.wire.sockets.UpstreamChunks). The usual one is exactly one
        small response, with nothing pending before it: that is the frame, handed on as it is. Anything else is
        copied into the receive buffer and taken from there, as a buffered read would have been."""
        if self.closed:
            return
        n = len(data)
        now = self._read_from_broker(n)
        responses = self._responses
        if (
            4 < n <= SMALL_RESPONSE_BYTES
            and responses.idle
            and (data[0] << 24 | data[1] << 16 | data[2] << 8 | data[3]) + 4 == n
        ):
            self._deliver([data], now)
            return
        pos = 0
        while pos < n and not self.closed:
            room = self.response_buffer()
            k = min(len(room), n - pos)
            room[:k] = data if k == n else data[pos : pos + k]
            responses.add(k)
            pos += k
            self._deliver(None, now)

    def responses_received(self, nbytes: int) -> None:
        if self.closed:
            return
        now = self._read_from_broker(nbytes)
        self._responses.add(nbytes)
        self._deliver(None, now)

    def _read_from_broker(self, nbytes: int) -> float:
        """Count a read of ``nbytes`` from the broker, either way it arrived; the clock it was read at."""
        self.last_active = now = monotonic()
        self.services.stats.bytes_to_clients += nbytes
        self.traffic.bytes_out += nbytes
        return now

    def _deliver(self, held: list[Any] | None, now: float) -> None:
        """Pass on the responses now complete in the receive buffer, or (``held``) ones that waited, in order.
        ``now``: the clock when they were read, or when they stopped waiting."""
        out: list[Any] = []
        session = self.session
        responses = self._responses
        i = 0
        frame: Any
        try:
            while True:
                if held is None:
                    frame = responses.next_frame()
                    if frame is None:
                        break
                elif i < len(held):
                    frame = held[i]
                    i += 1
                else:
                    break
                if session.queue_response(frame):
                    pass
                elif type(frame) is StreamPiece:
                    if self._tail is None:
                        out.append(frame.data)
                    else:
                        self._tail.pass_on((frame.data,), frame.last, out)
                        if frame.last:
                            self._tail_done()
                else:
                    self._on_response(frame, out, now)
        except FrameError as exc:
            if out:
                self.client.transport.writelines(out)
            self.close(f"response stream from broker: {exc}", "bad_response")
            return
        except Exception as exc:  # noqa: BLE001 - a bad response closes one connection, never the proxy
            if out:
                self.client.transport.writelines(out)
            self.close(f"cannot process response: {type(exc).__name__}: {exc}", "bad_response")
            return
        if out:
            self.client.transport.writelines(out)
        if self.draining and not self.inflight and session.held_responses is None and not self._responses.streaming:
            self.close()

    def _release_local(self, out: list[Any], now: float) -> None:
        """Release the proxy's own answers that have reached the head of the queue."""
        for pending in self.session.ready_answers():
            self._finish(pending, pending.local, out, now)

    def _finish(self, pending: Pending, frame: Any, out: list[Any], now: float, total: int | None = None) -> None:
        """Last stop of every response, whole or the head of a streamed one (``total``: its full length): the
        policy may raise throttle_time_ms and mute the client."""
        if self._timeline is not None:
            self._timeline.append(("resp", self.id, pending.header.correlation_id, pending.sent_at, now, monotonic()))
        if pending.decision is not None:
            pieces = self.services.policy.on_response(self, pending, frame, now, total)
            if pieces is not None:
                out.extend(pieces)
                return
        out.append(frame)

    def _api_counters(self, api_key: int) -> ApiCounters:
        """The stats' counters of API ``api_key``, remembered for the last API asked (a connection sends mostly
        one): finding them takes ``api_label``, an interpreted call, and a dict lookup, twice a request."""
        if api_key != self._api_key:
            self._api_key = api_key
            self._api = self.services.stats.api(api_label(api_key))
        return self._api

    def _count_latency(self, pending: Pending, now: float, nbytes: int) -> None:
        """An answer of ``nbytes`` from the broker, read at ``now``: its round trip counted, and handed to the policy
        with when the broker could start on it (sent, and the previous answer back: a broker reads one request of a
        connection at a time; an answer read in the same read as the previous one has no time of its own)."""
        counters = self._api_counters(pending.header.api_key)
        counters.latency_sum += now - pending.sent_at
        counters.latency_count += 1
        prev = self._answered_at
        self._answered_at = now
        self.services.policy.on_answer(
            self.policy_state, pending, nbytes, now, pending.sent_at if pending.sent_at > prev else prev
        )

    def _on_response(self, frame: Any, out: list[Any], now: float) -> None:
        self._release_local(out, now)
        session = self.session
        if type(frame) is StreamHead:
            # may_stream checked that it answers the oldest request, that nothing in it is ever
            # rewritten, and that the policy needs no more than its leading bytes (throttle_time_ms).
            pending = session.streamed()
            self._count_latency(pending, now, frame.total - 4)
            key, version = pending.header.api_key, pending.header.api_version
            if carries_endpoints_tail(key, version):
                pieces: list[Any] = []
                self._finish(pending, frame.data, pieces, now, frame.total)
                body_start = 4 + response_body_offset(frame.data[4:], key, version)
                self._tail = StreamedTail(key, version, body_start, self.services.directory)
                self._tail.pass_on(pieces, False, out)
            else:
                self._finish(pending, frame.data, out, now, frame.total)
            return
        pending, sasl_released = session.response(frame)
        if pending.header is RAW:
            out.append(frame)
            return
        # Small frames are bytes (narrowed, a native slice); large ones memoryviews (a view: no copy).
        body = frame[4:] if isinstance(frame, bytes) else frame[4:]
        if pending.internal is not None:
            if not pending.internal.done():
                offset = response_body_offset(body, pending.header.api_key, pending.header.api_version)
                pending.internal.set_result(bytes(body[offset:]))
            self._release_local(out, now)
            return
        self._count_latency(pending, now, len(frame) - 4)
        if sasl_released:
            asyncio.get_running_loop().call_soon(self._sasl_handshake_answered)
        identity = session.identity
        if (
            pending.header.api_key in (Api.SASL_HANDSHAKE, Api.SASL_AUTHENTICATE)
            and not identity.in_progress
            and identity.last_failure
            and not identity.authenticated
        ):
            log.info("%s via %s: %s", self.peer, self.label, printable(identity.last_failure))
        services = self.services
        result = inspect_response(
            pending,
            body,
            services.directory,
            services.topic_ids,
            services.version_caps,
            self._shape,
            services.policy.guard,
        )
        if result is None:
            self._finish(pending, frame, out, now)
        elif isinstance(result, AddressEdit):
            # A broker without a listener yet: hold this and later responses (order is kept) and
            # stop reading the broker until the listener is up.
            self.pause(self.upstream, session.hold_responses())
            if out:
                self.client.transport.writelines(out)
                out.clear()
            self._spawn(self._finish_edit(pending, result))
            return
        else:
            self._finish(pending, _SIZE.pack(len(result)) + result, out, now)
        self._release_local(out, now)

    def _tail_done(self) -> None:
        """A streamed response is complete; brokers it named without a listener get one now."""
        assert self._tail is not None
        missing, self._tail = self._tail.missing, None
        if missing:
            self._spawn(self._learn(missing))

    async def _learn(self, endpoints: Any) -> None:
        try:
            await self.services.directory.learn(endpoints)
        except Exception as exc:  # noqa: BLE001 - e.g. no free port; the next Metadata tries again
            log.warning("cannot start a listener for %s: %s: %s", endpoints, type(exc).__name__, exc)

    async def _finish_edit(self, pending: Pending, edit: AddressEdit) -> None:
        try:
            await self.services.directory.learn(edit.endpoints)
            rendered = edit.render(self.services.directory)
        except Exception as exc:  # noqa: BLE001 - e.g. no free port left in the configured range
            self.close(f"cannot rewrite broker addresses: {type(exc).__name__}: {exc}", "listener")
            return
        if self.closed:
            return
        out: list[Any] = []
        now = monotonic()
        self._finish(pending, _SIZE.pack(len(rendered)) + rendered, out, now)
        self._release_local(out, now)
        self.client.transport.writelines(out)
        self._deliver(self.session.take_held_responses(), now)
        if self.session.held_responses is None:
            self.resume(self.upstream, Pause.NEW_LISTENER)
