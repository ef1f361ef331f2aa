"""The counters a connection and the policy bump for every request: plain ints and dicts, exported at scrape time
by ``proxy.metrics``.

A module of its own so it can be compiled with the per-request path (``proxy/build_info.py``): from compiled
code, bumping an attribute of a native class is a store, of an interpreted dataclass a generic attribute call.
"""

from __future__ import annotations

from collections import defaultdict

from quotas.kinds import KIND_SETS, keys_of

__all__ = ["ApiCounters", "Stats", "Traffic"]


class ApiCounters:
    """One API's request count and response latency. Why an object: a connection keeps the one of the API it
    sent last, so counting a request or a response is a native store, not a dict update under a str key."""

    __slots__ = ("requests", "latency_sum", "latency_count")

    def __init__(self) -> None:
        self.requests = 0
        self.latency_sum = 0.0
        """Seconds from forwarding a request to its response, summed."""
        self.latency_count = 0


class Traffic:
    """One connection's traffic since its last decision-log summary, and the part of it that had events of its
    own. One owner for both: the connection counts what it reads and writes, the policy what it logged with a
    request's own event, and :meth:`take` leaves the latter out, so summing any column over every event counts
    each request once."""

    __slots__ = ("requests", "bytes_in", "bytes_out", "logged_requests", "logged_in", "logged_out")

    def __init__(self) -> None:
        self.requests = self.bytes_in = self.bytes_out = 0
        """The connection's counts: requests, and bytes read from the client and from the broker for it (size
        prefixes included)."""
        self.logged_requests = self.logged_in = self.logged_out = 0
        """The policy's: the same, of the requests that had decision-log events of their own."""

    def logged_request(self, frame_bytes: int) -> None:
        """A request of ``frame_bytes`` (its size prefix included) has an event of its own."""
        self.logged_requests += 1
        self.logged_in += frame_bytes

    def logged_response(self, frame_bytes: int) -> None:
        """The response of a request with its own event: ``frame_bytes`` (size prefix included; 0: none)."""
        self.logged_out += frame_bytes

    def take(self) -> tuple[int, int, int] | None:
        """Requests, bytes in and bytes out since the last take that no event of their own counted (None when
        there were none); the counts start again from zero. A request read before a take and logged after it
        is left out of both summaries, never counted twice (hence the floor at zero)."""
        out = (
            max(0, self.requests - self.logged_requests),
            max(0, self.bytes_in - self.logged_in),
            max(0, self.bytes_out - self.logged_out),
        )
        self.requests = self.bytes_in = self.bytes_out = 0
        self.logged_requests = self.logged_in = self.logged_out = 0
        return out if any(out) else None


class Tally:
    """One count, bumped in place: compiled, ``tally.n += 1`` is a native add on a field, where a count kept in a
    list slot was boxed back into it (an int object allocated on every decision once past 256)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Stats:
    """Counters bumped on the hot path; exported at scrape time."""

    __slots__ = (
        "connections_total",
        "requests",
        "bytes_from_clients",
        "bytes_to_clients",
        "by_api",
        "connection_errors",
        "decisions",
        "passes",
        "connections_refused",
        "protected_refusals",
        "connections_shed",
    )

    def __init__(self) -> None:
        self.connections_total = 0
        self.requests = 0
        self.bytes_from_clients = 0
        self.bytes_to_clients = 0
        self.by_api: dict[str, ApiCounters] = {}
        """``protocol.apis.api_label`` (a bounded set) -> that API's counters; see :meth:`api`."""
        self.connection_errors: defaultdict[str, int] = defaultdict(int)
        self.decisions: defaultdict[tuple[str, str, bool], int] = defaultdict(int)
        """(quota key, action, shadow) -> decisions; enforced passes are in :attr:`passes` (see
        :meth:`decision_counts`)."""
        self.passes: list[Tally] = [Tally() for _ in range(KIND_SETS)]
        """Indexed by a set of quota kinds (``quotas.kinds.BIT``): enforced "pass" decisions over exactly those
        kinds. The decision counted on nearly every request, in one list slot rather than a dict get and set per
        quota key (docs/performance.md)."""
        self.connections_refused: defaultdict[str, int] = defaultdict(int)
        """quotas.connections.Refusal.reason -> count."""
        self.protected_refusals: defaultdict[str, int] = defaultdict(int)
        """``protocol.apis.api_label`` -> requests that named the proxy's own topics (``protocol.topic_guard``)."""
        self.connections_shed: defaultdict[str, int] = defaultdict(int)
        """quotas.connections.Shed.kind -> connections closed to make room for another address's."""

    def api(self, label: str) -> ApiCounters:
        """The counters of the API labelled ``label`` (created at first use)."""
        counters = self.by_api.get(label)
        if counters is None:
            counters = self.by_api[label] = ApiCounters()
        return counters

    def decision_counts(self) -> dict[tuple[str, str, bool], int]:
        """Every decision count by (quota key, action, shadow): :attr:`decisions` and :attr:`passes` together."""
        out = dict(self.decisions)
        for kinds, tally in enumerate(self.passes):
            n = tally.n
            if not n:
                continue
            for key in keys_of(kinds):
                out[(key, "pass", False)] = out.get((key, "pass", False), 0) + n
        return out
