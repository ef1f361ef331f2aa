"""From what the brokers allowed to what each request costs them: the arithmetic of ``kafka-throttle-proxy calibrate``.

Pure, no I/O (the command in ``proxy.cli.calibrate`` measures; this reads the measurements). How a cost is inferred:
a broker enforcing ``request_percentage = P`` on a client lets it have P % of one thread, P × 10 ms of thread time a
second; a client that always has a request waiting (the probe does) is held at the rate R where R × cost = P × 10
ms/s, so each of its requests cost the broker ``P × 10 / R`` ms (:func:`cost_ms`). The rate is averaged over many
quota windows: a broker holds a flooder in cycles about one window long (a burst, then the throttle cap), so a
short measurement catches a burst or two and reads high (docs/quotas.md).

What the probes measure, and what the table gets from each (:func:`proposal`):

- ``Produce`` acks=1 to a partition of replication factor 1, one small batch a request: Produce's base (its
  per-KiB term kept from the built-in table, scaled; the probe's request is a few hundred bytes);
- ``Produce`` acks=-1 to a partition of the cluster's default replication factor: less the acks=1 cost, the term a
  Produce whose acks wait for the followers adds (``produce_replicated_ms``; 0 when the default factor is 1);
- ``Fetch`` of an empty partition with ``max_wait_ms`` 0: Fetch's base (an answer without records is all base:
  ``quotas.kinds.FETCH_BARE_BYTES``);
- ``Fetch`` of about a KiB of records from a written partition (``records``): less the empty one's cost, over the
  bytes its answer has past the bare ones, the steep head of a Fetch that returns data
  (``fetch_head_ms_per_kib``): what a tailing consumer's Fetch costs beyond an empty one;
- ``ListOffsets`` and ``Metadata`` of one partition, one topic: their bases.

Each probe keeps many requests in flight, as a pipelining client does. Produce acks=1, the empty Fetch, ListOffsets
and Metadata are probed a second time one request at a time (``Probe.alone``): their *alone* bases, what the brokers
charge a request whose connection awaits no other answer (a consumer's Fetch, a request/response loop), which is
about twice as much (``quotas.kinds.RequestCosts.alone``).

Every API not probed keeps its built-in row times the median of measured ÷ built-in over the probes
(``other_apis_scale``): a cluster whose brokers charge half the table for what was probed most likely does for the
rest too.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from quotas.kinds import BUILTIN_COSTS, FETCH, LIST_OFFSETS, METADATA, PRODUCE, RequestCosts, fetch_head_bytes

API_NAMES = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata"}


def cost_ms(percent: float, rate_per_s: float) -> float:
    """The broker thread time (ms) one request cost, from the quota ``percent`` (% of one thread) it was held to and
    the rate (requests a second) it was held at. ``inf`` for a rate of 0 (nothing got through)."""
    if percent <= 0:
        raise ValueError(f"request_percentage {percent}: must be positive")
    if rate_per_s <= 0:
        return float("inf")
    return percent * 10.0 / rate_per_s


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe's measurement: requests of ``api_key`` (``acks`` for a Produce) of about ``request_bytes`` each,
    answered at ``rates`` (requests a second, one a slice of the measured time, in order) under ``percent``."""

    name: str
    api_key: int
    percent: float
    request_bytes: int
    response_bytes: int
    rates: tuple[float, ...]
    acks: int = 1
    replication_factor: int = 1
    throttled: int = 0
    """Answers that carried a ``throttle_time_ms``: 0 means the probe never reached the quota, and its rate says
    what the client could do, not what the brokers allowed (:attr:`held`)."""
    records: bool = False
    """A Fetch whose answers carry records (the tailing probe): it gives the head term, not the base."""
    alone: bool = False
    """Sent one request at a time, not pipelined: it measures the API's base for a request sent alone."""

    @property
    def rate(self) -> float:
        return statistics.fmean(self.rates) if self.rates else 0.0

    @property
    def held(self) -> bool:
        return self.throttled > 0

    @property
    def cost_ms(self) -> float:
        return cost_ms(self.percent, self.rate)

    @property
    def spread(self) -> tuple[float, float]:
        """The lowest and highest per-slice cost: how steady the brokers' hold was."""
        costs = [cost_ms(self.percent, r) for r in self.rates if r > 0]
        return (min(costs), max(costs)) if costs else (float("inf"), float("inf"))

    def builtin_ms(self) -> float:
        """What the built-in table charges such a request (with its answer's size as the previous answer's)."""
        return (
            BUILTIN_COSTS.request_percent(
                self.api_key, self.request_bytes, self.response_bytes, self.acks, self.replication_factor
            )
            * 10.0
        )

    def size_terms_ms(self) -> float:
        """The built-in table's terms for this request's bytes and its answer's, its base and a Fetch's head left
        out: what the probe's cost holds beyond the base and the head (scaled with everything not measured)."""
        _base, per_in, per_out = BUILTIN_COSTS.cost(self.api_key)
        return (per_in * self.request_bytes + per_out * self.response_bytes) / 1024

    def head_bytes(self) -> int:
        """The bytes of its answer a Fetch's head term charges (0 for another API)."""
        return fetch_head_bytes(self.response_bytes) if self.api_key == FETCH else 0


@dataclass(frozen=True, slots=True)
class Proposal:
    """The ``quotas.request_costs`` section the probes give: per API its base, the replicated-Produce term, the
    scale of everything not probed, and what each was inferred from."""

    bases: dict[int, float]
    replicated_ms: float | None
    scale: float
    probes: tuple[Probe, ...]
    fetch_head_ms_per_kib: float | None = None
    """From the tailing Fetch probe; ``None`` without one (the built-in term, scaled)."""
    alone: dict[int, float] = field(default_factory=dict)
    """API key -> its base for a request sent alone (the probes one at a time)."""

    def costs(self, source: str) -> RequestCosts:
        """The table the proxy would charge by (what the section parses to): each probed base with the built-in
        size terms scaled, everything else scaled."""
        rows = {}
        for key, base in self.bases.items():
            _b, per_in, per_out = BUILTIN_COSTS.cost(key)
            rows[key] = (base, per_in * self.scale, per_out * self.scale)
        return BUILTIN_COSTS.scaled(
            self.scale, rows, self.replicated_ms, self.fetch_head_ms_per_kib, source, self.alone
        )


class CalibrationError(Exception):
    """The probes do not support a table (a probe the brokers never held, or one that got nothing through)."""


def proposal(probes: Sequence[Probe]) -> Proposal:
    """The table the probes support. Raises :class:`CalibrationError` naming a probe the brokers never held (its
    rate is the client's, not the quota's: lower ``--percent``) or that got nothing through."""
    for p in probes:
        if not p.held:
            raise CalibrationError(
                f"probe {p.name}: the brokers never throttled it ({p.rate:.0f} requests/s under {p.percent} %), so its "
                "rate is the client's, not what the quota allows: lower --percent"
            )
        if p.rate <= 0:
            raise CalibrationError(f"probe {p.name}: no answer in the measured time")
    # The scale of what was not probed: from the pipelined probes, as the built-in table was fitted to such clients.
    ratios = [p.cost_ms / p.builtin_ms() for p in probes if p.builtin_ms() > 0 and not p.alone]
    scale = statistics.median(ratios) if ratios else 1.0
    head_ms = BUILTIN_COSTS.fetch_head_ms_per_kib * scale / 1024  # a Fetch answer's head, ms a byte
    tail = next((p for p in probes if p.api_key == FETCH and p.records and not p.alone), None)
    empty = next((p for p in probes if p.api_key == FETCH and not p.records and not p.alone), None)
    fetch_head: float | None = None
    if tail is not None and empty is not None:
        if tail.head_bytes() <= empty.head_bytes():
            raise CalibrationError(
                f"probe {tail.name}: its answers ({tail.response_bytes} bytes) carried no more than the empty "
                f"Fetch's ({empty.response_bytes}): no records to measure the head term by"
            )
        extra = (tail.cost_ms - tail.size_terms_ms() * scale) - (empty.cost_ms - empty.size_terms_ms() * scale)
        head_ms = max(extra, 0.0) / (tail.head_bytes() - empty.head_bytes())
        fetch_head = head_ms * 1024
    bases: dict[int, float] = {}
    alone: dict[int, float] = {}
    plain: Probe | None = None
    replicated: Probe | None = None
    for p in probes:
        if p.alone:
            if not p.records and (p.api_key != PRODUCE or p.acks == 1):
                alone[p.api_key] = max(p.cost_ms - p.size_terms_ms() * scale - p.head_bytes() * head_ms, 0.0)
            continue
        if p.api_key == PRODUCE and p.acks == -1:
            replicated = p
            continue
        if p.records:
            continue
        if p.api_key == PRODUCE:
            plain = p
        bases[p.api_key] = max(p.cost_ms - p.size_terms_ms() * scale - p.head_bytes() * head_ms, 0.0)
    replicated_ms: float | None = None
    if replicated is not None and plain is not None:
        replicated_ms = (
            max(replicated.cost_ms - plain.cost_ms, 0.0) if replicated.replication_factor > 1 else 0.0
        )  # acks=-1 to RF 1 waits for nobody: the brokers charge it as acks=1, and so does the table then
    return Proposal(
        bases, replicated_ms, scale, tuple(probes), fetch_head, {k: v for k, v in alone.items() if k in bases}
    )


def render(p: Proposal, source: str, header: Sequence[str]) -> str:
    """The YAML section to merge into the proxy's configuration, with ``header`` and each probe's figures as
    comments."""
    lines = [f"# {h}" for h in header]
    lines.append("# probe: requests/s the brokers allowed -> ms a request (spread over the slices; built-in table)")
    for probe in p.probes:
        lo, hi = probe.spread
        lines.append(
            f"#   {probe.name}: {probe.rate:,.0f}/s -> {probe.cost_ms:.4f} ms ({lo:.4f}-{hi:.4f}; "
            f"built-in {probe.builtin_ms():.4f}, x{probe.cost_ms / probe.builtin_ms():.2f})"
        )
    lines += ["quotas:", "  request_costs:", f"    source: {_quoted(source)}", "    apis:"]
    costs = p.costs(source)
    for key in sorted(p.bases):
        base, per_in, per_out = costs.cost(key)
        alone = f", alone_base_ms: {p.alone[key]:.5f}" if key in p.alone else ""
        lines.append(
            f"      {API_NAMES[key]}: {{base_ms: {base:.5f}, request_ms_per_kib: {per_in:.5f}, "
            f"response_ms_per_kib: {per_out:.5f}{alone}}}"
        )
    lines.append(f"    other_apis_scale: {p.scale:.3f}")
    if p.replicated_ms is not None:
        lines.append(f"    produce_replicated_ms: {p.replicated_ms:.4f}")
    if p.fetch_head_ms_per_kib is not None:
        lines.append(f"    fetch_head_ms_per_kib: {p.fetch_head_ms_per_kib:.4f}")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar of ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
