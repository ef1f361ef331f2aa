"""Broker addresses inside responses: find them and rewrite them to the proxy's own listeners.

Any address left as the broker's own would let a client bypass the proxy, so every response that
can carry one is handled here: Metadata, FindCoordinator (one coordinator up to v3, a list from v4),
DescribeCluster, the KIP-951 ``node_endpoints`` tagged field of Produce (v10+) and Fetch (v16+), and
the ``node_endpoints`` field of ShareFetch and ShareAcknowledge (KIP-932, every version; a regular
field there, last before the tagged fields, usually an empty array).
Produce, Fetch, ShareFetch and ShareAcknowledge are only skimmed (see ``protocol.skim``); they are
decoded and re-encoded only in the rare case that the broker actually sent endpoints (after a
leadership change).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, TypeAlias

from kafka.protocol.api_message import ApiMessage

from protocol.apis import Api, decode_body, response_class
from protocol.endpoint_apis import (  # the tables and per-response checks: compiled there
    ADDRESS_APIS,
    NODE_ENDPOINTS_TAG,
    SHARE_ADDRESS_APIS,
    tagged_endpoints_since,
    tags_endpoints,
)
from protocol.skim import layout
from protocol.varint import TruncatedError, read_uvarint

_NODE_ENDPOINTS = "node_endpoints"
_FILLER_TAGS = (10_000, 127)
"""Tags no Produce, Fetch, ShareFetch or ShareAcknowledge response defines: clients skip unknown tagged
fields, so one of these, holding zero bytes, pads a rewritten tagged section back to the length already
announced."""


@dataclass(slots=True, frozen=True)
class BrokerEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


def _response_class(api_key: int) -> type[ApiMessage]:
    """The response class of an API that carries broker addresses (every one has one in kafka-python)."""
    cls = response_class(api_key)
    if cls is None:
        raise ValueError(f"no response schema for api {api_key}")
    return cls


@dataclass(slots=True)
class AddressedResponse:
    """A decoded response body known to carry broker addresses."""

    api_key: int
    version: int
    message: ApiMessage

    def endpoints(self) -> list[BrokerEndpoint]:
        return [BrokerEndpoint(n, h, p, r) for n, h, p, r, _ in _entries(self.api_key, self.message)]

    def topic_ids(self) -> dict[uuid.UUID, str]:
        """Topic id → name pairs, from Metadata v10+ (Produce v13 and Fetch v13+ name topics by id)."""
        if self.api_key != Api.METADATA or self.version < 10:
            return {}
        return {
            t.topic_id: t.name
            for t in self.message.topics
            if t.name is not None and t.topic_id is not None and t.topic_id.int != 0
        }

    def replication(self) -> dict[str, int]:
        """Topic name -> its partitions' largest replica count, from a Metadata answer (empty for other APIs)."""
        if self.api_key != Api.METADATA:
            return {}
        out: dict[str, int] = {}
        for t in self.message.topics:
            if t.name and not t.error_code and t.partitions:
                out[t.name] = max(len(p.replica_nodes or ()) for p in t.partitions)
        return out

    def encode(self, mapping: Callable[[BrokerEndpoint], tuple[str, int]]) -> bytes:
        """The body with every broker address replaced by ``mapping(endpoint)``."""
        for node_id, host, port, rack, setter in _entries(self.api_key, self.message):
            new_host, new_port = mapping(BrokerEndpoint(node_id, host, port, rack))
            setter(new_host, new_port)
        return bytes(self.message.encode())  # kafka-python encodes to a bytearray


def decode_addressed(api_key: int, version: int, body: bytes | memoryview) -> AddressedResponse | None:
    """Decode ``body`` if it carries broker addresses, else None (nothing to rewrite).

    Raises ValueError (or struct.error) for a body that does not parse.
    """
    if api_key not in ADDRESS_APIS:
        return None
    cls = _response_class(api_key)
    since = tagged_endpoints_since(api_key)
    if since is not None:
        if version < since or not tags_endpoints(api_key, version, body):
            return None
    elif api_key in SHARE_ADDRESS_APIS:
        start, end = layout(cls, version, body).fields[_NODE_ENDPOINTS]
        if end - start == 1 and body[start] == 1:  # compact array of length 0: the usual case
            return None
    return AddressedResponse(api_key, version, decode_body(cls, body, version))


_Entry: TypeAlias = tuple[int, str, int, "str | None", Callable[[str, int], None]]


def _entries(api_key: int, msg: ApiMessage) -> Iterator[_Entry]:
    """(node_id, host, port, rack, setter) for every live address in the message."""

    def setter_for(obj: Any) -> Callable[[str, int], None]:
        def set_(host: str, port: int) -> None:
            obj.host = host
            obj.port = port

        return set_

    if api_key == Api.METADATA:
        for b in msg.brokers:
            yield b.node_id, b.host, b.port, b.rack, setter_for(b)
    elif api_key == Api.DESCRIBE_CLUSTER:
        for b in msg.brokers:
            yield b.broker_id, b.host, b.port, b.rack, setter_for(b)
    elif api_key == Api.FIND_COORDINATOR:
        if msg.coordinators is not None and msg.version >= 4:
            for c in msg.coordinators:
                if c.node_id >= 0 and c.error_code == 0:
                    yield c.node_id, c.host, c.port, None, setter_for(c)
        elif msg.node_id is not None and msg.node_id >= 0 and msg.error_code == 0:
            yield msg.node_id, msg.host, msg.port, None, setter_for(msg)
    elif api_key in (Api.PRODUCE, Api.FETCH) or api_key in SHARE_ADDRESS_APIS:
        for e in msg.node_endpoints or ():
            yield e.node_id, e.host, e.port, e.rack, setter_for(e)


class _FieldsBefore:
    """A stand-in message class with only the top-level fields of ``cls`` that come before ``stop``.

    Why: ``protocol.tail_watch.TailWatch`` walks a message's top-level fields and stops where its
    tagged section begins. Given this stand-in, the same walk stops where ``node_endpoints`` begins,
    so a ShareFetch response streams through up to there, and only its tail (``node_endpoints`` and
    the tagged section, usually 2 bytes) is held back, exactly as Fetch's tagged section is.
    It offers what the walk reads: ``name``, ``_struct.fields`` and ``flexible_version_q``.
    """

    __slots__ = ("name", "_struct", "_cls")

    def __init__(self, cls: Any, stop: str) -> None:
        fields: dict[str, Any] = {}
        for name, field in cls._struct.fields.items():
            if name == stop:
                break
            fields[name] = field
        else:
            raise ValueError(f"{cls.name} has no field {stop}")
        self._cls = cls
        self.name = f"{cls.name} up to {stop}"
        self._struct = SimpleNamespace(fields=fields)

    def flexible_version_q(self, version: int) -> bool:
        return bool(self._cls.flexible_version_q(version))


@lru_cache(maxsize=16)  # one per API: the stand-ins are keys of skim's plan cache, so they must be reused
def _share_head(api_key: int) -> _FieldsBefore:
    return _FieldsBefore(_response_class(api_key), _NODE_ENDPOINTS)


def tail_watch_class(api_key: int) -> Any:
    """The message class a ``TailWatch`` follows so that it stops where the endpoints tail begins: the
    response class itself (Produce, Fetch: the tagged section) or, for ShareFetch and ShareAcknowledge,
    a stand-in that ends before ``node_endpoints``."""
    if api_key in SHARE_ADDRESS_APIS:
        return _share_head(api_key)
    return _response_class(api_key)


@lru_cache(maxsize=4096)  # versions come from clients (capped, but bounded here too)
def _empty_prefix(api_key: int, version: int) -> bytes:
    """The fields before the endpoints tail of an empty response (all non-tagged fields; for
    ShareFetch and ShareAcknowledge those before ``node_endpoints``): put before a tail, it makes a
    body kafka-python can decode, so the tail is read with the schema, not by hand."""
    cls = _response_class(api_key)
    body = cls().encode(version=version)
    plan = layout(cls, version, body)
    if api_key in SHARE_ADDRESS_APIS:
        return bytes(body[: plan.fields[_NODE_ENDPOINTS][0]])
    return bytes(body[: plan.tags_offset])


def _tag_entries(section: bytes) -> list[tuple[int, bytes]]:
    """(tag, encoded entry) for each field of a tagged section; TruncatedError when it is cut short
    or has bytes after its last field."""
    count, pos = read_uvarint(section, 0)
    entries = []
    for _ in range(count):
        start = pos
        tag, pos = read_uvarint(section, pos)
        size, pos = read_uvarint(section, pos)
        pos += size
        entries.append((tag, section[start:pos]))
    if pos != len(section):
        raise TruncatedError(f"tagged section of {len(section)} bytes holds {pos}")
    return entries


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _filler(size: int) -> tuple[int, bytes] | None:
    """(tag, entry): one unknown tagged field of exactly ``size`` bytes, or None when none is that small."""
    for tag in _FILLER_TAGS:
        head = _uvarint(tag)
        for k in range(max(0, size - len(head) - 5), size - len(head)):
            entry = head + _uvarint(k)
            if len(entry) + k == size:
                return tag, entry + bytes(k)
    return None


def _section(entries: list[tuple[int, bytes]]) -> bytes:
    entries = sorted(entries, key=lambda e: e[0])
    return _uvarint(len(entries)) + b"".join(e for _, e in entries)


def _padded(entries: list[tuple[int, bytes]], length: int) -> bytes | None:
    bare = _section(entries)
    if len(bare) == length:
        return bare
    # The filler adds one entry: the count may grow a byte when it passes 127.
    head = len(_uvarint(len(entries) + 1)) + sum(len(e) for _, e in entries)
    filler = _filler(length - head)
    return None if filler is None else _section([*entries, filler])


EndpointMapping: TypeAlias = Callable[[BrokerEndpoint], tuple[str, int] | None]
"""An endpoint's proxy address, or None to leave the endpoint out."""
TailRewrite: TypeAlias = tuple[bytes, list[BrokerEndpoint]] | None
"""A rewritten tail and the endpoints the broker sent; None: the tail holds no endpoint."""


def _kept_endpoints(msg: ApiMessage, mapping: EndpointMapping) -> list[Any]:
    """``msg``'s ``node_endpoints`` that ``mapping`` keeps, their addresses rewritten in place."""
    kept: list[Any] = []
    for ep in msg.node_endpoints:
        mapped = mapping(BrokerEndpoint(ep.node_id, ep.host, ep.port, ep.rack))
        if mapped is not None:
            ep.host, ep.port = mapped
            kept.append(ep)
    return kept


def rewrite_endpoints_tail(api_key: int, version: int, section: bytes, mapping: EndpointMapping) -> TailRewrite:
    """Rewrite the ``node_endpoints`` in a top-level tagged ``section`` without changing its length.

    Returns None when the section has no ``node_endpoints``; else the new section and the endpoints
    the broker sent. ``mapping`` gives an endpoint's proxy address, or None to leave it out. The
    length is fixed because the frame's size went out before this, its last part, was seen: a
    shorter section is padded with an unknown tagged field; when the rewritten endpoints do not
    fit, the last ones are left out (all of them if need be), and for a leader it was not told the
    address of the client does what KIP-951 prescribes: it refreshes its metadata (which the proxy
    rewrites in full).
    Raises ValueError for a section that does not parse.

    For ShareFetch and ShareAcknowledge ``section`` is the tail from ``node_endpoints`` (a regular
    field) to the end, and the same rules apply to it.
    """
    if api_key in SHARE_ADDRESS_APIS:
        return _rewrite_share_tail(api_key, version, section, mapping)
    entries = _tag_entries(section)
    if all(tag != NODE_ENDPOINTS_TAG for tag, _ in entries):
        return None
    prefix = _empty_prefix(api_key, version)
    msg = decode_body(_response_class(api_key), prefix + section, version)
    addressed = AddressedResponse(api_key, version, msg)
    endpoints = addressed.endpoints()
    kept = _kept_endpoints(msg, mapping)
    # As many endpoints as fit (a longer proxy host name may not leave room for all of them).
    for n in range(len(kept), 0, -1):
        msg.node_endpoints = kept[:n]
        rewritten = _padded(_tag_entries(bytes(msg.encode())[len(prefix) :]), len(section))
        if rewritten is not None:
            return rewritten, endpoints
    rewritten = _padded([(tag, e) for tag, e in entries if tag != NODE_ENDPOINTS_TAG], len(section))
    if rewritten is None:  # unreachable: node_endpoints takes at least 3 bytes, a filler 2
        raise ValueError(f"cannot fit node_endpoints into {len(section)} bytes")
    return rewritten, endpoints


def _rewrite_share_tail(api_key: int, version: int, section: bytes, mapping: EndpointMapping) -> TailRewrite:
    """``rewrite_endpoints_tail`` for a ShareFetch/ShareAcknowledge tail: ``node_endpoints`` (a compact
    array) followed by the top-level tagged section. The rewritten array is followed by the broker's
    own tagged fields (none is known at the top level, so they are kept byte for byte), padded with
    an unknown one to the tail's length; endpoints that do not fit are left out, last first."""
    cls = _response_class(api_key)
    prefix = _empty_prefix(api_key, version)
    body = prefix + section
    plan = layout(cls, version, body)
    if plan.end != len(body):
        raise TruncatedError(f"{len(body) - plan.end} bytes after the tagged fields of a {cls.name} tail")
    start, end = plan.fields[_NODE_ENDPOINTS]
    if end - start == 1 and body[start] == 1:  # an empty array: nothing to rewrite
        return None
    tags = _tag_entries(body[plan.tags_offset :])
    msg = decode_body(cls, body, version)
    endpoints = AddressedResponse(api_key, version, msg).endpoints()
    kept = _kept_endpoints(msg, mapping)
    for n in range(len(kept), -1, -1):  # down to none: 1 byte, and a filler takes 2, so this ends
        msg.node_endpoints = kept[:n]
        encoded = bytes(msg.encode())
        a, b = layout(cls, version, encoded).fields[_NODE_ENDPOINTS]
        array = encoded[a:b]
        rewritten = _padded(tags, len(section) - len(array))
        if rewritten is not None:
            return array + rewritten, endpoints
    raise ValueError(f"cannot fit node_endpoints into {len(section)} bytes")  # unreachable, see above
