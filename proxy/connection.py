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
import ssl
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic
from typing import Any, cast

from config.model import ProxyConfig
from mute import ChannelMute
from protocol.apis import Api, api_label, api_name
from protocol.endpoint_apis import ResponseShape, carries_endpoints_tail
from protocol.errors import ProtocolError
from protocol.frames import (
    INITIAL_RECEIVE_BYTES,
    SMALL_RESPONSE_BYTES,
    FrameError,
    FrameReader,
    FrameReceiver,
    RequestBytesPool,
    StreamHead,
    StreamPiece,
    _PoolWaiter,
)
from protocol.headers import parse_request_header, response_body_offset
from protocol.inflight import Pending, expects_response
from protocol.principal import CertificateError, ConnectionIdentity, NoMatchingRule, PrincipalMapper
from protocol.session import RAW, Pause, Request, Session
from protocol.text import printable
from proxy.brokers import BrokerDirectory
from proxy.policy import Decision, Policy, Verdict
from proxy.responses import AddressEdit, StreamedTail, TopicIds, inspect_response, needs_whole_body
from proxy.stats import ApiCounters, Stats, Traffic
from proxy.tls import peer_principal
from proxy.verdicts import Answer, Defer, Replace
from quotas.connections import Refusal

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")


_ERROR_KINDS = (
    ("request stream", "bad_frame"),
    ("malformed", "malformed_request"),
    ("SASL", "sasl"),
    ("request timeout", "request_timeout"),
    ("broker timeout", "broker_timeout"),
    ("no broker reachable", "broker_unreachable"),
    ("client certificate refused", "tls"),
    ("response stream from broker", "bad_response"),
    ("cannot process response", "bad_response"),
    ("cannot rewrite broker addresses", "listener"),
    ("cannot decide", "decide_failed"),
    ("cannot process a request", "internal"),
)


def error_kind(reason: str) -> str:
    """The ``reason`` label of ``ktp_connection_errors_total``: a fixed vocabulary, never client text."""
    for prefix, kind in _ERROR_KINDS:
        if reason.startswith(prefix):
            return kind
    return "protocol"


@dataclass(slots=True)
class Services:
    """What a connection uses of the proxy, and nothing more: settings, counters, the policy seat, the shared
    request pool and broker directory, and the connection limits' admit/release. (Its annotations' classes are
    imported at run time, not under TYPE_CHECKING: compiled, the dataclass resolves them.)"""

    config: ProxyConfig
    stats: Stats
    policy: Policy  # the concrete class: compiled, its methods are called natively (a Protocol is a lookup)
    request_pool: RequestBytesPool
    directory: BrokerDirectory
    topic_ids: TopicIds
    version_caps: dict[int, int]
    """A dict: compiled, the session's per-request ``get`` on it is then native."""
    admit: Callable[[Connection, str], Refusal | None]
    """A new connection from an ip: None to serve it (counted until ``release``), else why not."""
    release: Callable[[Connection], None]
    spoke: Callable[[Connection], Refusal | None]
    """Its first bytes arrived: None when a broker connection (a second fd) may be made, else why not."""
    principal_mapper: PrincipalMapper | None = None
    upstream_ssl: ssl.SSLContext | None = None
    timeline: list[Any] | None = None
    """Where the per-request timeline's records go (``proxy.loop_lag``), None when it is off (the default)."""


class _Side(asyncio.BaseProtocol):
    """One socket of a Connection; every event goes straight to the Connection."""

    def __init__(self, conn: Connection, is_client: bool) -> None:
        self.conn = conn
        self.is_client = is_client
        self.transport: Any = None
        """The asyncio transport (None until connected). ``Any``: uvloop's transports are no subclasses of
        asyncio's, and a compiled attribute would check the declared class."""
        self.pauses: set[str] = set()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.is_client:
            self.conn.client_connected()

    def eof_received(self) -> bool:
        self.conn.side_closed(self, eof=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.side_closed(self, eof=False)

    def pause_writing(self) -> None:
        self.conn.pause(self.conn.other(self), Pause.BACKPRESSURE)

    def resume_writing(self) -> None:
        self.conn.resume(self.conn.other(self), Pause.BACKPRESSURE)


class _ClientSide(_Side, asyncio.Protocol):
    """The client's socket: requests arrive as chunks (small on consume; see FrameReader)."""

    def data_received(self, data: bytes) -> None:
        self.conn.requests_received(data)


class _UpstreamSide(_Side, asyncio.BufferedProtocol):
    """The broker's socket once the client has sent a Fetch: responses are read straight into the Connection's
    receive buffer, and a large one streams on from there without a copy."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.response_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.responses_received(nbytes)


class _UpstreamChunks(asyncio.Protocol):
    """The broker's socket until the client's first Fetch: each read arrives as the ``bytes`` the loop made of
    it. Why: a producer's response is one small read, and as a chunk it is the frame itself, with no buffer
    callback before the read and no copy out of a buffer after it (uvloop's buffered read and our slicing cost a
    tenth of a round trip). Every other event is :class:`_UpstreamSide`'s, which keeps the socket's state."""

    def __init__(self, side: _UpstreamSide) -> None:
        self.side = side

    def connection_made(self, transport: Any) -> None:
        self.side.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.side.conn.response_chunk(data)

    def eof_received(self) -> bool:
        return self.side.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.side.connection_lost(exc)

    def pause_writing(self) -> None:
        self.side.pause_writing()

    def resume_writing(self) -> None:
        self.side.resume_writing()


class Connection:
    def __init__(self, services: Services, candidates: list[tuple[str, int]], label: str) -> None:
        self.services = services
        self.candidates = candidates
        self.label = label
        self.client = _ClientSide(self, is_client=True)
        upstream = _UpstreamSide(self, is_client=False)
        self.upstream = upstream
        self.upstream_chunks = _UpstreamChunks(upstream)
        """What the broker's reads go to until the first Fetch (then ``upstream`` itself: see _buffer_reads)."""
        self.buffered_reads = False
        config = services.config
        max_frame = config.max_frame_bytes
        # Memory is taken as bytes arrive, never at a size a client merely announced: requests grow with what
        # was received (large ones reserve from the proxy-wide pool first), responses start in a small buffer.
        self._requests = FrameReader(max_frame, services.request_pool, config.request_pool_min_bytes)
        self._responses = FrameReceiver(max_frame, self._may_stream, initial=INITIAL_RECEIVE_BYTES)
        self._pool_waiter: _PoolWaiter | None = None  # queued for the request pool (protocol.frames.RequestBytesPool)
        self._tasks: set[asyncio.Task] = set()  # cancelled on close: none outlives its connection
        self._connecting = False
        self._admitted = False  # counted by the connection limits until closed (or shed)
        self._refused_timer: Any = None  # the loop's TimerHandle (uvloop's is its own class)
        now = monotonic()
        self.last_active: float = now
        self._frame_since: float | None = None  # when the incomplete request frame started (while read)
        self._decided: Counter[tuple[str, bool]] = Counter()  # (api, streamed) of responses spanning reads
        self.peer = "?"
        self.upstream_addr: tuple[str, int] | None = None
        # The ordering state (in flight, held, SASL), sans-IO. The identity: SASL principal once an exchange
        # succeeds, else the client certificate's mapped name, else ANONYMOUS.
        self.session = Session(
            ConnectionIdentity(services.config.sasl.oauthbearer_principal_claim), services.version_caps
        )
        self.inflight = self.session.inflight
        self.identity = self.session.identity  # attributes, not properties: the policy reads them per request
        self._tail: StreamedTail | None = None  # the streaming response's closing tagged section
        self._shape = ResponseShape()  # its last untagged Produce/Fetch response: the next alike is not walked
        self.id = str(services.stats.connections_total)
        self._api_key = -(1 << 20)  # no int16 api key: see _api_counters
        self._api = ApiCounters()
        self.traffic = Traffic()  # since the last decision-log summary of this connection
        # Every attribute is annotated: compiled (mypyc), an attribute holds only its declared type, and one
        # inferred from a first ``None`` would refuse what the policy stores later.
        self.policy_state: Any = None  # the policy's own per-connection memo (proxy.verdicts.PolicyConnection)
        self.mute = ChannelMute(asyncio.get_running_loop(), lambda: self.pause(self.client, Pause.MUTED), self._unmuted)
        self._early: list[bytes] = []  # bytes that arrived before the upstream connection was up
        self._timeline: list[Any] | None = services.timeline  # None unless diagnosing (proxy.loop_lag)
        self.draining = False
        self.closed = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def client_id(self) -> str:
        return self.session.client_id

    def other(self, side: _Side) -> _Side:
        return self.upstream if side is self.client else self.client

    # -- reading control ---------------------------------------------------------------------------
    def pause(self, side: _Side, reason: str) -> None:
        if not side.pauses and side.transport is not None and not self.closed:
            side.transport.pause_reading()
        side.pauses.add(reason)

    def resume(self, side: _Side, reason: str) -> None:
        side.pauses.discard(reason)
        if not side.pauses and side.transport is not None and not self.closed:
            side.transport.resume_reading()
            if side is self.client and self._frame_since is not None:
                self._frame_since = monotonic()  # time not read is not the client's slowness
        if reason == Pause.BACKPRESSURE and side is self.client:
            self._release_requests()

    def _spawn(self, coro) -> None:
        """Run ``coro`` on the loop, owned by this connection (kept referenced, cancelled when it closes)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle ---------------------------------------------------------------------------------
    def client_connected(self) -> None:
        transport = self.client.transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        ip = str(peer[0]) if peer else "?"
        refusal = self.services.admit(self, ip)
        if refusal is not None:  # over a connection limit: never served, closed at once or after the throttle
            if refusal.close_after_ms > 0:
                self.pause(self.client, "refused")
                self._refused_timer = asyncio.get_running_loop().call_later(refusal.close_after_ms / 1000, self.close)
            else:
                self.close()
            return
        self._admitted = True
        if self.services.principal_mapper is not None:  # TLS: the handshake is done, the certificate known
            try:
                self.identity.tls_principal = peer_principal(
                    transport.get_extra_info("ssl_object"), self.services.principal_mapper
                )
            except (NoMatchingRule, CertificateError) as exc:  # Kafka fails the authentication
                self.close(f"client certificate refused: {exc}")
                return
        # The broker connection is made when the client first sends something: a connection that never
        # speaks costs the proxy its socket only, and the cluster nothing.

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.services.config.upstream.connect_timeout_ms / 1000
        for host, port in self.candidates:
            if self.closed:
                return
            try:
                await asyncio.wait_for(
                    loop.create_connection(self._upstream_protocol, host, port, ssl=self.services.upstream_ssl), timeout
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                log.warning(
                    "%s via %s: cannot reach broker %s:%d (%s)", self.peer, self.label, host, port, exc or "timeout"
                )
                continue
            self.upstream_addr = (host, port)
            if self.closed:  # the client left while we were connecting
                self.upstream.transport.close()
                return
            early, self._early = self._early, []
            for data in early:
                self.requests_received(data)
            self.resume(self.client, Pause.CONNECTING)
            return
        self.close(f"no broker reachable among {self._candidates_text()}")

    def _upstream_protocol(self) -> Any:
        """What the loop hands the broker's reads to: as chunks until the first Fetch (see _buffer_reads)."""
        return self.upstream if self.buffered_reads else self.upstream_chunks

    def _candidates_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.candidates) or "(unknown broker address)"

    def side_closed(self, side: _Side, eof: bool) -> None:
        if self.closed:
            if side is self.upstream and not eof:
                self._requests.close()  # flushed (or aborted): whatever it still reserved goes back
            return
        if side is self.upstream:
            host, port = self.upstream_addr or ("?", 0)
            log.info("%s via %s: broker %s:%d closed the connection", self.peer, self.label, host, port)
        self.close()

    def check_timeouts(self, now: float) -> None:
        """Called about once a second: close this connection if a request frame has been arriving too long,
        if the broker sits on the oldest request past its own wait plus the margin, or if it has been idle
        longer than ``connections_max_idle_ms``; give a grown response buffer back once quiet."""
        if self.closed:
            return
        cfg = self.services.config
        if (
            self._frame_since is not None
            and not self.client.pauses
            and now - self._frame_since > cfg.request_read_timeout_ms / 1000
        ):
            self.close(
                f"request timeout: a request frame was still incomplete after {cfg.request_read_timeout_ms} "
                f"ms ({self._requests.held_bytes} bytes received)"
            )
            return
        head = self.inflight.head()
        if (
            head is not None
            and head.local is None
            and now - head.sent_at > (head.wait_ms + cfg.upstream_timeout_margin_ms) / 1000
        ):
            host, port = self.upstream_addr or ("?", 0)
            what = (
                "raw SASL token"
                if head.header is RAW
                else (f"{api_name(head.header.api_key)} v{head.header.api_version}")
            )
            self.close(
                f"broker timeout: broker {host}:{port} did not answer {what} within "
                f"{head.wait_ms + cfg.upstream_timeout_margin_ms} ms (its own wait "
                f"{head.wait_ms} ms + upstream_timeout_margin_ms)"
            )
            return
        quiet = now - self.last_active
        if (
            quiet > cfg.connections_max_idle_ms / 1000
            and not self.inflight
            and self._requests.idle
            and not self._responses.streaming
        ):
            log.debug(
                "%s via %s: idle for %d ms; closing (connections_max_idle_ms)", self.peer, self.label, quiet * 1000
            )
            self.close()
            return
        if (
            quiet > 5
            and self.session.held_responses is None
            and (self.client.transport is None or self.client.transport.get_write_buffer_size() == 0)
        ):
            self._responses.shrink()

    def drain(self) -> None:
        """Stop reading requests; close once every request in flight has been answered."""
        self.draining = True
        self.pause(self.client, "draining")
        if not self.inflight and not self._responses.streaming:  # a streamed response is popped at its head
            self.close()

    def close(self, reason: str | None = None) -> None:
        if self.closed:
            return
        if reason:
            log.warning("%s via %s: %s; closing the connection", self.peer, self.label, printable(reason, 500))
            self.services.stats.connection_errors[error_kind(reason)] += 1
        self.closed = True
        self.mute.cancel()
        if self._admitted:
            self._admitted = False
            self.services.release(self)
        if self._refused_timer is not None:
            self._refused_timer.cancel()
        if self._pool_waiter is not None:
            self.services.request_pool.cancel(self._pool_waiter)
            self._pool_waiter = None
        upstream = self.upstream.transport
        if upstream is None or not upstream.get_write_buffer_size():
            self._requests.close()
        # else: the closing transport still holds forwarded frames; their bytes go back to the request pool
        # when it has flushed them (side_closed, from connection_lost), not before.
        for task in list(self._tasks):
            task.cancel()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s via %s: closed; %d response receive buffer(s) allocated; responses spanning reads: %s",
                self.peer,
                self.label,
                self._responses.allocations,
                ", ".join(
                    f"{api} {'streamed' if s else 'assembled'} ×{n}" for (api, s), n in sorted(self._decided.items())
                )
                or "none",
            )
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()  # flushes what is already written
        if not self.done.done():
            self.done.set_result(None)

    def abort(self) -> None:
        self.close()
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.abort()

    def shed(self) -> None:
        """Closed to make room for another address's connection: the limits no longer count it (the caller
        logs and counts shedding, rate-limited; one line per connection would let a flood flood the log)."""
        self._admitted = False
        self.close()

    def idle_for_shedding(self, now: float, min_idle_s: float) -> bool:
        """Whether closing this connection loses nothing: nothing in flight, in the middle of arriving, or
        streaming, and no traffic for ``min_idle_s`` (asked only when room must be made, never per request)."""
        return (
            not self.closed
            and not self.inflight
            and self._requests.idle
            and not self._responses.streaming
            and self.session.deferred is None
            and now - self.last_active >= min_idle_s
        )

    # -- requests: client → broker -----------------------------------------------------------------
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
            self.close(f"request stream: {exc}")
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

    def _process_requests(self, frames, now: float) -> None:
        """Handle the requests of one read (or those that stopped waiting), in order, until the session says the
        rest wait: then carry that out. ``now``: the clock when the frames were read, or stopped waiting."""
        out: list = []
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
                        self._start_decision(item, bytes(frame))
                    elif reason is Pause.TURN:  # other connections go first
                        asyncio.get_running_loop().call_soon(self._next_turn)
                    break
        except ProtocolError as exc:  # the client's bytes: one line, its connection only
            if out:
                self.upstream.transport.writelines(out)
            self.close(str(exc))
            return
        except Exception as exc:  # a bug or a body that breaks a decoder: this connection only, never the proxy
            if out:
                self.upstream.transport.writelines(out)
            log.exception("%s via %s: cannot process a request", self.peer, self.label)
            self.close(f"cannot process a request: {type(exc).__name__}: {exc}")
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

    def _on_request(self, frame: bytes | bytearray | memoryview, now: float):
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
        verdict = services.policy.on_request(self, header, request.frame, now)
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

    def _apply(self, verdict: Verdict, request: Request, now: float):
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
        out: list = []
        self._release_local(out, now)
        if out:
            self.client.transport.writelines(out)

    async def _decide(self, defer: Defer, frame) -> None:
        try:
            verdict = cast(Verdict, await defer.decide())
        except Exception as exc:  # noqa: BLE001 - a failed lookup closes this connection, never the proxy
            self.close(f"cannot decide on a request: {type(exc).__name__}: {exc}")
            return
        if self.closed:
            return
        # A task: what escapes it is no WARNING and no close but "Task exception was never retrieved", long after.
        try:
            header = parse_request_header(frame, 4)
            request = Request(header, frame, expects_response(frame, header, 4))
            item = self._apply(verdict, request, monotonic())
        except ProtocolError as exc:  # the client's bytes: one line, its connection only (as _process_requests)
            self.close(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a bug: this connection only, never the proxy
            log.exception("%s via %s: cannot process a request", self.peer, self.label)
            self.close(f"cannot process a request: {type(exc).__name__}: {exc}")
            return
        if type(item) is Defer:
            raise AssertionError("a deferred decision must not defer again")
        if item is not None:
            self.upstream.transport.write(item)
        if self._timeline is not None:
            self._timeline.append(("decided", self.id, header.correlation_id, monotonic()))
        self.resume(self.client, Pause.DECIDING)
        if self.session.end_hold(Pause.DECIDING, self.mute.held):
            self._release_deferred()

    def _release_deferred(self) -> None:
        held = self.session.take_held_requests()
        if held:
            self._process_requests(held, monotonic())
        else:
            self._release_requests()

    def _start_decision(self, defer: Defer, frame: bytes) -> None:
        """Decide a deferred request now, or once the mute it asks for (a KIP-936 hold) has run out."""
        if defer.wait_s > 0:
            self.mute.mute_for(defer.wait_s)
            if self.session.defer_decision(defer, frame, self.mute.muted):
                return
        self._spawn(self._decide(defer, frame))

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

    def ask(self, api_key: int, api_version: int, body: bytes) -> asyncio.Future:
        """Send a request of the proxy's own on this connection's broker link; the future gets the response
        body (after its header). It is answered in order, like the client's requests, so it sees the cluster
        as the client's next request will."""
        fut = asyncio.get_running_loop().create_future()
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
        """Whether a large response, of which ``head`` is the first bytes, can be forwarded as it arrives
        (the session's ordering rules, and no broker address past its leading bytes). Called lazily by
        FrameReceiver, after every earlier response was handled."""
        if not self.session.may_stream(head):
            return False
        head_pending = self.inflight.head()
        assert head_pending is not None  # may_stream: a request is waiting
        header = head_pending.header
        stream = not needs_whole_body(header.api_key, header.api_version)
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
        """A read from the broker as ``bytes`` (see _UpstreamChunks). The usual one is exactly one small
        response, with nothing pending before it: that is the frame, handed on as it is. Anything else is
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

    def _deliver(self, held: list | None, now: float) -> None:
        """Pass on the responses now complete in the receive buffer, or (``held``) ones that waited, in order.
        ``now``: the clock when they were read, or when they stopped waiting."""
        out: list = []
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
            self.close(f"response stream from broker: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a bad response closes one connection, never the proxy
            if out:
                self.client.transport.writelines(out)
            self.close(f"cannot process response: {type(exc).__name__}: {exc}")
            return
        if out:
            self.client.transport.writelines(out)
        if self.draining and not self.inflight and session.held_responses is None and not self._responses.streaming:
            self.close()

    def _release_local(self, out: list, now: float) -> None:
        """Release the proxy's own answers that have reached the head of the queue."""
        for pending in self.session.ready_answers():
            self._finish(pending, pending.local, out, now)

    def _finish(self, pending: Pending, frame, out: list, now: float, total: int | None = None) -> None:
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

    def _count_latency(self, pending: Pending, now: float) -> None:
        counters = self._api_counters(pending.header.api_key)
        counters.latency_sum += now - pending.sent_at
        counters.latency_count += 1

    def _on_response(self, frame, out: list, now: float) -> None:
        self._release_local(out, now)
        session = self.session
        if type(frame) is StreamHead:
            # may_stream checked that it answers the oldest request, that nothing in it is ever
            # rewritten, and that the policy needs no more than its leading bytes (throttle_time_ms).
            pending = session.streamed()
            self._count_latency(pending, now)
            key, version = pending.header.api_key, pending.header.api_version
            if carries_endpoints_tail(key, version):
                pieces: list = []
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
        self._count_latency(pending, now)
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

    async def _learn(self, endpoints) -> None:
        try:
            await self.services.directory.learn(endpoints)
        except Exception as exc:  # noqa: BLE001 - e.g. no free port; the next Metadata tries again
            log.warning("cannot start a listener for %s: %s: %s", endpoints, type(exc).__name__, exc)

    async def _finish_edit(self, pending: Pending, edit: AddressEdit) -> None:
        try:
            await self.services.directory.learn(edit.endpoints)
            rendered = edit.render(self.services.directory)
        except Exception as exc:  # noqa: BLE001 - e.g. no free port left in the configured range
            self.close(f"cannot rewrite broker addresses: {type(exc).__name__}: {exc}")
            return
        if self.closed:
            return
        out: list = []
        now = monotonic()
        self._finish(pending, _SIZE.pack(len(rendered)) + rendered, out, now)
        self._release_local(out, now)
        self.client.transport.writelines(out)
        self._deliver(self.session.take_held_responses(), now)
        if self.session.held_responses is None:
            self.resume(self.upstream, Pause.NEW_LISTENER)
