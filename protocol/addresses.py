"""Broker addresses inside responses: find them and rewrite them to the proxy's own listeners.

Any address left as the broker's own would let a client bypass the proxy, so every response that
can carry one is handled here: Metadata, FindCoordinator (one coordinator up to v3, a list from v4),
DescribeCluster, and the KIP-951 ``node_endpoints`` tagged field of Produce (v10+) and Fetch (v16+).
Produce and Fetch are only skimmed (see ``protocol.skim``); they are decoded and re-encoded only in
the rare case that the broker actually sent ``node_endpoints`` (after a leadership change).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kafka.protocol.api_message import ApiMessage

from protocol.apis import Api, decode_body, response_class
from protocol.skim import layout

_NODE_ENDPOINTS_TAG = 0
_NODE_ENDPOINTS_SINCE = {Api.PRODUCE: 10, Api.FETCH: 16}
ADDRESS_APIS = frozenset(
    {Api.METADATA, Api.FIND_COORDINATOR, Api.DESCRIBE_CLUSTER, Api.PRODUCE, Api.FETCH}
)


@dataclass(slots=True, frozen=True)
class BrokerEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


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

    def encode(self, mapping: Callable[[BrokerEndpoint], tuple[str, int]]) -> bytes:
        """The body with every broker address replaced by ``mapping(endpoint)``."""
        for node_id, host, port, rack, setter in _entries(self.api_key, self.message):
            new_host, new_port = mapping(BrokerEndpoint(node_id, host, port, rack))
            setter(new_host, new_port)
        return self.message.encode()


def may_carry_addresses(api_key: int, version: int) -> bool:
    """Whether a response to this request can hold a broker address (Produce and Fetch only from the
    KIP-951 versions on); the proxy streams big responses only when this is False."""
    if api_key not in ADDRESS_APIS:
        return False
    since = _NODE_ENDPOINTS_SINCE.get(api_key)
    return since is None or version >= since


def decode_addressed(api_key: int, version: int, body: bytes) -> AddressedResponse | None:
    """Decode ``body`` if it carries broker addresses, else None (nothing to rewrite).

    Raises ValueError (or struct.error) for a body that does not parse.
    """
    if api_key not in ADDRESS_APIS:
        return None
    cls = response_class(api_key)
    since = _NODE_ENDPOINTS_SINCE.get(api_key)
    if since is not None:
        if version < since:
            return None
        if _NODE_ENDPOINTS_TAG not in layout(cls, version, body).tags:
            return None
    return AddressedResponse(api_key, version, decode_body(cls, body, version))


def _entries(api_key: int, msg: ApiMessage):
    """(node_id, host, port, rack, setter) for every live address in the message."""

    def setter_for(obj):
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
    elif api_key in (Api.PRODUCE, Api.FETCH):
        for e in msg.node_endpoints or ():
            yield e.node_id, e.host, e.port, e.rack, setter_for(e)

