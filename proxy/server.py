"""The proxy: a bootstrap listener, one listener per broker, and the connections between them."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass

from config.model import ProxyConfig
from protocol.addresses import ADDRESS_APIS
from protocol.api_versions import decode_caps
from protocol.apis import Api
from proxy.brokers import BrokerDirectory
from proxy.connection import Connection
from proxy.responses import TopicIds

log = logging.getLogger(__name__)


@dataclass
class Stats:
    connections_total: int = 0
    requests: int = 0


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        listen = config.listen
        port_range = None if listen.broker_ports == "ephemeral" else listen.broker_ports
        self.directory = BrokerDirectory(listen.advertised(), port_range, self._start_broker_listener)
        self.topic_ids = TopicIds()
        self.version_caps = decode_caps(ADDRESS_APIS | {Api.API_VERSIONS})
        self.stats = Stats()
        self.connections: set[Connection] = set()
        self._servers: dict[int | None, asyncio.AbstractServer] = {}
        self._tasks: set[asyncio.Task] = set()
        self._bootstrap_rr = itertools.count()
        self._closing = False

    @property
    def bootstrap_port(self) -> int:
        return self._servers[None].sockets[0].getsockname()[1]

    @property
    def bootstrap_address(self) -> str:
        return f"{self.config.listen.advertised()}:{self.bootstrap_port}"

    async def start(self) -> None:
        listen = self.config.listen
        self._servers[None] = await asyncio.start_server(
            self._on_bootstrap_client, listen.host, listen.bootstrap_port, reuse_address=True
        )
        log.info(
            "bootstrap listener on %s:%d for %s; point clients at %s",
            listen.host, self.bootstrap_port, ",".join(self.config.upstream.bootstrap_servers),
            self.bootstrap_address,
        )

    async def _start_broker_listener(self, node_id: int, port: int) -> int:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(reader, writer, node_id)

        server = await asyncio.start_server(on_client, self.config.listen.host, port, reuse_address=True)
        self._servers[node_id] = server
        return server.sockets[0].getsockname()[1]

    async def _on_bootstrap_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node_id: int | None):
        if self._closing:
            writer.close()
            return
        if node_id is None:
            addrs = self.config.upstream.addresses()
            start = next(self._bootstrap_rr) % len(addrs)
            candidates = addrs[start:] + addrs[:start]
            label = "bootstrap"
        else:
            target = self.directory.upstream_of(node_id)
            candidates = [target] if target else []
            label = f"broker {node_id}"
        conn = Connection(self, reader, writer, candidates, label)
        self.connections.add(conn)
        self.stats.connections_total += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        except Exception:  # noqa: BLE001 - one connection's failure never reaches the listener
            log.exception("%s via %s: unexpected error; connection closed", conn.peer, label)
        finally:
            self.connections.discard(conn)
            if task is not None:
                self._tasks.discard(task)

    async def shutdown(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the grace period), close everything."""
        if self._closing:
            return
        self._closing = True
        log.info("shutting down: %d connections to drain", len(self.connections))
        for server in self._servers.values():
            server.close()
        for conn in list(self.connections):
            conn.drain()
        pending = list(self._tasks)
        if pending:
            grace = self.config.shutdown_grace_ms / 1000 + 1
            _, still = await asyncio.wait(pending, timeout=grace)
            for task in still:
                task.cancel()
            for task in still:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await server.wait_closed()
        log.info("shut down")
