"""Message classes for the KIP-932 share-group APIs, compiled from this project's own JSON specs.

Why: kafka-python 3.x has no schemas for ShareGroupHeartbeat (76), ShareGroupDescribe (77), ShareFetch (78)
and ShareAcknowledge (79), yet ShareFetch and ShareAcknowledge responses carry broker addresses
(``node_endpoints``) that the proxy must rewrite, and ShareFetch responses carry records the proxy must skim and
stream like Fetch's. The specs in ``protocol/share_schemas/`` are in apache/kafka's message-spec format, so
kafka-python's own metaclass loads them (its ``load_json`` class keyword names the package to read from) and
the classes are indistinguishable from its built-in ones: ``protocol.apis`` collects them with the rest, and
``protocol.skim`` / ``protocol.tail_watch`` / ``protocol.throttle_field`` compile their layouts the same way.

Versions: Apache Kafka 4.1 made version 1 of each the first one brokers speak (version 0 was early access);
4.4 brokers speak ShareFetch and ShareAcknowledge v1–v2 and the group APIs v1. kafka-python widens every
message's range down to 0, which is harmless: brokers never accept v0.
"""

from __future__ import annotations

import types
from typing import Any

from kafka.protocol.api_message import ApiMessage

SCHEMA_PACKAGE = "protocol.share_schemas"


def _message(name: str) -> Any:
    """The class ``class <name>(ApiMessage, load_json=SCHEMA_PACKAGE): pass`` would make: kafka-python's metaclass
    reads ``share_schemas/<name>.json``. (``Any``: kafka-python has no type hints.)"""

    def namespace(ns: dict[str, Any]) -> None:
        ns["__module__"] = __name__
        ns["__qualname__"] = name

    return types.new_class(name, (ApiMessage,), {"load_json": SCHEMA_PACKAGE}, namespace)


ShareGroupHeartbeatRequest = _message("ShareGroupHeartbeatRequest")
ShareGroupHeartbeatResponse = _message("ShareGroupHeartbeatResponse")
ShareGroupDescribeRequest = _message("ShareGroupDescribeRequest")
ShareGroupDescribeResponse = _message("ShareGroupDescribeResponse")
ShareFetchRequest = _message("ShareFetchRequest")
ShareFetchResponse = _message("ShareFetchResponse")
ShareAcknowledgeRequest = _message("ShareAcknowledgeRequest")
ShareAcknowledgeResponse = _message("ShareAcknowledgeResponse")

SHARE_MESSAGES: tuple[type[ApiMessage], ...] = (
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
    ShareGroupDescribeRequest,
    ShareGroupDescribeResponse,
    ShareFetchRequest,
    ShareFetchResponse,
    ShareAcknowledgeRequest,
    ShareAcknowledgeResponse,
)
