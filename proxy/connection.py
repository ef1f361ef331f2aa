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
import time
from collections import Counter, deque
from typing import TYPE_CHECKING

from protocol.apis import Api, api_name, decode_body, request_class
from protocol.frames import FrameError, FrameReader, FrameReceiver, StreamHead, StreamPiece
from protocol.headers import RequestHeader, parse_request_header, response_body_offset, response_correlation_id
from protocol.inflight import InFlight, Pending, expects_response
from proxy.responses import AddressEdit, inspect_response, needs_whole_body

if TYPE_CHECKING:
    from proxy.server import Proxy

log = logging.getLogger(__name__)

# SaslHandshake v0 is followed by raw SASL tokens, framed but without Kafka headers.
_RAW = RequestHeader(-1, 0, 0, None, None)
_RAW_ROUND_TRIPS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}
_SIZE = struct.Struct(">i")


class ProtocolViolation(Exception):
    """This connection's byte stream cannot be followed any more."""


class _Side(asyncio.BaseProtocol):
    """One socket of a Connection; every event goes straight to the Connection."""

    def __init__(self, conn: Connection, is_client: bool) -> None:
        self.conn = conn
        self.is_client = is_client
        self.transport: asyncio.Transport | None = None
        self.pauses: set[str] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.is_client:
            self.conn.client_connected()

    def eof_received(self) -> bool:
        self.conn.side_closed(self, eof=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.side_closed(self, eof=False)

    def pause_writing(self) -> None:
        self.conn.pause(self.conn.other(self), "backpressure")

    def resume_writing(self) -> None:
        self.conn.resume(self.conn.other(self), "backpressure")


class _ClientSide(_Side, asyncio.Protocol):
    """The client's socket: requests arrive as chunks (small on consume; see FrameReader)."""

    def data_received(self, data: bytes) -> None:
        self.conn.requests_received(data)


class _UpstreamSide(_Side, asyncio.BufferedProtocol):
    """The broker's socket: responses are read straight into the Connection's receive buffer."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.response_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.responses_received(nbytes)


class Connection:
    def __init__(self, proxy: Proxy, candidates: list[tuple[str, int]], label: str) -> None:
        self.proxy = proxy
        self.candidates = candidates
        self.label = label
        self.client: _Side = _ClientSide(self, is_client=True)
        self.upstream: _Side = _UpstreamSide(self, is_client=False)
        max_frame = proxy.config.max_frame_bytes
        self._requests = FrameReader(max_frame)
        self._responses = FrameReceiver(max_frame, self._may_stream)
        self._decided: Counter[tuple[str, bool]] = Counter()  # (api, streamed) of responses spanning reads
        self.inflight = InFlight()
        self.peer = "?"
        self.upstream_addr: tuple[str, int] | None = None
        self.raw_tokens_left = 0
        self._sasl_mechanism: str | None = None
        self._held: deque | None = None  # responses held behind one waiting for a new listener
        self._early: list[bytes] = []  # bytes that arrived before the upstream connection was up
        self.draining = False
        self.closed = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

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

    # -- lifecycle ---------------------------------------------------------------------------------
    def client_connected(self) -> None:
        peer = self.client.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.pause(self.client, "connecting")
        asyncio.get_running_loop().create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.proxy.config.upstream.connect_timeout_ms / 1000
        for host, port in self.candidates:
            if self.closed:
                return
            try:
                await asyncio.wait_for(loop.create_connection(lambda: self.upstream, host, port), timeout)
            except (OSError, TimeoutError) as exc:
                log.warning("%s via %s: cannot reach broker %s:%d (%s)", self.peer, self.label, host, port,
                            exc or "timeout")
                continue
            self.upstream_addr = (host, port)
            if self.closed:  # the client left while we were connecting
                self.upstream.transport.close()
                return
            self.resume(self.client, "connecting")
            early, self._early = self._early, []
            for data in early:
                self.requests_received(data)
            return
        self.close(f"no broker reachable among {self._candidates_text()}")

    def _candidates_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.candidates) or "(unknown broker address)"

    def side_closed(self, side: _Side, eof: bool) -> None:
        if self.closed:
            return
        if side is self.upstream:
            host, port = self.upstream_addr or ("?", 0)
            log.info("%s via %s: broker %s:%d closed the connection", self.peer, self.label, host, port)
        self.close()

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
            log.warning("%s via %s: %s; closing the connection", self.peer, self.label, reason)
        self.closed = True
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s via %s: closed; %d response receive buffer(s) allocated; responses spanning reads: %s",
                      self.peer, self.label, self._responses.allocations,
                      ", ".join(f"{api} {'streamed' if s else 'assembled'} ×{n}" for (api, s), n in
                                sorted(self._decided.items())) or "none")
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

    # -- requests: client → broker -----------------------------------------------------------------
    def requests_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.upstream.transport is None:
            # The event loop may deliver a first read before a pause takes effect: keep it (one
            # chunk at most) and pause again; it is replayed once the upstream connection is up.
            self._early.append(data)
            self.client.transport.pause_reading()
            return
        try:
            frames = self._requests.feed(data)
            for frame in frames:
                self._on_request(frame)
        except FrameError as exc:
            self.close(f"request stream: {exc}")
            return
        except ProtocolViolation as exc:
            self.close(str(exc))
            return
        if frames:
            self.upstream.transport.writelines(frames)

    def _on_request(self, frame: memoryview | bytearray) -> None:
        now = time.monotonic()
        if self.raw_tokens_left > 0:
            self.raw_tokens_left -= 1
            self.inflight.push(Pending(_RAW, now))
            return
        body = memoryview(frame)[4:]  # a view: slicing a bytearray would copy the frame
        api = "?"
        try:
            header = parse_request_header(body)
            api = f"{api_name(header.api_key)} v{header.api_version}"
            cap = self.proxy.version_caps.get(header.api_key)
            if cap is not None and header.api_version > cap:
                raise ValueError(f"version is beyond what the proxy decodes (max v{cap})")
            answered = expects_response(body, header)
        except (ValueError, struct.error) as exc:
            raise ProtocolViolation(f"malformed request ({api}): {exc}") from None
        if header.api_key == Api.SASL_HANDSHAKE and header.api_version == 0:
            self._sasl_mechanism = self._handshake_mechanism(body, header)
        if answered:
            self.inflight.push(Pending(header, now))
        self.proxy.stats.requests += 1

    @staticmethod
    def _handshake_mechanism(body, header: RequestHeader) -> str | None:
        try:
            return decode_body(request_class(Api.SASL_HANDSHAKE), body[header.body_offset:], 0).mechanism
        except ValueError:
            return None  # the broker will reject it; only the raw-token count is lost

    # -- responses: broker → client ----------------------------------------------------------------
    def response_buffer(self) -> memoryview:
        """Where the next read from the broker lands. The bytes already handed on may be overwritten
        only once the client transport has sent them all (it keeps views, not copies) and nothing is
        held for a new listener; otherwise the read goes to fresh space."""
        transport = self.client.transport
        reusable = self._held is None and (transport is None or transport.get_write_buffer_size() == 0)
        return self._responses.get_buffer(reusable)

    def _may_stream(self, head: memoryview) -> bool:
        """Whether a large response, of which ``head`` is the first bytes, can be forwarded as it
        arrives: only when it answers the oldest request and that request's response is never
        rewritten. Called lazily by FrameReceiver, after every earlier response was handled."""
        if self._held is not None:
            return False
        pending = self.inflight.head()
        if pending is None:
            return False
        header = pending.header
        if header is _RAW:
            return True
        stream = self._streamable(head, header)
        self._decided[(f"{api_name(header.api_key)} v{header.api_version}", stream)] += 1
        return stream

    @staticmethod
    def _streamable(head: memoryview, header: RequestHeader) -> bool:
        """The part of the decision that depends on the response and its request only."""
        if header.correlation_id != response_correlation_id(head[4:]):
            return False  # assembled, then refused with the usual message
        if needs_whole_body(header.api_key, header.api_version):
            return False
        try:  # a response header that does not parse is refused as an assembled frame would be
            response_body_offset(head[4:], header.api_key, header.api_version)
        except ValueError:
            return False
        return True

    def responses_received(self, nbytes: int) -> None:
        if self.closed:
            return
        self._deliver(self._responses.received(nbytes))

    def _deliver(self, frames) -> None:
        out: list = []
        try:
            for frame in frames:
                if self._held is not None:
                    self._held.append(frame)
                elif type(frame) is StreamPiece:
                    out.append(frame.data)
                else:
                    self._on_response(frame, out)
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
        if self.draining and not self.inflight and self._held is None and not self._responses.streaming:
            self.close()

    def _on_response(self, frame, out: list) -> None:
        head = self.inflight.head()
        if type(frame) is StreamHead:
            # _may_stream checked that it answers the oldest request (raw SASL tokens have no
            # header) and that nothing in it is ever rewritten.
            self.inflight.pop(head.header.correlation_id)
            out.append(frame.data)
            return
        if head is not None and head.header is _RAW:
            self.inflight.pop(head.header.correlation_id)
            out.append(frame)
            return
        body = frame[4:]  # frames are memoryviews: no copy
        pending = self.inflight.pop(response_correlation_id(body))
        result = inspect_response(pending, body, self.proxy.directory, self.proxy.topic_ids,
                                  self.proxy.version_caps)
        if result is None:
            out.append(frame)
        elif isinstance(result, AddressEdit):
            # A broker without a listener yet: hold this and later responses (order is kept) and
            # stop reading the broker until the listener is up.
            self._held = deque()
            self.pause(self.upstream, "new-listener")
            if out:
                self.client.transport.writelines(out)
                out.clear()
            asyncio.get_running_loop().create_task(self._finish_edit(pending, result))
            return
        else:
            out.append(_SIZE.pack(len(result)))
            out.append(result)
        if pending.header.api_key == Api.SASL_HANDSHAKE and pending.header.api_version == 0:
            self._after_handshake_v0(body)

    async def _finish_edit(self, pending: Pending, edit: AddressEdit) -> None:
        try:
            await self.proxy.directory.learn(edit.endpoints)
            rendered = edit.render(self.proxy.directory)
        except Exception as exc:  # noqa: BLE001 - e.g. no free port left in the configured range
            self.close(f"cannot rewrite broker addresses: {type(exc).__name__}: {exc}")
            return
        if self.closed:
            return
        self.client.transport.writelines([_SIZE.pack(len(rendered)), rendered])
        held, self._held = self._held, None
        self._deliver(list(held or ()))
        if self._held is None:
            self.resume(self.upstream, "new-listener")

    def _after_handshake_v0(self, body) -> None:
        if len(body) >= 6 and body[4:6] == b"\x00\x00":
            self.raw_tokens_left = _RAW_ROUND_TRIPS.get(self._sasl_mechanism or "", 1)
