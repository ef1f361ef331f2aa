"""Where the few request fields a quota reads sit on the wire: one table per API.

Why a module of its own: the policy reads Fetch's replica id and ``max_bytes`` and Produce's ``acks`` without
decoding the request; the positions are facts of Kafka's message specs (``FetchRequest.json``,
``ProduceRequest.json``), so they live in ``protocol/`` once, beside the rest of the wire, not as numbers in the
policy. Offsets are from the start of the request body.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.headers import RequestHeader

_I32: Final = struct.Struct(">i")


class FetchFields:
    """FetchRequest: ``replica_id`` (int32, v0–14; v15 moved it to a tagged field), ``max_wait_ms`` (int32),
    ``min_bytes`` (int32), ``max_bytes`` (int32, v3+)."""

    REPLICA_ID_AT: Final = 0
    REPLICA_ID_UNTIL: Final = 15
    """The first version without ``replica_id`` at :attr:`REPLICA_ID_AT`."""
    MAX_BYTES_SINCE: Final = 3
    MAX_BYTES_AT: Final = 3 * _I32.size
    """Behind replica_id, max_wait_ms and min_bytes (v3–14)."""
    MAX_BYTES_AT_NO_REPLICA: Final = 2 * _I32.size
    """Behind max_wait_ms and min_bytes (v15+)."""


class ProduceFields:
    """ProduceRequest: ``transactional_id`` (nullable string, v3+; compact from v9), then ``acks`` (int16)."""

    TRANSACTIONAL_ID_SINCE: Final = 3
    COMPACT_SINCE: Final = 9


def fetch_max_bytes_at(version: int) -> int:
    """Where a Fetch body's ``max_bytes`` sits, from the start of the body; -1 before v3 (it has none)."""
    if version < FetchFields.MAX_BYTES_SINCE:
        return -1
    return FetchFields.MAX_BYTES_AT if version < FetchFields.REPLICA_ID_UNTIL else FetchFields.MAX_BYTES_AT_NO_REPLICA


def is_replica_fetch(frame: bytes | bytearray | memoryview, header: RequestHeader) -> bool:
    """Brokers fetch with their id in ``replica_id`` (v0–14); consumers send -1 (v15+ moved it to a tag).
    ``frame``: the whole request frame, size prefix included."""
    if (
        header.api_version >= FetchFields.REPLICA_ID_UNTIL
        or header.body_offset is None
        or len(frame) < 4 + header.body_offset + FetchFields.REPLICA_ID_AT + 4
    ):
        return False
    return int(_I32.unpack_from(frame, 4 + header.body_offset + FetchFields.REPLICA_ID_AT)[0]) >= 0


MUTATION_FLEXIBLE_SINCE: Final = {19: 5, 20: 4, 37: 2}
"""CreateTopics, DeleteTopics, CreatePartitions: the first version whose body is flexible (compact arrays). Each
body starts with its topics (``topics``, or DeleteTopics' ``topic_names`` before v6): one array, counted below."""


def mutation_topics(frame: bytes | bytearray | memoryview, header: RequestHeader) -> int:
    """How many topics a CreateTopics, DeleteTopics or CreatePartitions request names (the length of the array its
    body starts with), for fair share's charge; 0 for another API or a body too short to say. Clamped to the
    frame's size: the count is the client's, and a topic takes at least a byte."""
    since = MUTATION_FLEXIBLE_SINCE.get(header.api_key, -1)
    if since < 0 or header.body_offset is None:
        return 0
    pos = 4 + header.body_offset
    n = 0
    if header.api_version >= since:  # compact array: unsigned varint of count + 1
        shift = 0
        while pos < len(frame) and shift < 35:
            byte = frame[pos]
            n |= (byte & 0x7F) << shift
            pos += 1
            if not byte & 0x80:
                break
            shift += 7
        n -= 1
    elif len(frame) >= pos + 4:
        n = int(_I32.unpack_from(frame, pos)[0])
    if n <= 0:
        return 0
    return n if n < len(frame) else len(frame)
