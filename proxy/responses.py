"""What happens to a response on its way back: broker addresses and ApiVersions rewritten.

Anything else passes on as the very bytes the broker sent. Rewriting is synchronous except when a
response names a broker the proxy has no listener for yet: then the caller must first await
``BrokerDirectory.learn`` and only then render the edit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.addresses import ADDRESS_APIS, AddressedResponse, BrokerEndpoint, decode_addressed, may_carry_addresses
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


@dataclass(slots=True)
class AddressEdit:
    """A response whose broker addresses must be rewritten once every broker has a listener."""

    header: bytes
    decoded: AddressedResponse
    endpoints: list[BrokerEndpoint]

    def render(self, directory: BrokerDirectory) -> bytes:
        return self.header + self.decoded.encode(directory.map_endpoint)


def needs_whole_body(api_key: int, api_version: int) -> bool:
    """Whether ``inspect_response`` may rewrite the response to this request, so it must be assembled
    before any of it is forwarded. Everything else (the bulk: Fetch before v16, Produce before v10)
    can be streamed through; its leading bytes are still seen first (``protocol.frames.HEAD_BYTES``)."""
    if api_key == Api.API_VERSIONS or (api_key == Api.SASL_HANDSHAKE and api_version == 0):
        return True
    return may_carry_addresses(api_key, api_version)


def inspect_response(
    pending: Pending,
    frame: memoryview | bytes,
    directory: BrokerDirectory,
    topics: TopicIds,
    version_caps: Mapping[int, int],
) -> bytes | AddressEdit | None:
    """For a response ``frame`` (without size prefix): None when it passes unchanged, the new frame
    when it could be rewritten at once, or an AddressEdit that needs listeners started first."""
    key = pending.header.api_key
    version = pending.header.api_version
    if key in ADDRESS_APIS:
        offset = response_body_offset(frame, key, version)
        decoded = decode_addressed(key, version, frame[offset:])
        if decoded is None:
            return None
        endpoints = decoded.endpoints()
        topics.update(decoded.topic_ids())
        edit = AddressEdit(bytes(frame[:offset]), decoded, endpoints)
        if directory.observe(endpoints):
            return edit
        return edit.render(directory)
    if key == Api.API_VERSIONS:
        offset = response_body_offset(frame, key, version)
        body = cap_api_versions(frame[offset:], version, version_caps)
        return None if body is None else bytes(frame[:offset]) + body
    return None
