"""Prometheus metrics: proxy health, plus the quota metrics under Kafka's own group and metric names.

Why a custom collector instead of prometheus_client's Counter/Gauge objects: the hot path only bumps plain
ints and dict entries in :class:`Stats` (a labelled Counter costs a lock and a dict lookup per call), and the
quota metrics are read from the live quota state at scrape time, so an entity whose state expired after idling
simply stops being exported: label cardinality is bounded by the entities active within the idle timeout.

Quota metric names follow Kafka's ``<Group>`` / ``<name>`` (``Produce`` ``byte-rate`` becomes
``ktp_produce_byte_rate``), tagged ``user`` and ``client_id`` as Kafka tags them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from proxy.stats import Stats
from proxy.wire.loop_lag import LoopLag

log = logging.getLogger(__name__)


QuotaSample = tuple[str, str, str, str, str, float]
"""(group, metric name, user, client id, scope, value), e.g. ("Produce", "byte-rate", "alice", "", "broker 1", 1e6);
the scope is the broker (per-broker enforcement) or "" (quotas.scope: cluster)."""


def _metric_name(group: str, name: str) -> str:
    return f"ktp_{group.lower()}_{name.replace('-', '_')}"


_OWN_QUOTA_METRICS = {
    "quota-limit": "The bucket's quota as configured now (file, kafka-configs, AlterClientQuotas); not a Kafka metric",
    "lease-limit": "The limit this fleet member enforces on the bucket: its lease, a share of the quota; not a Kafka "
    "metric",
}
"""Help of the per-bucket series that are the proxy's own, not Kafka's: said so, and which limit each one is (a
fleet member's lease was once shown as the quota, issue 48)."""


def _by_label(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter family with one series per key of ``counts`` (a bounded vocabulary: reasons, kinds, API labels)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in list(counts.items()):
        family.add_metric([key], n)
    return family


FairSnapshot = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]
"""``proxy.rules.fair_seat.FairSeat.snapshot``: the brokers' loops and their tenants (empty while fair share is off)."""

_FAIR_BROKER = (
    ("limited", "1 while fair share limits the work this broker admits (it saturated and somebody light is on it)"),
    ("limit_bytes", "Work this broker admits per second while limited (bytes, plus a KiB a request); 0 when open"),
    ("level_bytes", "The water level: what each heavy tenant on this broker is paced at (work bytes/s)"),
    ("delay_seconds", "Queueing delay of the broker's answers in the last tick: service time over its baseline"),
    ("delay_avg_seconds", "The same delay averaged over a second (growth and release read it)"),
    ("baseline_seconds", "The smallest baseline (windowed minimum service time) among the last tick's samples"),
    ("target_seconds", "The delay the loop holds a limited broker at"),
    ("tenants", "Tenants tracked on this broker"),
)
_FAIR_BROKER_COUNTERS = (
    ("cuts", "Times the broker's limit was cut"),
    ("grows", "Times the broker's limit grew"),
    ("starts", "Tenants slow-started on this broker: surging beside a settled tenant, paced before any signal"),
    ("samples", "Answers of this broker taken as samples of its service time"),
)


def fair_share_families(snapshot: FairSnapshot) -> Iterator[Metric]:
    """Fair share's series: per broker its loop, per (broker, tenant) its demand, share and holds."""
    brokers, tenants = snapshot
    gauges = {n: GaugeMetricFamily(f"ktp_fair_share_{n}", doc, labels=["broker"]) for n, doc in _FAIR_BROKER}
    counters = {
        n: CounterMetricFamily(f"ktp_fair_share_{n}", doc, labels=["broker"]) for n, doc in _FAIR_BROKER_COUNTERS
    }
    for broker, limit, level, q, q_avg, base, target, n, cuts, grows, starts, samples in brokers:
        values = (1.0 if limit > 0 else 0.0, limit, level, q / 1000, q_avg / 1000, base / 1000, target / 1000, n)
        for (name, _doc), value in zip(_FAIR_BROKER, values, strict=True):
            gauges[name].add_metric([broker], float(value))
        for (name, _doc), value in zip(_FAIR_BROKER_COUNTERS, (cuts, grows, starts, samples), strict=True):
            counters[name].add_metric([broker], float(value))
    labels = ["broker", "user", "client_id"]
    demand = GaugeMetricFamily(
        "ktp_fair_share_tenant_demand_bytes",
        "A tenant's work on a broker per second, averaged over a second",
        labels=labels,
    )
    share = GaugeMetricFamily(
        "ktp_fair_share_tenant_share_bytes",
        "What a tenant is paced at on a limited broker (0: not paced)",
        labels=labels,
    )
    sparse = GaugeMetricFamily(
        "ktp_fair_share_tenant_sparse",
        "1 while the tenant is light (protected from the heavy tenants' level)",
        labels=labels,
    )
    held_s = CounterMetricFamily(
        "ktp_fair_share_tenant_held_seconds",
        "Time fair share held a tenant's requests, or throttled its Fetches",
        labels=labels,
    )
    held = CounterMetricFamily(
        "ktp_fair_share_tenant_held", "A tenant's requests fair share held or throttled", labels=labels
    )
    for broker, user, client_id, d, r, sp, hs, hn in tenants:
        lv = [broker, user, client_id]
        demand.add_metric(lv, d)
        share.add_metric(lv, r)
        sparse.add_metric(lv, float(sp))
        held_s.add_metric(lv, hs)
        held.add_metric(lv, float(hn))
    yield from gauges.values()
    yield from counters.values()
    yield from (demand, share, sparse, held_s, held)


class _Collector:
    def __init__(
        self,
        stats: Stats,
        live_connections: Callable[[], int],
        quota_samples: Callable[[], Iterable[QuotaSample]],
        log_stats: Callable[[], dict[str, int]],
        gauges: Callable[[], dict[str, tuple[str, float]]] = dict,
        loop_lag: LoopLag | None = None,
        fair: Callable[[], FairSnapshot] | None = None,
    ) -> None:
        self.fair = fair
        self.loop_lag = loop_lag
        self.log_stats = log_stats
        self.gauges = gauges
        self.stats = stats
        self.live_connections = live_connections
        self.quota_samples = quota_samples

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield GaugeMetricFamily("ktp_connections", "Client connections open now", value=self.live_connections())
        yield CounterMetricFamily("ktp_connections_accepted", "Client connections accepted", value=s.connections_total)
        b = CounterMetricFamily("ktp_client_bytes", "Bytes exchanged with clients", labels=["direction"])
        b.add_metric(["in"], s.bytes_from_clients)
        b.add_metric(["out"], s.bytes_to_clients)
        yield b
        r = CounterMetricFamily("ktp_requests", "Requests from clients, by API", labels=["api"])
        by_api = list(s.by_api.items())
        for api, c in by_api:
            if c.requests:
                r.add_metric([api], c.requests)
        yield r
        lat = SummaryMetricFamily(
            "ktp_request_latency_seconds", "Time from forwarding a request to its response, by API", labels=["api"]
        )
        for api, c in by_api:
            if c.latency_count:
                lat.add_metric([api], count_value=c.latency_count, sum_value=c.latency_sum)
        yield lat
        yield _by_label(
            "ktp_connection_errors", "Connections closed on an error, by reason", "reason", s.connection_errors
        )
        yield _by_label(
            "ktp_connections_refused",
            "New connections refused at a connection limit, by limit",
            "reason",
            s.connections_refused,
        )
        yield _by_label(
            "ktp_protected_topic_refusals",
            "Requests that named the proxy's own topics (the fleet's, the decision log's) and were refused, by API",
            "api",
            s.protected_refusals,
        )
        yield _by_label(
            "ktp_connections_shed",
            "Connections closed to make room for another address's (shed_when_full), by kind",
            "kind",
            s.connections_shed,
        )
        for name, (doc, value) in self.gauges().items():
            yield GaugeMetricFamily(name, doc, value=value)
        if self.loop_lag is not None:
            lag = self.loop_lag
            yield HistogramMetricFamily(
                "ktp_event_loop_lag_seconds",
                "How late the event loop ran a timer due every 100 ms: the wait a request arriving at that moment "
                "saw for whatever held the loop (every connection of this worker)",
                buckets=lag.buckets(),
                sum_value=lag.sum_s,
            )
            yield GaugeMetricFamily(
                "ktp_event_loop_lag_max_seconds", "The longest event-loop lag seen since start", value=lag.max_s
            )
        d = CounterMetricFamily(
            "ktp_quota_decisions", "Quota decisions, by quota kind and action", labels=["quota", "action", "shadow"]
        )
        for (kind, action, shadow), n in s.decision_counts().items():
            d.add_metric([kind, action, str(shadow).lower()], n)
        yield d
        dl = self.log_stats()
        if "pid_cache_users" in dl:
            yield GaugeMetricFamily(
                "ktp_producerids_cache_users",
                "Users with producer-id bloom filters (KIP-936)",
                value=dl["pid_cache_users"],
            )
            yield GaugeMetricFamily(
                "ktp_producerids_cache_bytes",
                "Bytes of producer-id bloom filters (KIP-936)",
                value=dl["pid_cache_bytes"],
            )
        if "written" in dl:
            events = CounterMetricFamily(
                "ktp_decision_log_events", "Decision-log events, by outcome", labels=["outcome"]
            )
            for outcome in ("written", "dropped", "failed", "topic_sent", "topic_failed"):
                if outcome in dl or not outcome.startswith("topic"):  # the topic's only when it is on
                    events.add_metric([outcome], dl.get(outcome, 0))
            yield events
            yield GaugeMetricFamily(
                "ktp_decision_log_queued", "Decision-log events waiting for the writer", value=dl.get("queued", 0)
            )
        families: dict[str, GaugeMetricFamily] = {}
        for group, name, user, client_id, scope, value in self.quota_samples():
            metric = _metric_name(group, name)
            fam = families.get(metric)
            if fam is None:
                doc = _OWN_QUOTA_METRICS.get(name) or f"Kafka quota metric {group} {name}"
                fam = families[metric] = GaugeMetricFamily(metric, doc, labels=["user", "client_id", "scope"])
            fam.add_metric([user, client_id, scope], value)
        yield from families.values()
        if self.fair is not None:
            yield from fair_share_families(self.fair())


def make_registry(
    stats: Stats,
    live_connections: Callable[[], int],
    quota_samples: Callable[[], Iterable[QuotaSample]],
    log_stats: Callable[[], dict[str, int]] = dict,
    gauges: Callable[[], dict[str, tuple[str, float]]] = dict,
    loop_lag: LoopLag | None = None,
    fair: Callable[[], FairSnapshot] | None = None,
) -> CollectorRegistry:
    """``gauges()``: more gauges read at scrape time, name -> (help, value); ``loop_lag``: the event-loop lag;
    ``fair()``: fair share's snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, live_connections, quota_samples, log_stats, gauges, loop_lag, fair))
    return registry


class _LoopTasks:
    """``ktp_asyncio_tasks``: the event loop's unfinished tasks, read at scrape time (a task leaked per connection
    or per request shows as a count that only grows; bench/soak.py watches it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        tasks = len(asyncio.all_tasks(self.loop))  # a copy of a weak set, retried if the loop changes it meanwhile
        yield GaugeMetricFamily("ktp_asyncio_tasks", "Unfinished asyncio tasks on the event loop", value=tasks)


PROBE_TIMEOUT_S = 2.0
"""How long /healthz and /readyz wait for the event loop to answer before they say 503: far longer than any
slice of work may hold it (a loop that has not run a callback in 2 s serves no client either)."""


def _on_loop(loop: asyncio.AbstractEventLoop, ask: Callable[[], str | None]) -> str | None:
    """``ask()`` run on the event loop (so it reads the proxy's state between two slices of work, never during
    one); what is wrong, or None. A loop that does not answer in time is what is wrong."""
    answer: concurrent.futures.Future[str | None] = concurrent.futures.Future()

    def run() -> None:
        try:
            answer.set_result(ask())
        except Exception as exc:  # noqa: BLE001 - a probe that fails says why, it does not take the server down
            answer.set_result(f"probe failed: {type(exc).__name__}")

    try:
        loop.call_soon_threadsafe(run)
        return answer.result(timeout=PROBE_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        return f"the event loop did not answer within {PROBE_TIMEOUT_S:g} s"
    except RuntimeError:  # the loop is closed: the process is on its way out
        return "the event loop is closed"


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int,
    loop: asyncio.AbstractEventLoop | None = None,
    readiness: Callable[[], str | None] = lambda: None,
) -> int:
    """Start the HTTP endpoint (a daemon thread); returns the port actually bound.

    ``/metrics``: Prometheus' text format. ``/healthz``: 200 while ``loop`` runs callbacks (liveness: restart
    me if not). ``/readyz``: 200 while ``readiness()``, asked on the loop, finds nothing wrong, else 503 and what
    (a load balancer or Kubernetes sends new clients elsewhere). Any other path: 404."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = urlsplit(self.path).path
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                return
            if path in ("/healthz", "/readyz"):
                if loop is None:
                    wrong: str | None = None
                else:
                    wrong = _on_loop(loop, (lambda: None) if path == "/healthz" else readiness)
                text = "ok\n" if wrong is None else f"{wrong}\n"
                self._send(200 if wrong is None else 503, text.encode(), "text/plain; charset=utf-8")
                return
            self._send(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
            """No line per scrape or probe: they come every few seconds for the life of the process."""

    class Server(ThreadingHTTPServer):
        address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # "::" binds IPv6
        daemon_threads = True

    if loop is not None:
        registry.register(_LoopTasks(loop))
    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics (probes: /healthz, /readyz)", host, bound)
    return int(bound)
