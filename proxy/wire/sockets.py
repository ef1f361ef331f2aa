"""The two sockets of a client connection, as asyncio protocols: every event goes straight to the connection.

Why a module of its own: these are the loop's callbacks (reads, end of file, backpressure), nothing more; what a
read means is the connection's (``proxy.wire.connection``). The connection is a :class:`SideOwner`, a native base
class declared here, so that compiled (``proxy.build_info.COMPILED``) each callback is a native call and this
module never imports the connection (no import circle).
"""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.session import Pause


class SideOwner:
    """What a socket hands its events to: :class:`proxy.wire.connection.Connection` overrides every method."""

    def client_connected(self) -> None:
        raise NotImplementedError

    def side_closed(self, side: Side, eof: bool) -> None:
        raise NotImplementedError

    def other(self, side: Side) -> Side:
        raise NotImplementedError

    def pause(self, side: Side, reason: str) -> None:
        raise NotImplementedError

    def resume(self, side: Side, reason: str) -> None:
        raise NotImplementedError

    def requests_received(self, data: bytes) -> None:
        raise NotImplementedError

    def response_buffer(self) -> memoryview:
        raise NotImplementedError

    def responses_received(self, nbytes: int) -> None:
        raise NotImplementedError

    def response_chunk(self, data: bytes) -> None:
        raise NotImplementedError


class Side(asyncio.BaseProtocol):
    """One socket of a Connection; every event goes straight to the Connection."""

    def __init__(self, conn: SideOwner, is_client: bool) -> None:
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


class ClientSide(Side, asyncio.Protocol):
    """The client's socket: requests arrive as chunks (small on consume; see FrameReader)."""

    def data_received(self, data: bytes) -> None:
        self.conn.requests_received(data)


class UpstreamSide(Side, asyncio.BufferedProtocol):
    """The broker's socket once the client has sent a Fetch: responses are read straight into the Connection's
    receive buffer, and a large one streams on from there without a copy."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.response_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.responses_received(nbytes)


class UpstreamChunks(asyncio.Protocol):
    """The broker's socket until the client's first Fetch: each read arrives as the ``bytes`` the loop made of
    it. Why: a producer's response is one small read, and as a chunk it is the frame itself, with no buffer
    callback before the read and no copy out of a buffer after it (uvloop's buffered read and our slicing cost a
    tenth of a round trip). Every other event is :class:`UpstreamSide`'s, which keeps the socket's state."""

    def __init__(self, side: UpstreamSide) -> None:
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
