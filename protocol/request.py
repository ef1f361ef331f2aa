"""A request as the session read it: its header, and the few fields any rule reads of it, each read once.

Why one object: the policy's rules (the quotas' charges, the producer-id charge, the protected-topic guard, fair
share) each need a little of a request, and reading it again in each rule read a Produce's acks twice and walked
a large Produce's record fields twice (issue 49). The session reads the header and a Produce's acks as the frame
arrives (every request needs them: whether an answer comes); what only some rules need (the record fields' spans)
is read on first use and kept. A rule takes the :class:`Request`, never the frame alone, so nothing is read twice;
``tests/unit/test_parse_count.py`` counts it.
"""

from __future__ import annotations

from typing import Any

from protocol.apis import Api
from protocol.errors import MalformedRequest
from protocol.headers import RequestHeader
from protocol.inflight import produce_acks
from protocol.record_batches import record_spans


class Request:
    """A request frame, read: what the policy decides on. (A plain class: see ``protocol.inflight.Pending``.)"""

    __slots__ = ("header", "frame", "answered", "acks", "_spans")

    def __init__(self, header: RequestHeader, frame: Any, answered: bool, acks: int = 1) -> None:
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

    def copied(self) -> Request:
        """This request with its own copy of the frame, to keep past the read (a decision that waits: the
        client's chunk may be reused before it ends); read again, never (the spans are offsets: they stand)."""
        frame = self.frame
        if type(frame) is bytes:
            return self
        kept = Request(self.header, bytes(frame), self.answered, self.acks)
        kept._spans = self._spans
        return kept


def read_request(header: RequestHeader, frame: Any) -> Request:
    """A request frame whose header is read: its acks (a Produce's) and whether an answer comes. Raises the
    protocol's errors for a Produce too short to hold acks."""
    if header.api_key == Api.PRODUCE:
        acks = produce_acks(frame, header, 4)
        return Request(header, frame, acks != 0, acks)
    return Request(header, frame, True)
