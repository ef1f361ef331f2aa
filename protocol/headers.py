"""Request and response headers: the only part of every frame the proxy always reads.

Hand-parsed because it runs for every frame and is four fixed fields; the body is left alone.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from protocol.apis import request_is_flexible, response_header_is_flexible
from protocol.errors import ProtocolError
from protocol.varint import TruncatedError, skip_tagged_fields

_REQ: Final = struct.Struct(">hhih")
_CORR: Final = struct.Struct(">i")
_CORR_unpack: Final = _CORR.unpack_from


class HeaderError(ProtocolError):
    """The frame is too short or inconsistent to hold a Kafka header."""


class RequestHeader:
    """A request's header, read. A plain class, not a dataclass: compiled by mypyc, a dataclass's ``__init__`` stays
    the interpreted one the decorator generates, and a header is made for every request; this one is native. Treat
    it as immutable."""

    __slots__ = ("api_key", "api_version", "correlation_id", "client_id", "body_offset")

    def __init__(
        self, api_key: int, api_version: int, correlation_id: int, client_id: str | None, body_offset: int | None
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.body_offset: int | None = body_offset
        """Where the body starts; None when the API is unknown (its header version cannot be known)."""

    def _key(self) -> tuple[int, int, int, str | None, int | None]:
        return self.api_key, self.api_version, self.correlation_id, self.client_id, self.body_offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestHeader) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "RequestHeader(api_key={}, api_version={}, correlation_id={}, client_id={!r}, body_offset={})".format(
            *self._key()
        )


HEAD_COPY_BYTES: Final = 128 * 1024
"""Of a request that is not ``bytes`` (a large frame: see ``protocol.frames.SMALL_FRAME_BYTES``), the leading bytes
copied for :func:`parse_request_header`: the fixed fields and a client id always fit (at most 32,777 bytes); a
tagged section that does not fit has the whole request copied instead."""


def parse_request_header(frame: bytes | bytearray | memoryview, start: int = 0) -> RequestHeader:
    """The header of the request at ``frame[start:]`` (after the size prefix); ``body_offset`` counts from
    ``start``. Raises :class:`HeaderError` (or ``TruncatedError``) for a header that does not parse."""
    if isinstance(frame, bytes):
        return _parse_request_header(frame, start)
    view = memoryview(frame)[start:]
    head = bytes(view[:HEAD_COPY_BYTES])
    try:
        return _parse_request_header(head, 0)
    except TruncatedError:
        if len(head) == len(view):
            raise
        return _parse_request_header(bytes(view), 0)  # a tagged section longer than the copy: rare


class _FlexibleMemo:
    """``request_is_flexible`` or ``response_header_is_flexible`` (``lookup``) for the (api, version) asked last: a
    client sends the same request after request, and the lookup is an interpreted, cached call where this is a
    compare."""

    __slots__ = ("lookup", "key", "flexible")

    def __init__(self, lookup: Callable[[int, int], bool | None]) -> None:
        self.lookup = lookup
        self.key = -1
        self.flexible: bool | None = None

    def get(self, api_key: int, api_version: int) -> bool | None:
        key = (api_key + 0x8000) << 16 | (api_version + 0x8000)  # both int16: a unique non-negative key
        if key != self.key:
            self.flexible = self.lookup(api_key, api_version)
            self.key = key
        return self.flexible


_REQUEST_FLEXIBLE: Final = _FlexibleMemo(request_is_flexible)
_RESPONSE_FLEXIBLE: Final = _FlexibleMemo(response_header_is_flexible)


class _ClientIdMemo:
    """The last client id read, as bytes and as text. A connection sends one client id request after request; a
    compare of its bytes costs a fraction of a UTF-8 decode (compiled: ~230 instructions for a short id), and the
    one str object then compares by identity wherever the id is compared again (the policy's memos). One entry: the
    memory it keeps is one client id, whatever the clients send."""

    __slots__ = ("raw", "text")

    def __init__(self) -> None:
        self.raw = b""
        self.text = ""


_CLIENT_ID: Final = _ClientIdMemo()


def _parse_request_header(frame: bytes, start: int) -> RequestHeader:
    """Byte by byte on ``bytes``: compiled, each read is native, where ``struct`` and memoryview slices are calls."""
    end = len(frame)
    if end - start < 10:
        raise HeaderError(f"request frame of {end - start} bytes is shorter than a request header")
    p = start
    api_key = frame[p] << 8 | frame[p + 1]
    api_version = frame[p + 2] << 8 | frame[p + 3]
    correlation_id = frame[p + 4] << 24 | frame[p + 5] << 16 | frame[p + 6] << 8 | frame[p + 7]
    cid_len = frame[p + 8] << 8 | frame[p + 9]
    if api_key >= 0x8000:
        api_key -= 0x10000
    if api_version >= 0x8000:
        api_version -= 0x10000
    if correlation_id >= 0x80000000:
        correlation_id -= 0x100000000
    pos = p + 10
    client_id: str | None = None
    if cid_len == 0xFFFF:  # -1: null
        pass
    elif cid_len >= 0x8000:
        raise HeaderError(f"client_id length {cid_len - 0x10000} is invalid")
    else:
        stop = pos + cid_len
        if stop > end:
            raise HeaderError("client_id runs past the end of the request frame")
        raw = frame[pos:stop]
        memo = _CLIENT_ID
        if raw == memo.raw:
            client_id = memo.text
        else:
            try:
                client_id = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise HeaderError("client_id is not valid UTF-8") from exc
            memo.raw, memo.text = raw, client_id
        pos = stop
    flexible = _REQUEST_FLEXIBLE.get(api_key, api_version)
    body_offset: int | None = pos - start
    if flexible is None:
        body_offset = None
    elif flexible:
        # No tagged fields (nearly every header) is read here, natively.
        body_offset = (pos + 1 if pos < end and frame[pos] == 0 else skip_tagged_fields(frame, pos)) - start
    return RequestHeader(api_key, api_version, correlation_id, client_id, body_offset)


def response_correlation_id(frame: bytes | memoryview, start: int = 0) -> int:
    """The correlation id of the response at ``frame[start:]`` (after its size prefix): read byte by byte on
    ``bytes`` (native when compiled, where ``struct`` is a generic call), with ``struct`` on a view."""
    if len(frame) - start < 4:
        raise HeaderError(f"response frame of {len(frame) - start} bytes is shorter than a response header")
    if isinstance(frame, bytes):
        c = frame[start] << 24 | frame[start + 1] << 16 | frame[start + 2] << 8 | frame[start + 3]
        return c - 0x100000000 if c >= 0x80000000 else c
    corr: int = _CORR_unpack(frame, start)[0]
    return corr


def response_body_offset(frame: bytes | memoryview, api_key: int, api_version: int) -> int:
    flexible = _RESPONSE_FLEXIBLE.get(api_key, api_version)
    if flexible is None:
        raise HeaderError(f"cannot locate the body of a response to unknown api {api_key}")
    return skip_tagged_fields(frame, 4) if flexible else 4


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    return _CORR.pack(correlation_id) + (b"\x00" if flexible else b"")


def encode_request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> bytes:
    """A request header for a request the proxy sends on its own account (v1, or v2 for flexible versions)."""
    flexible = request_is_flexible(api_key, api_version)
    if flexible is None:
        raise HeaderError(f"cannot build a header for unknown api {api_key}")
    cid = b"" if client_id is None else client_id.encode("utf-8")
    head = _REQ.pack(api_key, api_version, correlation_id, len(cid) if client_id is not None else -1) + cid
    return head + (b"\x00" if flexible else b"")
