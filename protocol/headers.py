"""Request and response headers: the only part of every frame the proxy always reads.

Hand-parsed because it runs for every frame and is four fixed fields; the body is left alone.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.apis import request_is_flexible, response_header_is_flexible
from protocol.errors import ProtocolError
from protocol.varint import skip_tagged_fields

_REQ: Final = struct.Struct(">hhih")
_REQ_unpack: Final = _REQ.unpack_from  # bound once: compiled, a method call by name is a lookup each time
_CORR: Final = struct.Struct(">i")
_CORR_unpack: Final = _CORR.unpack_from


class HeaderError(ProtocolError):
    """The frame is too short or inconsistent to hold a Kafka header."""


class RequestHeader:
    """A request's header, read. A plain class, not a dataclass: compiled by mypyc, a dataclass's ``__init__`` stays
    the interpreted one the decorator generates (≈7k instructions a header, measured with callgrind); this one is
    native. Treat it as immutable."""

    __slots__ = ("api_key", "api_version", "correlation_id", "client_id", "body_offset")

    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                 body_offset: int | None) -> None:
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
        return ("RequestHeader(api_key={}, api_version={}, correlation_id={}, client_id={!r}, body_offset={})"
                .format(*self._key()))


def parse_request_header(frame: bytes | memoryview) -> RequestHeader:
    if len(frame) < _REQ.size:
        raise HeaderError(f"request frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, cid_len = _REQ_unpack(frame, 0)
    pos = _REQ.size
    client_id: str | None = None
    if cid_len >= 0:
        end = pos + cid_len
        if end > len(frame):
            raise HeaderError("client_id runs past the end of the request frame")
        try:
            client_id = bytes(frame[pos:end]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HeaderError("client_id is not valid UTF-8") from exc
        pos = end
    elif cid_len != -1:
        raise HeaderError(f"client_id length {cid_len} is invalid")
    flexible = request_is_flexible(api_key, api_version)
    body_offset: int | None = pos
    if flexible is None:
        body_offset = None
    elif flexible:
        body_offset = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, body_offset)


def response_correlation_id(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise HeaderError(f"response frame of {len(frame)} bytes is shorter than a response header")
    return _CORR_unpack(frame, 0)[0]


def response_body_offset(frame: bytes | memoryview, api_key: int, api_version: int) -> int:
    flexible = response_header_is_flexible(api_key, api_version)
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
