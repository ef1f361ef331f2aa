"""A request as the session read it: its header, and the few fields any rule reads of it, each read once.

Why one object: the policy's rules (the quotas' charges, the producer-id charge, the protected-topic guard, fair
share) each need a little of a request, and reading it again in each rule read a Produce's acks twice and walked
a large Produce's record fields twice (issue 49). The session reads the header and a Produce's acks as the frame
arrives (every request needs them: whether an answer comes); what only some rules need (the record fields' spans)
is read on first use and kept. A rule takes the :class:`Request`, never the frame alone, so nothing is read twice;
``tests/unit/test_parse_count.py`` counts it.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, Final

from protocol.apis import Api
from protocol.errors import MalformedRequest
from protocol.headers import RequestHeader
from protocol.inflight import produce_acks_and_timeout
from protocol.record_batches import (
    RecordBatchError,
    Shape,
    produce_topics_head,
    producer_ids_and_shape,
    record_spans,
    single_producer_id,
)
from protocol.request_fields import fetch_max_bytes_at, is_replica_fetch, mutation_topics

_I32: Final = struct.Struct(">i")


class Request:
    """A request frame, read: what the policy decides on. (A plain class: see ``protocol.inflight.Pending``.)"""

    __slots__ = ("header", "frame", "answered", "acks", "timeout_ms", "alone", "_spans")

    def __init__(self, header: RequestHeader, frame: Any, answered: bool, acks: int = 1, timeout_ms: int = 0) -> None:
        self.header = header
        self.frame = frame
        """The whole frame, size prefix included (``bytes``, or a view of a large one: copy that to keep it); its
        body is at ``4 + header.body_offset``."""
        self.answered = answered
        """False for Produce acks=0: no response will come."""
        self.acks = acks
        """A Produce's ``acks``, read once here (1 for every other API): its answer's baseline class
        (``quotas.fair_share.sample_class``) tells acks=all from acks=1, the request quota charges an acks=0
        Produce nothing."""
        self.timeout_ms = timeout_ms
        """A Produce's ``timeout_ms`` (``protocol.inflight.requested_wait_ms``: never negative), read with its acks
        (0 for every other API): the session's hung-broker allowance for it."""
        self.alone = True
        """Nothing else of its connection awaited an answer when it came (the session sets it from what is in
        flight): a consumer's Fetch, a request/response loop. The brokers charge such a request about twice one of
        a pipelining client, and ``request_percentage`` charges it its alone base (``quotas.kinds.RequestCosts``)."""
        self._spans: list[tuple[int, int]] | None = None

    def record_spans(self) -> list[tuple[int, int]]:
        """A Produce's record fields, ``(start, end)`` in the frame after its size prefix: walked on first use (the
        producer-id charge, the guard's search outside the records of a large one), then kept. Raises
        ``RecordBatchError`` (a ProtocolError naming where) for a skeleton that does not parse."""
        spans = self._spans
        if spans is None:
            header = self.header
            if header.api_key != Api.PRODUCE or header.body_offset is None:
                raise MalformedRequest(f"api {header.api_key} has no record fields to locate")
            spans = self._spans = record_spans(memoryview(self.frame)[4:], header.api_version, header.body_offset)
        return spans

    def topics_head(self) -> tuple[list[str | uuid.UUID], int]:
        """A Produce's topics, and where a single topic's key ends in the frame (-1 for more topics): the request
        quota's replicated-Produce term reads them (``protocol.record_batches.produce_topics_head``; a request to
        one topic is read up to its key, not walked). Raises ``RecordBatchError`` for a head that does not parse."""
        header = self.header
        if header.api_key != Api.PRODUCE or header.body_offset is None:
            raise MalformedRequest(f"api {header.api_key} writes to no topics")
        return produce_topics_head(self.frame, header.api_version, 4 + header.body_offset)

    def shaped_producer_id(self, shape: Shape) -> int | None:
        """A Produce's one producer id, when the request is shaped like ``shape`` (the connection's last: read where
        it sits, no walk; ``protocol.record_batches.single_producer_id``); None when it is not, or is a view."""
        frame = self.frame
        header = self.header
        if type(frame) is not bytes or header.body_offset is None:
            return None
        return single_producer_id(frame, 4, header.api_version, header.body_offset, shape)

    def producer_ids(self) -> tuple[set[int], Shape | None]:
        """A Produce's distinct producer ids, from its batches' headers (the records are not read), and its
        :class:`~protocol.record_batches.Shape` for the next request of the connection; walks the record fields
        once, with every other rule that needs them. Raises ``MalformedRequest`` naming the batch that does not
        parse."""
        header = self.header
        try:
            spans = self.record_spans()
            return producer_ids_and_shape(
                memoryview(self.frame)[4:], header.api_version, header.body_offset or 0, spans
            )
        except RecordBatchError as exc:
            raise MalformedRequest(f"malformed Produce v{header.api_version} record batch: {exc}") from None

    def is_replica_fetch(self) -> bool:
        """A Fetch from a broker (its ``replica_id`` set: v0-14), exempt where the quota exempts replicas."""
        return is_replica_fetch(self.frame, self.header)

    def mutation_topics(self) -> int:
        """How many topics a CreateTopics, DeleteTopics or CreatePartitions request names (0 for another API)."""
        return mutation_topics(self.frame, self.header)

    def capped_fetch(self, room: float) -> bytes | None:
        """This Fetch (v3+), asking for at most ``room`` bytes (``max_bytes``; at least 1: a bucket in debt still
        lets one batch through, which a broker sends whole): the frame to send, or None when it asks for no more
        already (or has no ``max_bytes``, or is a view of a large frame). The pacers say how much room their
        buckets have; the field is read and written here, once."""
        header = self.header
        frame = self.frame
        at = fetch_max_bytes_at(header.api_version)
        if header.api_key != Api.FETCH or at < 0 or header.body_offset is None or type(frame) is not bytes:
            return None
        at += 4 + header.body_offset
        if len(frame) < at + 4:
            return None
        asked = _I32.unpack_from(frame, at)[0]
        cap = int(room) if room >= 1 else 1
        if asked <= cap:
            return None
        return frame[:at] + _I32.pack(cap) + frame[at + 4 :]

    def copied(self) -> Request:
        """This request with its own copy of the frame, to keep past the read (a decision that waits: the
        client's chunk may be reused before it ends); read again, never (the spans are offsets: they stand)."""
        frame = self.frame
        if type(frame) is bytes:
            return self
        kept = Request(self.header, bytes(frame), self.answered, self.acks, self.timeout_ms)
        kept._spans = self._spans
        return kept


def read_request(header: RequestHeader, frame: Any) -> Request:
    """A request frame whose header is read: its acks (a Produce's) and whether an answer comes. Raises the
    protocol's errors for a Produce too short to hold acks."""
    if header.api_key == Api.PRODUCE:
        acks, timeout_ms = produce_acks_and_timeout(frame, header, 4)
        return Request(header, frame, acks != 0, acks, timeout_ms)
    return Request(header, frame, True)
