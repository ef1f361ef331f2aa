"""One client connection paired with one upstream broker connection.

Two pumps run side by side: requests client → broker, responses broker → client. Frames are read
whole, their header looked at, and written on unchanged unless a response must be rewritten.
Anything malformed closes this connection only, with one log line naming the peer, api and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from typing import TYPE_CHECKING

from protocol.apis import Api, api_name, decode_body, request_class
from protocol.frames import FrameError, frame_size
from protocol.headers import RequestHeader, parse_request_header, response_correlation_id
from protocol.inflight import InFlight, Pending, expects_response
from proxy.responses import rewrite_response

if TYPE_CHECKING:
    from proxy.server import Proxy

log = logging.getLogger(__name__)

# SaslHandshake v0 is followed by raw SASL tokens, framed but without Kafka headers.
_RAW = RequestHeader(-1, 0, 0, None, None)
_RAW_ROUND_TRIPS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}


class ProtocolViolation(Exception):
    """This connection's byte stream cannot be followed any more."""


class Connection:
    def __init__(
        self,
        proxy: Proxy,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream: list[tuple[str, int]],
        label: str,
    ) -> None:
        self.proxy = proxy
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.candidates = upstream
        self.upstream_addr: tuple[str, int] = upstream[0] if upstream else ("?", 0)
        self.label = label
        peer = client_writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.inflight = InFlight()
        self.raw_tokens_left = 0
        self._sasl_mechanism: str | None = None
        self.draining = False
        self._request_task: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    async def run(self) -> None:
        connected = await self._connect_upstream()
        if connected is None:
            await self._close_client()
            return
        up_reader, up_writer = connected
        requests = asyncio.create_task(self._pump_requests(up_writer))
        responses = asyncio.create_task(self._pump_responses(up_reader))
        self._request_task = requests
        try:
            done, _ = await asyncio.wait({requests, responses}, return_when=asyncio.FIRST_COMPLETED)
            if requests in done and self.draining:
                # Shutdown: no new requests are read; the ones in flight still get their answers.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), self.proxy.config.shutdown_grace_ms / 1000)
        finally:
            for task in (requests, responses):
                task.cancel()
            for task in (requests, responses):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            up_writer.close()
            await self._close_client()

    async def _connect_upstream(self):
        timeout = self.proxy.config.upstream.connect_timeout_ms / 1000
        for host, port in self.candidates:
            try:
                conn = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except (OSError, TimeoutError) as exc:
                log.warning("%s via %s: cannot reach broker %s:%d (%s)", self.peer, self.label,
                            host, port, exc or "timeout")
                continue
            self.upstream_addr = (host, port)
            return conn
        log.warning("%s via %s: no broker reachable; closing", self.peer, self.label)
        return None

    def drain(self) -> None:
        """Stop reading requests; ``run`` returns once in-flight requests are answered (or grace ends)."""
        self.draining = True
        if self._request_task is not None:
            self._request_task.cancel()

    async def _read_frame(self, reader: asyncio.StreamReader, what: str) -> bytes | None:
        try:
            prefix = await reader.readexactly(4)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise ProtocolViolation(f"{what} stream ended inside a frame size") from None
            return None
        try:
            size = frame_size(prefix, self.proxy.config.max_frame_bytes)
        except FrameError as exc:
            raise ProtocolViolation(f"{what}: {exc}") from None
        try:
            return await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise ProtocolViolation(f"{what} stream ended inside a frame") from None

    async def _pump_requests(self, up_writer: asyncio.StreamWriter) -> None:
        try:
            await self._forward_requests(up_writer)
        except ProtocolViolation as exc:
            log.warning("%s via %s: %s; closing the connection", self.peer, self.label, exc)
        except (ConnectionError, OSError):
            pass

    async def _forward_requests(self, up_writer: asyncio.StreamWriter) -> None:
        reader = self.client_reader
        while True:
            frame = await self._read_frame(reader, "request")
            if frame is None:
                return
            if self.raw_tokens_left > 0:
                self.raw_tokens_left -= 1
                self._push(Pending(_RAW, time.monotonic()))
            else:
                header = self._parse_request(frame)
                if header.api_key == Api.SASL_HANDSHAKE and header.api_version == 0:
                    self._sasl_mechanism = self._handshake_mechanism(frame, header)
                if expects_response(frame, header):
                    self._push(Pending(header, time.monotonic()))
                self.proxy.stats.requests += 1
            up_writer.write(len(frame).to_bytes(4, "big"))
            up_writer.write(frame)
            await up_writer.drain()

    def _push(self, pending: Pending) -> None:
        self.inflight.push(pending)
        self._idle.clear()

    def _parse_request(self, frame: bytes) -> RequestHeader:
        api = "?"
        try:
            header = parse_request_header(frame)
            api = f"{api_name(header.api_key)} v{header.api_version}"
            cap = self.proxy.version_caps.get(header.api_key)
            if cap is not None and header.api_version > cap:
                raise ValueError(f"version is beyond what the proxy decodes (max v{cap})")
            if header.api_key == Api.PRODUCE:
                expects_response(frame, header)  # validates that acks can be read
            return header
        except (ValueError, struct.error) as exc:
            raise ProtocolViolation(f"malformed request ({api}): {exc}") from None

    @staticmethod
    def _handshake_mechanism(frame: bytes, header: RequestHeader) -> str | None:
        try:
            return decode_body(request_class(Api.SASL_HANDSHAKE), frame[header.body_offset:], 0).mechanism
        except Exception:  # noqa: BLE001 - the broker will reject it; we only lose the raw-token count
            return None

    async def _pump_responses(self, up_reader: asyncio.StreamReader) -> None:
        writer = self.client_writer
        proxy = self.proxy
        try:
            while True:
                frame = await self._read_frame(up_reader, "response")
                if frame is None:
                    log.info("%s via %s: broker %s:%d closed the connection", self.peer, self.label,
                             *self.upstream_addr)
                    return
                if self.inflight and self.inflight._queue[0].header is _RAW:
                    self.inflight._queue.popleft()
                else:
                    pending = self.inflight.pop(response_correlation_id(frame))
                    frame = await rewrite_response(
                        pending, frame, proxy.directory, proxy.topic_ids, proxy.version_caps
                    )
                    if pending.header.api_key == Api.SASL_HANDSHAKE and pending.header.api_version == 0:
                        self._after_handshake_v0(frame)
                if not self.inflight:
                    self._idle.set()
                writer.write(len(frame).to_bytes(4, "big"))
                writer.write(frame)
                await writer.drain()
        except ProtocolViolation as exc:
            log.warning("%s via %s: %s; closing the connection", self.peer, self.label, exc)
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # noqa: BLE001 - a bad response closes one connection, never the proxy
            log.warning("%s via %s: cannot process response: %s: %s; closing the connection",
                        self.peer, self.label, type(exc).__name__, exc)

    def _after_handshake_v0(self, frame: bytes) -> None:
        if len(frame) >= 6 and frame[4:6] == b"\x00\x00":
            self.raw_tokens_left = _RAW_ROUND_TRIPS.get(self._sasl_mechanism or "", 1)

    async def _close_client(self) -> None:
        self.client_writer.close()
        with contextlib.suppress(Exception):
            await self.client_writer.wait_closed()
