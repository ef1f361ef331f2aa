"""Kafka's connection limits (``ConnectionQuotas``) and the KIP-612 connection creation rate, as pure policy.

Why here: a client that opens connections without end exhausts the proxy's file descriptors and, through it, the
brokers' (every client connection the proxy serves becomes a broker connection): the broker's own limits must
hold at the proxy, for everybody behind it. Time comes in as milliseconds; nothing here touches a socket.

What is matched (Kafka ``SocketServer.ConnectionQuotas``, KIP-612):
- ``max_connections`` (``max.connections``) and ``max_connections_per_ip`` with its overrides
  (``max.connections.per.ip`` / ``max.connections.per.ip.overrides``): a connection over a limit is refused.
  Kafka's acceptor waits for a free slot for ``max.connections``; the proxy refuses at once instead (a waiting
  accept would leave clients in the kernel's backlog with no answer and no log line).
- ``max_connection_creation_rate`` (``max.connection.creation.rate``): proxy-wide; a connection that would exceed
  it is refused. Kafka delays its acceptor; same reason as above.
- ``connection_creation_rate`` on entity type ``ips`` (a named ip, else the ``<default>`` ip): recorded per IP;
  a connection that exceeds it is not served and is closed after the throttle time, as Kafka's acceptor does
  (``ConnectionThrottledException``: the socket is closed once the throttle has passed), so a client that
  reconnects at once is slowed down rather than spinning.
Counts and rates are kept only for IPs with a live connection or an ip quota, and per-IP rate state is capped.
"""

from __future__ import annotations

import heapq
import ipaddress
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from quotas.rate import SampledRate, byte_rate_throttle_ms

DEFAULT_IP = "<default>"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new connection is not served; ``close_after_ms`` > 0: hold it (unread) that long, then close."""

    reason: str
    """One of ``max_connections``, ``max_connections_per_ip``, ``connection_creation_rate`` (proxy-wide),
    ``ip_connection_rate``: a fixed vocabulary, used as a metric label."""
    detail: str
    close_after_ms: int = 0


class ConnectionQuotas:
    def __init__(self, max_connections: int | None = None, max_per_ip: int | None = None,
                 per_ip_overrides: Mapping[str, int] | None = None, max_creation_rate: float | None = None,
                 ip_rate: Callable[[str], float | None] = lambda ip: None, samples: int = 11,
                 window_ms: int = 1000, max_ip_rates: int = 10_000) -> None:
        """``ip_rate(ip)``: the ``connection_creation_rate`` quota that applies to ``ip`` (its own, else the
        ``<default>`` ip's), None for none."""
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.per_ip_overrides = dict(per_ip_overrides or {})
        self.max_creation_rate = max_creation_rate
        self.ip_rate = ip_rate
        self._samples, self._window_ms, self._max_ip_rates = samples, window_ms, max_ip_rates
        self.total = 0
        self._per_ip: dict[str, int] = {}
        self._rate = SampledRate(samples, window_ms)
        self._ip_rates: dict[str, tuple[SampledRate, list[int]]] = {}  # ip -> (rate, [last used ms])

    def admit(self, ip: str, now_ms: int) -> Refusal | None:
        """A new connection from ``ip``: None when it may be served (it is then counted until :meth:`closed`)."""
        if self.max_connections is not None and self.total >= self.max_connections:
            return Refusal("max_connections", f"{self.total} connections open (max_connections)")
        limit = self.per_ip_overrides.get(ip, self.max_per_ip)
        n = self._per_ip.get(ip, 0)
        if limit is not None and n >= limit:
            return Refusal("max_connections_per_ip", f"{n} connections from {ip} open (max_connections_per_ip)")
        if self.max_creation_rate is not None:
            observed, window = self._rate.measure_and_window(now_ms)
            if (observed * window / 1000 + 1) / (window / 1000) > self.max_creation_rate:
                return Refusal("connection_creation_rate",
                               f"{observed:.1f} new connections/s (max_connection_creation_rate)")
            self._rate.record(1, now_ms)
        quota = self.ip_rate(ip)
        if quota is not None:
            rate = self._ip_rate_for(ip, now_ms)
            rate.record(1, now_ms)
            observed, window = rate.measure_and_window(now_ms)
            throttle = byte_rate_throttle_ms(observed, quota, window)
            if throttle > 0:
                return Refusal("ip_connection_rate",
                               f"{observed:.1f} new connections/s from {ip} (connection_creation_rate {quota:g})",
                               throttle)
        self.total += 1
        self._per_ip[ip] = n + 1
        return None

    def closed(self, ip: str) -> None:
        """A connection :meth:`admit` let in has closed."""
        self.total -= 1
        n = self._per_ip.get(ip, 0) - 1
        if n > 0:
            self._per_ip[ip] = n
        else:
            self._per_ip.pop(ip, None)

    def _ip_rate_for(self, ip: str, now_ms: int) -> SampledRate:
        entry = self._ip_rates.get(ip)
        if entry is None:
            if len(self._ip_rates) >= self._max_ip_rates:
                for k, _ in heapq.nsmallest(max(1, self._max_ip_rates // 10), self._ip_rates.items(),
                                            key=lambda kv: kv[1][1][0]):
                    del self._ip_rates[k]
            entry = self._ip_rates[ip] = (SampledRate(self._samples, self._window_ms), [now_ms])
        entry[1][0] = now_ms
        return entry[0]

    def expire(self, now_ms: int, idle_ms: int) -> None:
        """Forget per-IP rates unused for ``idle_ms``."""
        for ip in [ip for ip, (_r, used) in self._ip_rates.items() if now_ms - used[0] >= idle_ms]:
            del self._ip_rates[ip]

    def per_ip(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)


CONNECTION_CREATION_RATE = "connection_creation_rate"


class IpQuotaError(ValueError):
    """An ip quota Kafka would refuse; the message names the entity and the reason."""


class IpQuotas:
    """``connection_creation_rate`` per ip, or for the ``<default>`` ip (``None`` here, as on the wire): the config
    file's, overlaid by what AlterClientQuotas set (a removal there is kept, so it also hides the file's)."""

    def __init__(self) -> None:
        self.file: dict[str | None, float] = {}
        self.api: dict[str | None, float | None] = {}

    def set_file(self, rates: Mapping[str, float]) -> None:
        self.file = {None if ip == DEFAULT_IP else ip: r for ip, r in rates.items()}

    def effective(self) -> dict[str | None, float]:
        out = dict(self.file)
        for ip, r in self.api.items():
            if r is None:
                out.pop(ip, None)
            else:
                out[ip] = r
        return out

    def rate(self, ip: str) -> float | None:
        if not self.file and not self.api:
            return None
        eff = self.effective()
        return eff.get(ip, eff.get(None))

    @staticmethod
    def validate(name: str | None, key: str, value: float | None) -> None:
        """As Kafka's AlterClientQuotas checks an ip entity: a real IP address (or the default), one key."""
        who = "<default ip>" if name is None else f"<ip {name}>"
        if name is not None:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                raise IpQuotaError(f"{who}: {name!r} is not a valid IP address") from None
        if key != CONNECTION_CREATION_RATE:
            raise IpQuotaError(f"{who}: {key} is not an ip quota; ip entities take only {CONNECTION_CREATION_RATE}")
        if value is not None and (not isinstance(value, int | float) or math.isnan(value) or math.isinf(value)
                                  or value <= 0):
            raise IpQuotaError(f"{who}: {CONNECTION_CREATION_RATE} must be a finite number greater than 0")

    def alter(self, name: str | None, value: float | None) -> None:
        self.api[name] = value
