"""Ask the cluster for its brokers at startup, so every broker's listener exists before any client
arrives: a client that cached broker addresses from before a proxy restart can reconnect at once
instead of being refused until some Metadata response happens to pass through.

Best effort: against a SASL listener the proxy has no credentials, the broker refuses, and listeners
are created as Metadata responses pass through instead.
"""

from __future__ import annotations

import asyncio
import logging
from ssl import SSLContext
from typing import Any

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from protocol.addresses import BrokerEndpoint
from protocol.frames import frame_size

log = logging.getLogger(__name__)
_VERSION = 4  # the oldest Metadata Kafka 4.x still answers; not flexible, so trivially framed


async def discover_brokers(
    addresses: list[tuple[str, int]], timeout: float, max_frame_bytes: int, ssl: SSLContext | None = None
) -> list[BrokerEndpoint] | None:
    for host, port in addresses:
        try:
            return await asyncio.wait_for(_ask(host, port, max_frame_bytes, ssl), timeout)
        except Exception as exc:  # noqa: BLE001 - any failure just means "learn lazily"
            log.info("startup discovery via %s:%d failed (%s: %s)", host, port, type(exc).__name__, exc)
    return None


async def ask_once(
    host: str,
    port: int,
    request: Any,
    response_cls: Any,
    version: int,
    max_frame_bytes: int,
    ssl: SSLContext | None = None,
) -> Any:
    """One request on a connection of the proxy's own, its decoded response, and the connection closed.

    For the few things the proxy asks the cluster outside any client's connection (startup discovery,
    quota import); frames are bounded by ``max_frame_bytes`` like every other frame."""
    reader, writer = await asyncio.open_connection(host, port, ssl=ssl)
    try:
        request.API_VERSION = version
        request.with_header(correlation_id=1, client_id="kafka-throttle-proxy")
        writer.write(request.encode(header=True, framed=True))
        await writer.drain()
        size = frame_size(await reader.readexactly(4), max_frame_bytes)
        return response_cls.decode(await reader.readexactly(size), version=version, header=True)
    finally:
        writer.close()


async def _ask(host: str, port: int, max_frame_bytes: int, ssl: SSLContext | None = None) -> list[BrokerEndpoint]:
    request = MetadataRequest(topics=[], allow_auto_topic_creation=False)
    resp = await ask_once(host, port, request, MetadataResponse, _VERSION, max_frame_bytes, ssl)
    return [BrokerEndpoint(b.node_id, b.host, b.port, b.rack) for b in resp.brokers]
