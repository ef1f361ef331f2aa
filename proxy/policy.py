"""The one place where a request meets protocol, quotas and muting.

Every request frame passes through :meth:`Policy.on_request` and every response owed to a client through
:meth:`Policy.on_response` (only for requests that got a decision). Everything here is decided on the event
loop, synchronously, except when the cluster must be asked first (current partition counts for KIP-599): then
the connection defers this request, and the ones behind it, until the answer is in.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from config.model import ProxyConfig
from config.quota_sources import QuotaSources
from protocol.apis import Api, response_header_is_flexible
from protocol.headers import RequestHeader, encode_response_header
from proxy import client_quota_api
from proxy.connection import Answer
from quotas.entities import QuotaStore

if TYPE_CHECKING:
    from proxy.connection import Connection

log = logging.getLogger(__name__)


def local_frame(header: RequestHeader, body: bytes) -> bytes:
    """A whole response frame (size prefix, response header, ``body``) answering ``header``."""
    head = encode_response_header(header.correlation_id,
                                  bool(response_header_is_flexible(header.api_key, header.api_version)))
    size = len(head) + len(body)
    return size.to_bytes(4, "big") + head + body


class Policy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        qc = config.quotas
        self.store = QuotaStore()
        self.sources = QuotaSources(self.store, qc.state_file)
        self.sources.set_file({e.quota_entity(): dict(e.quotas) for e in qc.entities})
        self.admins = frozenset(qc.admins)
        self.enforce = qc.enforce

    def reload(self, config: ProxyConfig) -> None:
        """A new, already validated configuration: take its quotas and enforcement settings."""
        qc = config.quotas
        self.sources.set_file({e.quota_entity(): dict(e.quotas) for e in qc.entities})
        self.admins = frozenset(qc.admins)
        self.enforce = qc.enforce
        self.config = config

    # ------------------------------------------------------------------------------------------ requests

    def on_request(self, conn: Connection, header: RequestHeader, body: memoryview, now: float):
        key = header.api_key
        if key == Api.DESCRIBE_CLIENT_QUOTAS:
            reply = client_quota_api.describe(self.sources, body[header.body_offset:], header.api_version)
            return Answer(None, local_frame(header, reply))
        if key == Api.ALTER_CLIENT_QUOTAS:
            principal = conn.identity.principal
            reply = client_quota_api.alter(self.sources, body[header.body_offset:], header.api_version,
                                           principal, self.admins)
            log.info("%s: AlterClientQuotas by %s", conn.peer, principal)
            return Answer(None, local_frame(header, reply))
        return None

    # ------------------------------------------------------------------------------------------ responses

    def on_response(self, conn: Connection, pending, frame):
        return None
