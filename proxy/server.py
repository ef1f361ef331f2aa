"""The proxy: a bootstrap listener, one listener per broker, and the connections between them."""

from __future__ import annotations

import asyncio
import itertools
import logging
import resource
import time
from collections.abc import Hashable
from typing import Any

from config.load import ConfigError
from config.model import ProxyConfig
from config.reload import plan_reload
from protocol.address_free import offered_caps
from protocol.api_versions import decode_caps
from protocol.apis import Api
from protocol.endpoint_apis import ADDRESS_APIS
from protocol.frames import RequestBytesPool
from protocol.principal import PrincipalMapper
from protocol.topic_guard import GUARDED_APIS
from proxy import metrics
from proxy.fleet.member import FleetSync
from proxy.fleet.parts import fleet_parts
from proxy.rules.policy import Policy
from proxy.stats import Stats
from proxy.wire.brokers import BrokerDirectory, NoBrokerPort
from proxy.wire.connection import Connection, Services
from proxy.wire.connection_life import ConnectionLife
from proxy.wire.discovery import discover_brokers
from proxy.wire.loop_lag import LoopLag
from proxy.wire.quota_import import fetch_cluster_quotas
from proxy.wire.responses import TopicIds
from proxy.wire.sockets import ClientSide
from proxy.wire.tls import client_context, server_context
from quotas.connections import NEVER_SPOKE, ConnectionQuotas, Refusal
from quotas.fair_share import FairShare

log = logging.getLogger(__name__)

FAIR_IDLE_TICK_S = 1.0
"""How often the server asks fair share for its state changes (and ticks it, when no request has)."""

# APIs whose requests or responses the proxy decodes, so clients must not negotiate past kafka-python's schemas.
DECODED_APIS = frozenset(
    {
        Api.API_VERSIONS,
        Api.PRODUCE,
        Api.FETCH,
        Api.CREATE_TOPICS,
        Api.DELETE_TOPICS,
        Api.CREATE_PARTITIONS,
        Api.DESCRIBE_CLIENT_QUOTAS,
        Api.ALTER_CLIENT_QUOTAS,
        Api.SASL_HANDSHAKE,
        Api.SASL_AUTHENTICATE,
    }
)


def _fd_budget() -> int:
    """File descriptors client connections may hold: the open-file limit less 200 kept for listeners, log files,
    metrics and discovery. Counted as used (``ConnectionQuotas.max_fds``): one per client socket, one more per
    broker connection, made when the client first speaks."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**31 - 1
    return max(soft - 200, 2)


def _line_due(table: dict[str, list[float]], key: str, every_s: float = 10) -> int | None:
    """One more event of ``key``: how many others came since its last log line when a line is due now (at most one
    every ``every_s``, so a flood cannot flood the log), else None. ``table``: key -> [last line (monotonic s),
    events since]."""
    now = time.monotonic()
    last = table.setdefault(key, [0.0, 0])
    if now - last[0] >= every_s:
        since = int(last[1])
        last[0], last[1] = now, 0
        return since
    last[1] += 1
    return None


class Proxy:
    def __init__(self, config: ProxyConfig, worker: int | None = None) -> None:
        """``worker``: this process's index among ``config.workers`` processes sharing the listener ports
        (SO_REUSEPORT); None for a single process."""
        self.config = config
        self.worker = worker
        listen = config.listen
        port_range = None if listen.broker_ports == "ephemeral" else listen.broker_ports
        self.directory = BrokerDirectory(
            listen.advertised(), port_range, self._start_broker_listener, fixed=worker is not None
        )
        self.topic_ids = TopicIds()
        self.stats = Stats()
        self.request_pool = RequestBytesPool(config.queued_max_request_bytes)
        self.fleet_parts = fleet_parts(config, worker)
        self.policy = Policy(config, self.stats, fleet=self.fleet_parts, topics=self.topic_ids)
        # While the proxy keeps topics of its own on the cluster, every API that can name a topic is decoded to
        # refuse them (protocol.topic_guard): clients must not negotiate past kafka-python's schemas for those.
        decoded = DECODED_APIS | (GUARDED_APIS if self.policy.guard is not None else frozenset())
        self.version_caps = offered_caps(decode_caps(ADDRESS_APIS | decoded))
        # TLS: towards clients (and how a client certificate becomes a principal) and towards the cluster.
        self.listen_ssl = server_context(listen.tls) if listen.tls else None
        self.principal_mapper = PrincipalMapper(listen.tls.principal_mapping_rules) if listen.tls else None
        self.upstream_ssl = client_context(config.upstream.tls) if config.upstream.tls else None
        self.connection_quotas = ConnectionQuotas()
        self._configure_limits(config)
        self.loop_lag = LoopLag.from_env(worker)
        self.services = Services(
            config,
            self.stats,
            self.policy,
            self.request_pool,
            self.directory,
            self.topic_ids,
            self.version_caps,
            self.admit_connection,
            self.connection_quotas.closed,
            self.connection_spoke,
            self.principal_mapper,
            self.upstream_ssl,
            self.loop_lag.timeline,
        )
        self._refusals: dict[str, list[float]] = {}  # reason -> [last logged (monotonic s), refused since]
        self._sheds: dict[str, list[float]] = {}  # kind -> [last logged (monotonic s), shed since]
        self.registry = metrics.make_registry(
            self.stats,
            lambda: len(self.connections),
            self.policy.quota_samples,
            self.policy.decision_log_stats,
            self._gauges,
            self.loop_lag,
            self.policy.fair_snapshot,
        )
        self.metrics_port: int | None = None
        self.connections: set[Connection] = set()
        self._servers: dict[int | None, asyncio.Server] = {}
        self._bootstrap_rr = itertools.count()
        self._closing = False
        self._tasks: list[asyncio.Task[Any]] = []
        self.fleet: FleetSync | None = None

    def _metrics_port(self) -> int:
        """Worker i serves its own metrics on metrics.port + i: a scrape must see one process, not a random one."""
        port = self.config.metrics.port or 0
        return port + self.worker if self.worker is not None and port else port

    @property
    def bootstrap_port(self) -> int:
        return int(self._servers[None].sockets[0].getsockname()[1])

    @property
    def bootstrap_address(self) -> str:
        return f"{self.config.listen.advertised()}:{self.bootstrap_port}"

    async def start(self) -> None:
        listen = self.config.listen
        loop = asyncio.get_running_loop()
        brokers = await discover_brokers(
            self.config.upstream.addresses(),
            self.config.upstream.connect_timeout_ms / 1000,
            self.config.max_frame_bytes,
            self.upstream_ssl,
        )
        if brokers:
            try:
                await self.directory.learn(brokers)
            except (NoBrokerPort, OSError) as exc:
                raise ConfigError(f"listen.broker_ports: cannot listen for the cluster's brokers ({exc})") from None
        else:  # serving anyway: clients get "no broker reachable" until it is up, and listeners come as it answers
            log.warning(
                "upstream %s: no broker answered at startup; serving anyway, broker listeners start as "
                "the cluster answers",
                ",".join(self.config.upstream.bootstrap_servers),
            )
        self._tasks.append(loop.create_task(self._upkeep()))
        self._tasks.append(loop.create_task(self._fair_ticks()))
        if self.config.metrics.port is not None or self.loop_lag.timeline is not None:
            self.loop_lag.start(loop)  # nobody could read it otherwise: no wake-ups for nothing
        if self.fleet_parts is not None:
            self.fleet = FleetSync(
                self.config,
                self.policy.quotas,
                self.fleet_parts,
                self.policy.now_ms,
                self.policy.sources,
                self.policy.guard,
                fair_share=self._fair_share,
            )
            self.fleet.start()
        if self.config.quotas.import_interval_seconds is not None:
            self._tasks.append(loop.create_task(self._import_quotas()))
        if self.config.metrics.port is not None:
            try:
                self.metrics_port = metrics.serve(
                    self.registry, self.config.metrics.host, self._metrics_port(), loop, self.readiness
                )
            except OSError as exc:
                raise ConfigError(
                    f"metrics.port {self._metrics_port()} on {self.config.metrics.host}: cannot "
                    f"listen ({exc.strerror or exc})"
                ) from None
        try:
            self._servers[None] = await loop.create_server(
                lambda: self._accept(None),
                listen.host,
                listen.bootstrap_port,
                reuse_address=True,
                reuse_port=self.worker is not None,
                ssl=self.listen_ssl,
            )
        except OSError as exc:
            raise ConfigError(
                f"listen.bootstrap_port {listen.bootstrap_port} on {listen.host}: cannot listen ({exc.strerror or exc})"
            ) from None
        log.info(
            "bootstrap listener on %s:%d for %s; point clients at %s",
            listen.host,
            self.bootstrap_port,
            ",".join(self.config.upstream.bootstrap_servers),
            self.bootstrap_address,
        )

    async def _upkeep(self) -> None:
        """Expire idle per-entity quota state (Kafka drops idle sensors after an hour); summarise traffic."""
        loop = asyncio.get_running_loop()
        summary_every = self.config.decision_log.summary_seconds
        next_summary = loop.time() + summary_every
        while True:
            await asyncio.sleep(min(1.0, summary_every))
            try:
                self.policy.upkeep()
                now = time.monotonic()
                self.connection_quotas.expire(round(now * 1000), 3_600_000)
                for conn in list(self.connections):
                    try:
                        conn.check_timeouts(now)
                    except Exception:  # noqa: BLE001 - one connection's bug closes that connection only
                        log.exception("%s via %s: timeout check failed; closing", conn.peer, conn.label)
                        conn.close("cannot process a request: timeout check failed", "internal")
                if loop.time() >= next_summary:
                    next_summary = loop.time() + summary_every
                    for conn in list(self.connections):
                        self.policy.summarise(conn)
            except Exception:  # a bug here must not end every timeout, expiry and summary for good
                log.exception("upkeep failed; trying again in a second")

    def _fair_share(self) -> FairShare | None:
        """Fair share's state now, for the fleet's light reports (None while it is off; a reload turns it on or off,
        and the policy's seat with it)."""
        fair = self.policy.fair
        return None if fair is None else fair.state

    async def _fair_ticks(self) -> None:
        """Fair share's state changes to the log, and its control step when no request has run it (requests tick
        it every ``quotas.fair_share.TICK_MS``): once a second, for the life of the server (a reload may turn fair
        share on or off). The timeline, when on, gets every broker's loop at each wake-up."""
        while True:
            await asyncio.sleep(FAIR_IDLE_TICK_S)
            try:
                self.policy.fair_tick()
                timeline = self.loop_lag.timeline
                fair = self.policy.fair
                if timeline is not None and fair is not None:  # diagnosis: each broker's loop, each tick
                    if fair.state.trace is None:
                        fair.state.trace = []
                    for at_ms, *rest in fair.state.trace:
                        timeline.append(("fair", rest[0], at_ms / 1000, *rest[1:]))
                    fair.state.trace.clear()
            except Exception:  # a bug here must not end fair share for good
                log.exception("fair share's tick failed; trying again at the next")

    async def _import_quotas(self) -> None:
        while True:
            cfg = self.config
            try:
                quotas = await fetch_cluster_quotas(
                    cfg.upstream.addresses(),
                    cfg.upstream.connect_timeout_ms / 1000,
                    cfg.max_frame_bytes,
                    self.upstream_ssl,
                )
            except Exception as exc:  # noqa: BLE001 - keep the last imported quotas and try again later
                log.warning("quota import: %s", exc)
            else:
                if quotas != self.policy.sources.imported:
                    log.info("quota import: %d entities from the cluster", len(quotas))
                    self.policy.sources.set_imported(quotas)
            interval = self.config.quotas.import_interval_seconds
            await asyncio.sleep(interval if interval else 60)

    def _configure_limits(self, config: ProxyConfig) -> None:
        lim = config.limits
        q = self.connection_quotas
        # Whatever max_connections says, connections stop short of running out of file descriptors, so an fd
        # flood is refused (or shed) with a line and a metric, never a silent reset.
        q.max_connections = lim.max_connections
        q.max_fds = _fd_budget()
        q.shed = lim.shed_when_full
        idle_s = lim.shed_idle_ms / 1000

        def is_idle(key: Hashable, now_ms: int) -> bool:  # the keys are the connections admitted (admit_connection)
            return isinstance(key, Connection) and key.idle_for_shedding(now_ms / 1000, idle_s)

        q.is_idle = is_idle
        q.max_per_ip = lim.max_connections_per_ip
        q.per_ip_overrides = dict(lim.max_connections_per_ip_overrides)
        q.max_creation_rate = lim.max_connection_creation_rate
        q.ip_rate = self.policy.ip_quotas.rate

    def admit_connection(self, conn: ConnectionLife, ip: str) -> Refusal | None:
        """A new client connection from ``ip``: None to serve it (closing what was shed to make room), else why
        not (counted, and logged at most once per reason every 10 s with the number refused meanwhile, so a
        flood cannot flood the log)."""
        refusal = self.connection_quotas.admit(conn, ip, round(time.monotonic() * 1000))
        self._close_shed()
        if refusal is not None:
            self._refused(ip, refusal)
        return refusal

    def connection_spoke(self, conn: ConnectionLife) -> Refusal | None:
        """``conn`` sent its first bytes: None if its broker connection may take a file descriptor."""
        refusal = self.connection_quotas.spoke(conn, round(time.monotonic() * 1000))
        self._close_shed()
        if refusal is not None:
            self._refused(conn.peer, refusal)
        return refusal

    def _refused(self, who: str, refusal: Refusal) -> None:
        self.stats.connections_refused[refusal.reason] += 1
        since = _line_due(self._refusals, refusal.reason)
        if since is not None:
            more = f" ({since} more refused since the last such line)" if since else ""
            log.warning("refused a connection from %s: %s%s", who, refusal.detail, more)

    def _close_shed(self) -> None:
        """Close the connections the limits shed to make room: counted by kind, logged at most once per kind
        every 10 s with the number shed meanwhile."""
        for shed in self.connection_quotas.take_shed():
            if isinstance(shed.key, ConnectionLife):  # always, here: the keys are the connections admitted
                shed.key.shed()
            self.stats.connections_shed[shed.kind] += 1
            since = _line_due(self._sheds, shed.kind)
            if since is not None:
                more = f" ({since} more shed since the last such line)" if since else ""
                what = "that never spoke" if shed.kind == NEVER_SPOKE else "idle past shed_idle_ms"
                log.warning(
                    "shed a connection %s from %s (%d still open from it, the most of any address) to make "
                    "room for one from %s: out of connections or file descriptors%s",
                    what,
                    shed.ip,
                    shed.held,
                    shed.for_ip,
                    more,
                )

    def _forget(self, conn: Connection) -> None:
        """A closed connection: its last summary (traffic since the previous one would be lost otherwise)."""
        self.connections.discard(conn)
        try:
            self.policy.summarise(conn)
        except Exception:  # noqa: BLE001 - a log event must never take the server down
            log.exception("%s: final decision-log summary failed", conn.peer)

    def _gauges(self) -> dict[str, tuple[str, float]]:
        pool = self.request_pool
        gauges: dict[str, tuple[str, float]] = {
            "ktp_request_pool_used_bytes": ("Request bytes reserved from queued_max_request_bytes", pool.used),
            "ktp_request_pool_waiting": ("Connections waiting for queued_max_request_bytes", pool.waiting),
        }
        if self.fleet is not None:
            gauges.update(self.fleet.gauges())
        return gauges

    def reload(self, config: ProxyConfig) -> None:
        """Put a new, validated configuration in force: its reloadable settings at once, everywhere; each
        restart-only setting it changed keeps its running value, with one warning line (``config.reload``).
        Raises ConfigError when the new settings do not fit the restart-only ones kept."""
        effective, kept = plan_reload(self.config, config)
        for setting in kept:
            log.warning("config reload: %s changed; it takes effect only after a restart", setting)
        fair_on = effective.quotas.fair_share.enabled
        if fair_on != self.config.quotas.fair_share.enabled:
            # Said apart from "configuration reloaded": it is the one switch that changes who waits with no quota
            # anywhere, and once off no fair-share series is left in the metrics to show it happened.
            if fair_on:
                log.info("fair share turned on (quotas.fair_share.enabled: true): a saturated broker is shared again")
            else:
                log.info("fair share turned off (quotas.fair_share.enabled: false): nobody is held for a share")
        self.config = effective
        logging.getLogger().setLevel(effective.log_level)
        self.policy.reload(effective)
        self._configure_limits(effective)

    async def _start_broker_listener(self, node_id: int, port: int) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: self._accept(node_id),
            self.config.listen.host,
            port,
            reuse_address=True,
            reuse_port=self.worker is not None,
            ssl=self.listen_ssl,
        )
        self._servers[node_id] = server
        return int(server.sockets[0].getsockname()[1])

    def _accept(self, node_id: int | None) -> ClientSide:
        """A new client socket: pair it with an upstream connection (made by the Connection)."""
        if node_id is None:
            addrs = self.config.upstream.addresses()
            start = next(self._bootstrap_rr) % len(addrs)
            candidates = addrs[start:] + addrs[:start]
            label = "bootstrap"
        else:
            target = self.directory.upstream_of(node_id)
            candidates = [target] if target else []
            label = f"broker {node_id}"
        self.stats.connections_total += 1
        conn = Connection(self.services, candidates, label)
        self.connections.add(conn)
        conn.done.add_done_callback(lambda _f: self._forget(conn))
        if self._closing:
            conn.drain()
        return conn.client

    def readiness(self) -> str | None:
        """What keeps this proxy from taking new clients (``/readyz``), or None: it is ready once the bootstrap
        listener is bound and every broker the cluster named has a listener, and no longer once it drains."""
        if self._closing:
            return "draining: shutting down"
        if None not in self._servers:
            return "the bootstrap listener is not bound yet"
        if not self.directory.upstream:
            return "no broker has answered yet"
        missing = sorted(set(self.directory.upstream) - set(self.directory.ports))
        if missing:
            return f"no listener yet for broker(s) {', '.join(map(str, missing))}"
        return None

    async def shutdown(self) -> None:
        """Turn unready, give load balancers ``shutdown_unready_ms`` to notice, stop accepting, let in-flight
        requests finish (up to the grace period), close everything."""
        if self._closing:
            return
        self._closing = True
        unready_s = self.config.shutdown_unready_ms / 1000
        log.info(
            "shutting down: unready now, %d connections to drain%s",
            len(self.connections),
            f" after {unready_s:g} s" if unready_s else "",
        )
        if unready_s:
            await asyncio.sleep(unready_s)  # still serving, new clients included: the balancer is catching up
        for task in self._tasks:
            task.cancel()
        for server in self._servers.values():
            server.close()
        conns = list(self.connections)
        for conn in conns:
            conn.drain()
        if conns:
            _, late = await asyncio.wait([c.done for c in conns], timeout=self.config.shutdown_grace_ms / 1000)
            if late:
                log.warning("%d connections still had requests in flight after the grace period", len(late))
            for conn in conns:
                conn.abort()
        for server in self._servers.values():
            await server.wait_closed()
        if self.fleet is not None:
            await self.fleet.stop()
        self.policy.close()
        self.loop_lag.stop()
        log.info("shut down")
