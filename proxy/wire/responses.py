"""What happens to a response on its way back: broker addresses and ApiVersions rewritten.

Anything else passes on as the very bytes the broker sent. Rewriting is synchronous except when a
response names a broker the proxy has no listener for yet: then the caller must first await
``BrokerDirectory.learn`` and only then render the edit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.addresses import (
    AddressedResponse,
    BrokerEndpoint,
    decode_addressed,
    rewrite_endpoints_tail,
    tail_watch_class,
)
from protocol.api_versions import cap_api_versions
from protocol.apis import Api
from protocol.endpoint_apis import ResponseShape, may_carry_addresses, tagged_endpoints_since, tags_endpoints
from protocol.headers import response_body_offset
from protocol.inflight import Pending
from protocol.tail_watch import TailWatch
from protocol.topic_guard import LISTING_APIS, ProtectedTopics, drop_listed, filter_listing
from proxy.wire.brokers import BrokerDirectory

MAX_REPLICATION_TOPICS = 100_000
"""Topics whose replication factor is kept at most (past it the table starts afresh: a cluster this large is learnt
again from the Metadata its clients ask for)."""


class TopicIds:
    """Topic id ↔ name, and each topic's replication factor, learned from Metadata; Produce v13 and Fetch v13+ name
    topics by id only."""

    __slots__ = ("by_id", "replication", "stamp")

    def __init__(self) -> None:
        self.by_id: dict[uuid.UUID, str] = {}
        self.stamp = 0
        """Moves when a replication factor (or a topic id) is learnt or changes: a kept lookup may be stale."""
        self.replication: dict[str, int] = {}
        """Topic name -> its partitions' largest replica count: whether a Produce to it makes its broker complete
        followers' fetches (the request quota's replicated-Produce term, ``quotas.kinds.RequestCosts``)."""

    def update(self, pairs: Mapping[uuid.UUID, str]) -> None:
        by_id = self.by_id
        for k, v in pairs.items():
            if by_id.get(k) != v:
                by_id[k] = v
                self.stamp += 1

    def learn_replication(self, factors: Mapping[str, int]) -> None:
        replication = self.replication
        if len(replication) + len(factors) > MAX_REPLICATION_TOPICS:
            replication.clear()
            self.stamp += 1
        for name, rf in factors.items():
            if replication.get(name) != rf:
                replication[name] = rf
                self.stamp += 1

    def replication_of(self, topics: Sequence[str | uuid.UUID]) -> int:
        """The largest replication factor among ``topics`` (names, or ids as Produce v13 sends them); -1 when one
        of them is not known (nobody asked this proxy for its metadata yet)."""
        top = -1
        for t in topics:
            name = self.by_id.get(t) if isinstance(t, uuid.UUID) else t
            rf = self.replication.get(name, -1) if name is not None else -1
            if rf < 0:
                return -1
            top = max(top, rf)
        return top

    def name(self, topic_id: uuid.UUID) -> str | None:
        return self.by_id.get(topic_id)


@dataclass(slots=True)
class AddressEdit:
    """A response whose broker addresses must be rewritten once every broker has a listener."""

    header: bytes
    decoded: AddressedResponse
    endpoints: list[BrokerEndpoint]

    def render(self, directory: BrokerDirectory) -> bytes:
        return self.header + self.decoded.encode(directory.map_endpoint)


class StreamedTail:
    """A response streaming through whose closing tagged section may hold ``node_endpoints``.

    Pieces are forwarded as they come, up to the tagged section, which ``TailWatch`` finds on the
    way; that section (one byte when empty) is held until the frame is complete and then released,
    rewritten to the proxy's addresses at the same length if it names brokers. In ShareFetch and
    ShareAcknowledge responses ``node_endpoints`` is a regular field just before the tagged section,
    so the held tail starts there instead (two bytes when empty; see ``tail_watch_class``). An endpoint of a
    broker that has no listener yet is left out (``missing`` lists it, so the caller can start one):
    the stream cannot wait, and the client refreshes its metadata for a leader it was not told of.
    """

    __slots__ = ("_key", "_version", "_skip", "_watch", "_held", "_directory", "missing")

    def __init__(self, api_key: int, version: int, body_start: int, directory: BrokerDirectory) -> None:
        self._key = api_key
        self._version = version
        self._skip = body_start  # frame bytes before the body: size prefix and response header
        self._watch = TailWatch(tail_watch_class(api_key), version)
        self._held: list[bytes] | None = None
        self._directory = directory
        self.missing: list[BrokerEndpoint] = []

    def pass_on(self, pieces: Any, last: bool, out: list[Any]) -> None:
        """Append to ``out`` what of ``pieces`` (consecutive bytes of the frame) may go on now; with
        ``last``, the frame is complete and the held section goes too. Raises ValueError for a frame
        that ends before its tagged section or whose section does not parse."""
        for piece in pieces:
            if self._held is not None:
                self._held.append(bytes(piece))
                continue
            start = 0
            if self._skip:
                start = min(self._skip, len(piece))
                self._skip -= start
            at = self._watch.feed(piece[start:]) if start < len(piece) else None
            if at is None:
                out.append(piece)
                continue
            cut = start + at
            if cut:
                out.append(piece[:cut])
            self._held = [bytes(piece[cut:])]
        if not last:
            return
        if self._held is None:
            raise ValueError(f"response ended {self._watch.consumed} bytes into its body, before its tagged fields")
        section = b"".join(self._held)
        result = rewrite_endpoints_tail(self._key, self._version, section, self._map)
        out.append(section if result is None else result[0])

    def _map(self, ep: BrokerEndpoint) -> tuple[str, int] | None:
        if self._directory.observe([ep]):
            self.missing.append(ep)
            return None
        return self._directory.advertised(ep.node_id)


def inspect_response(
    pending: Pending,
    frame: memoryview | bytes,
    directory: BrokerDirectory,
    topics: TopicIds,
    version_caps: Mapping[int, int],
    shape: ResponseShape | None = None,
    guard: ProtectedTopics | None = None,
) -> bytes | AddressEdit | None:
    """For a response ``frame`` (without size prefix): None when it passes unchanged, the new frame
    when it could be rewritten at once, or an AddressEdit that needs listeners started first.
    ``shape``: the connection's memo of its last untagged Produce/Fetch response (``endpoint_apis``); ``guard``:
    the proxy's own topics, left out of topic listings."""
    header = pending.header
    key: int = header.api_key
    version: int = header.api_version
    if not may_carry_addresses(key, version):
        if key == Api.API_VERSIONS:
            offset = response_body_offset(frame, key, version)
            body = cap_api_versions(frame[offset:], version, version_caps)
            return None if body is None else bytes(frame[:offset]) + body
        if guard is not None and key in LISTING_APIS:
            offset = response_body_offset(frame, key, version)
            body = filter_listing(guard, key, version, frame[offset:])
            return None if body is None else bytes(frame[:offset]) + body
        return None
    offset = response_body_offset(frame, key, version)
    since = tagged_endpoints_since(key)
    if since is not None:
        # Narrowed, so that compiled, the small response's slice is a native bytes slice, not the union's generic one.
        rest = frame[offset:] if isinstance(frame, bytes) else frame[offset:]
        if not tags_endpoints(key, version, rest, shape):
            return None  # Produce, Fetch: no node_endpoints, the usual answer (compiled, no decode)
    decoded = decode_addressed(key, version, frame[offset:])
    if decoded is None:
        return None
    endpoints = decoded.endpoints()
    topics.update(decoded.topic_ids())
    topics.learn_replication(decoded.replication())
    if guard is not None and key == Api.METADATA:
        drop_listed(guard, decoded.message)  # re-encoded below in any case (its addresses)
    edit = AddressEdit(bytes(frame[:offset]), decoded, endpoints)
    if directory.observe(endpoints):
        return edit
    return edit.render(directory)
