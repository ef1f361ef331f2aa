"""Which brokers exist, where they really are, and which proxy port stands for each.

Learned from the responses that pass through (every Metadata, DescribeCluster, FindCoordinator and
KIP-951 endpoint list names brokers); a broker seen for the first time gets a listener before the
response naming it is released to the client, so a client never learns an address it cannot reach.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from protocol.addresses import BrokerEndpoint

log = logging.getLogger(__name__)

StartListener = Callable[[int, int], Awaitable[int]]
"""(node_id, wanted port or 0) -> bound port."""


class NoBrokerPort(Exception):
    """The configured broker port range has no room for another broker."""


class BrokerDirectory:
    def __init__(
        self,
        advertised_host: str,
        port_range: tuple[int, int] | None,
        start_listener: StartListener,
        *,
        fixed: bool = False,
    ) -> None:
        """``fixed``: broker N is served at exactly first + N (workers sharing ports must all agree on it, so
        there is no "next free port" fallback); a node id beyond the range is an error naming it."""
        self._advertised = advertised_host
        self._range = port_range
        self._fixed = fixed
        self._start_listener = start_listener
        self.upstream: dict[int, tuple[str, int]] = {}
        self.ports: dict[int, int] = {}
        self._unavailable: set[int] = set()  # ports of the range something else holds
        self._lock = asyncio.Lock()

    def upstream_of(self, node_id: int) -> tuple[str, int] | None:
        return self.upstream.get(node_id)

    def advertised(self, node_id: int) -> tuple[str, int]:
        return self._advertised, self.ports[node_id]

    def map_endpoint(self, ep: BrokerEndpoint) -> tuple[str, int]:
        try:
            return self.advertised(ep.node_id)
        except KeyError:
            raise LookupError(f"no proxy listener for broker {ep.node_id}") from None

    def observe(self, endpoints: Iterable[BrokerEndpoint]) -> list[BrokerEndpoint]:
        """Record where each broker is; return the ones that still need a listener."""
        missing = []
        for ep in endpoints:
            addr = (ep.host, ep.port)
            old = self.upstream.get(ep.node_id)
            if old != addr:
                if old is not None:
                    log.info("broker %d moved from %s:%d to %s:%d", ep.node_id, *old, *addr)
                self.upstream[ep.node_id] = addr
            if ep.node_id not in self.ports:
                missing.append(ep)
        return missing

    async def learn(self, endpoints: Iterable[BrokerEndpoint]) -> None:
        """Record where each broker is and make sure it has a listener."""
        for ep in self.observe(endpoints):
            addr = (ep.host, ep.port)
            if ep.node_id not in self.ports:
                async with self._lock:
                    if ep.node_id not in self.ports:
                        port = await self._listen(ep.node_id)
                        self.ports[ep.node_id] = port
                        log.info("broker %d (%s:%d) is served at %s:%d", ep.node_id, *addr, self._advertised, port)

    async def _listen(self, node_id: int) -> int:
        """Start broker ``node_id``'s listener on its port, or on the next free one of the range when something
        else holds that port (another process, an earlier proxy not yet gone): one WARNING line per port."""
        while True:
            port = self._choose_port(node_id)
            try:
                return await self._start_listener(node_id, port)
            except OSError as exc:
                if port == 0 or self._fixed:
                    raise
                log.warning(
                    "broker_ports: port %d is not available for broker %d (%s); trying the next one",
                    port,
                    node_id,
                    exc.strerror or exc,
                )
                self._unavailable.add(port)

    def _choose_port(self, node_id: int) -> int:
        if self._range is None:
            return 0
        first, last = self._range
        used = set(self.ports.values()) | self._unavailable
        preferred = first + node_id
        if node_id >= 0 and preferred <= last and preferred not in used:
            return preferred
        if self._fixed:
            raise NoBrokerPort(
                f"broker_ports {first}-{last}: with workers, broker {node_id} must be served at "
                f"{first} + {node_id} = {preferred}, outside the range; make the range reach it"
            )
        for port in range(first, last + 1):
            if port not in used:
                return port
        raise NoBrokerPort(f"broker_ports {first}-{last} has no free port for broker {node_id}")
