"""What happens to a response on its way back: broker addresses and ApiVersions rewritten.

Anything else passes as the very bytes the broker sent.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from protocol.addresses import ADDRESS_APIS, decode_addressed
from protocol.api_versions import cap_api_versions
from protocol.apis import Api
from protocol.headers import response_body_offset
from protocol.inflight import Pending
from proxy.brokers import BrokerDirectory


class TopicIds:
    """Topic id ↔ name, learned from Metadata; Produce v13 and Fetch v13+ name topics by id only."""

    __slots__ = ("by_id",)

    def __init__(self) -> None:
        self.by_id: dict[uuid.UUID, str] = {}

    def update(self, pairs: Mapping[uuid.UUID, str]) -> None:
        self.by_id.update(pairs)

    def name(self, topic_id: uuid.UUID) -> str | None:
        return self.by_id.get(topic_id)


async def rewrite_response(
    pending: Pending,
    frame: bytes,
    directory: BrokerDirectory,
    topics: TopicIds,
    version_caps: Mapping[int, int],
) -> bytes:
    """The frame to send to the client for ``pending``'s response (``frame`` itself if unchanged)."""
    key = pending.header.api_key
    version = pending.header.api_version
    if key in ADDRESS_APIS:
        offset = response_body_offset(frame, key, version)
        decoded = decode_addressed(key, version, frame[offset:])
        if decoded is None:
            return frame
        endpoints = decoded.endpoints()
        await directory.learn(endpoints)
        topics.update(decoded.topic_ids())
        return frame[:offset] + decoded.encode(directory.map_endpoint)
    if key == Api.API_VERSIONS:
        offset = response_body_offset(frame, key, version)
        body = cap_api_versions(frame[offset:], version, version_caps)
        return frame if body is None else frame[:offset] + body
    return frame
