"""Kafka's connection limits (``ConnectionQuotas``) and the KIP-612 connection creation rate, as pure policy; and
the proxy's own file-descriptor budget, shared so that no address can lock out the others.

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

The proxy's own (no Kafka setting): ``max_fds``, the file descriptors connections may hold, counted as they are
really used. A client that has not spoken yet holds one (its socket: the broker connection is made on its first
bytes); one that spoke holds two. Counting two for every connection, as the proxy did, handed the whole budget to
whoever opened the most silent sockets, at half what they really cost.

Shedding (``shed``, on by default), after Envoy's overload manager (under resource pressure, close what costs
least to lose) and HAProxy's per-source limits (one source cannot take what is meant for all): when a new
connection does not fit under ``max_connections`` or ``max_fds``, and the address holding the most connections
holds at least two more than the newcomer's address, one of its connections is closed to make room: one that
never spoke (oldest first), else one that spoke but has had nothing in flight for a while (``is_idle``). Only
the biggest address is ever shed, and never below the newcomer's count, so shedding moves towards an equal
share and two addresses cannot shed each other back and forth; a flood from one address then costs that address
its own silent connections, and everybody else still gets in. Kafka itself closes a connection to make room in
one case (KIP-402: the inter-broker listener, when the broker-wide limit is reached, takes the least recently
used connection of another listener); this does it for every address.

Counts and rates are kept only for IPs with a live connection or an ip quota, and per-IP rate state is capped.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from quotas.rate import SampledRate, byte_rate_throttle_ms

DEFAULT_IP = "<default>"

RefusalReason: TypeAlias = Literal[
    "max_connections", "max_connections_per_ip", "connection_creation_rate", "ip_connection_rate", "open_files"
]
"""Why a connection is refused: the first four are Kafka's settings by the proxy's names, ``open_files`` is
``max_fds``. A fixed vocabulary, because it is a metric label (``ktp_connections_refused_total{reason}``)."""
ShedKind: TypeAlias = Literal["never_spoke", "idle"]
"""Which connection was shed: a fixed vocabulary, because it is a metric label."""
NEVER_SPOKE: Final[ShedKind] = "never_spoke"
IDLE: Final[ShedKind] = "idle"
_IDLE_SEARCH = 1024
"""Connections that spoke looked at per search for an idle one (the rest are looked at by later searches: those
looked at go to the end), so that making room costs a bounded time however many an address holds."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new connection is not served; ``close_after_ms`` > 0: hold it (unread) that long, then close."""

    reason: RefusalReason
    detail: str
    close_after_ms: int = 0


@dataclass(frozen=True, slots=True)
class Shed:
    """A connection the policy has dropped from its counts to make room: the caller must close it."""

    key: Hashable
    ip: str
    kind: ShedKind
    held: int
    """Connections its address still holds, after this one."""
    for_ip: str
    """The address room was made for."""


def _fds_of(victim: tuple[Hashable, str, ShedKind]) -> int:
    """What shedding ``victim`` frees: one fd if it never spoke, two (with its broker connection) if it did."""
    return 1 if victim[2] == NEVER_SPOKE else 2


class _Address:
    """One address's live connections, each in admission order (the oldest is shed first)."""

    __slots__ = ("quiet", "spoken")

    def __init__(self) -> None:
        self.quiet: dict[Hashable, None] = {}
        """Connections that never spoke (one fd each)."""
        self.spoken: dict[Hashable, None] = {}
        """Connections that spoke (two fds each); examined busy ones are moved to the end."""

    def __len__(self) -> int:
        return len(self.quiet) + len(self.spoken)


class ConnectionQuotas:
    def __init__(
        self,
        max_connections: int | None = None,
        max_per_ip: int | None = None,
        per_ip_overrides: Mapping[str, int] | None = None,
        max_creation_rate: float | None = None,
        ip_rate: Callable[[str], float | None] = lambda ip: None,
        samples: int = 11,
        window_ms: int = 1000,
        max_ip_rates: int = 10_000,
        max_fds: int | None = None,
        shed: bool = True,
        is_idle: Callable[[Hashable, int], bool] = lambda key, now_ms: False,
    ) -> None:
        """``ip_rate(ip)``: the ``connection_creation_rate`` quota that applies to ``ip`` (its own, else the
        ``<default>`` ip's), None for none. ``is_idle(key, now_ms)``: whether a connection that spoke may be shed
        (nothing in flight, quiet long enough); asked only when room must be made."""
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.per_ip_overrides = dict(per_ip_overrides or {})
        self.max_creation_rate = max_creation_rate
        self.ip_rate = ip_rate
        self.max_fds = max_fds
        self.shed = shed
        self.is_idle = is_idle
        self._samples, self._window_ms, self._max_ip_rates = samples, window_ms, max_ip_rates
        self.total = 0
        self.fds = 0
        """File descriptors the live connections hold: one each, two once spoken."""
        self._conns: dict[Hashable, str] = {}  # key -> its ip
        self._addresses: dict[str, _Address] = {}
        # Addresses by connection count, and the largest count: the biggest address in O(1), whatever the
        # number of addresses (a scan of every address per admission would be the flood's lever).
        self._by_count: dict[int, dict[str, None]] = {}
        self._max_count = 0
        self._shed: list[Shed] = []
        self._rate = SampledRate(samples, window_ms)
        self._ip_rates: dict[str, tuple[SampledRate, list[int]]] = {}  # ip -> (rate, [last used ms])

    # -- admission ---------------------------------------------------------------------------------
    def admit(self, key: Hashable, ip: str, now_ms: int) -> Refusal | None:
        """A new connection ``key`` from ``ip``: None when it may be served (it is then counted until
        :meth:`closed`); connections shed to make room for it are then in :meth:`take_shed`."""
        victim: tuple[Hashable, str, ShedKind] | None = None
        if self._full(1, 1):
            victim = self._victim(ip, now_ms, admitting=True)
            if victim is None or self._full(0, 1 - _fds_of(victim)):  # one shed must be enough
                return self._full_refusal()
        limit = self.per_ip_overrides.get(ip, self.max_per_ip)
        n = self.per_ip(ip)
        if limit is not None and n >= limit:
            return Refusal("max_connections_per_ip", f"{n} connections from {ip} open (max_connections_per_ip)")
        if self.max_creation_rate is not None:
            observed, window = self._rate.measure_and_window(now_ms)
            if (observed * window / 1000 + 1) / (window / 1000) > self.max_creation_rate:
                return Refusal(
                    "connection_creation_rate", f"{observed:.1f} new connections/s (max_connection_creation_rate)"
                )
            self._rate.record(1, now_ms)
        quota = self.ip_rate(ip)
        if quota is not None:
            rate = self._ip_rate_for(ip, now_ms)
            rate.record(1, now_ms)
            observed, window = rate.measure_and_window(now_ms)
            throttle = byte_rate_throttle_ms(observed, quota, window)
            if throttle > 0:
                return Refusal(
                    "ip_connection_rate",
                    f"{observed:.1f} new connections/s from {ip} (connection_creation_rate {quota:g})",
                    throttle,
                )
        if victim is not None:  # only now: a newcomer refused for another reason costs nobody a connection
            self._drop(victim, ip)
        self._conns[key] = ip
        address = self._addresses.get(ip)
        if address is None:
            address = self._addresses[ip] = _Address()
        self._move(ip, len(address), len(address) + 1)
        address.quiet[key] = None
        self.total += 1
        self.fds += 1
        return None

    def spoke(self, key: Hashable, now_ms: int) -> Refusal | None:
        """Connection ``key`` sent its first bytes: its broker connection needs a second fd. None when it may
        have one; else it is no longer counted and must be closed (nothing could be shed for it)."""
        ip = self._conns.get(key)
        if ip is None:
            return None  # not counted (shed meanwhile, or never admitted): nothing to account
        address = self._addresses[ip]
        if key not in address.quiet:
            return None  # spoke before
        if self.max_fds is not None and self.fds + 1 > self.max_fds:
            victim = self._victim(ip, now_ms, admitting=False, exclude=key)
            if victim is None or self.fds + 1 - _fds_of(victim) > self.max_fds:
                self._forget(key)
                return Refusal(
                    "open_files",
                    f"{self.fds} of {self.max_fds} file descriptors held by connections, "
                    f"none can be shed for a broker connection (open-file limit)",
                )
            self._drop(victim, ip)
        del address.quiet[key]
        address.spoken[key] = None
        self.fds += 1
        return None

    def closed(self, key: Hashable) -> None:
        """Connection ``key``, admitted, has closed (a key no longer counted, e.g. shed, is ignored)."""
        if key in self._conns:
            self._forget(key)

    def take_shed(self) -> list[Shed]:
        """The connections shed since the last call, for the caller to close."""
        out, self._shed = self._shed, []
        return out

    # -- capacity and victims ----------------------------------------------------------------------
    def _full(self, more_connections: int, more_fds: int) -> bool:
        return (self.max_connections is not None and self.total + more_connections > self.max_connections) or (
            self.max_fds is not None and self.fds + more_fds > self.max_fds
        )

    def _full_refusal(self) -> Refusal:
        if self.max_connections is not None and self.total >= self.max_connections:
            return Refusal("max_connections", f"{self.total} connections open (max_connections)")
        return Refusal(
            "open_files",
            f"{self.fds} of {self.max_fds} file descriptors held by {self.total} connections (open-file limit)",
        )

    def _victim(
        self, for_ip: str, now_ms: int, admitting: bool, exclude: Hashable = None
    ) -> tuple[Hashable, str, ShedKind] | None:
        """A connection of the biggest address to close for one of ``for_ip`` (key, ip, kind), None for none;
        never ``exclude``. Admitting, the biggest must hold two more than ``for_ip`` (after the shed it still
        holds at least as many): an address never sheds another for its own growth unless that one holds more.
        For a broker connection (not ``admitting``) the count does not change; any biggest address may give,
        ``for_ip`` included."""
        if not self.shed:
            return None
        top = self._max_count
        if top == 0 or (admitting and top < self.per_ip(for_ip) + 2):
            return None
        biggest = self._by_count.get(top, {})
        for ip in biggest:
            for key in self._addresses[ip].quiet:  # the oldest first; at most two looked at
                if key is not exclude:
                    return key, ip, NEVER_SPOKE
        budget = _IDLE_SEARCH
        for ip in biggest:
            spoken = self._addresses[ip].spoken
            for key in list(itertools.islice(spoken, budget)):  # a copy: the loop moves them
                if key is not exclude and self.is_idle(key, now_ms):
                    return key, ip, IDLE
                del spoken[key]  # busy: to the end, so the next search starts with others
                spoken[key] = None
                budget -= 1
            if budget <= 0:
                break
        return None

    def _drop(self, victim: tuple[Hashable, str, ShedKind], for_ip: str) -> None:
        key, ip, kind = victim
        self._forget(key)
        self._shed.append(Shed(key, ip, kind, self.per_ip(ip), for_ip))

    def _forget(self, key: Hashable) -> None:
        ip = self._conns.pop(key)
        address = self._addresses[ip]
        if key in address.quiet:
            del address.quiet[key]
            self.fds -= 1
        else:
            del address.spoken[key]
            self.fds -= 2
        self.total -= 1
        n = len(address)
        self._move(ip, n + 1, n)
        if not n:
            del self._addresses[ip]

    def _move(self, ip: str, old: int, new: int) -> None:
        """``ip``'s connection count went from ``old`` to ``new`` (one apart): keep the count index."""
        if old:
            bucket = self._by_count[old]
            del bucket[ip]
            if not bucket:
                del self._by_count[old]
        if new:
            self._by_count.setdefault(new, {})[ip] = None
        if new > self._max_count:
            self._max_count = new
        elif old == self._max_count and old not in self._by_count:
            self._max_count = new  # the last address at the top went down by one

    # -- rates -------------------------------------------------------------------------------------
    def _ip_rate_for(self, ip: str, now_ms: int) -> SampledRate:
        entry = self._ip_rates.get(ip)
        if entry is None:
            if len(self._ip_rates) >= self._max_ip_rates:
                for k, _ in heapq.nsmallest(
                    max(1, self._max_ip_rates // 10), self._ip_rates.items(), key=lambda kv: kv[1][1][0]
                ):
                    del self._ip_rates[k]
            entry = self._ip_rates[ip] = (SampledRate(self._samples, self._window_ms), [now_ms])
        entry[1][0] = now_ms
        return entry[0]

    def expire(self, now_ms: int, idle_ms: int) -> None:
        """Forget per-IP rates unused for ``idle_ms``."""
        for ip in [ip for ip, (_r, used) in self._ip_rates.items() if now_ms - used[0] >= idle_ms]:
            del self._ip_rates[ip]

    def per_ip(self, ip: str) -> int:
        address = self._addresses.get(ip)
        return len(address) if address is not None else 0

    def addresses(self) -> int:
        """Addresses with a live connection (what the per-address state costs)."""
        return len(self._addresses)


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
        if value is not None and (
            not isinstance(value, int | float) or math.isnan(value) or math.isinf(value) or value <= 0
        ):
            raise IpQuotaError(f"{who}: {CONNECTION_CREATION_RATE} must be a finite number greater than 0")

    def alter(self, name: str | None, value: float | None) -> None:
        self.api[name] = value
