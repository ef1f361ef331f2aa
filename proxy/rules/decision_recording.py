"""Decisions counted (metrics) and shipped to the decision log; the log's opening.

Why a module of its own: what the policy decided is recorded the same way whatever decided it (a byte rate, a
producer id, a mutation), and the log's opening is configuration, not a decision. The dispatcher hands every
finished :class:`proxy.rules.decisions.Decision` to :meth:`DecisionRecorder.record`; compiled with it
(``proxy.build_info.COMPILED``): the usual pass costs one counter bump and one attribute read.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from config.load import ConfigError
from config.model import ProxyConfig
from proxy.rules.decisions import Decision
from proxy.rules.verdicts import PolicyConnection
from proxy.stats import Stats
from quotas.decision_events import fair_share_event, request_event, summary_event
from quotas.fair_share import MIB, BrokerLoad
from quotas.kinds import keys_of

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """What the recorder uses of ``proxy.decision_log.writer.DecisionLog`` (imported only when the log is on:
    it loads pyarrow)."""

    def emit(self, event: Mapping[str, Any]) -> bool: ...
    def stats(self) -> dict[str, int]: ...
    def close(self, timeout: float | None = 30.0) -> None: ...


class DecisionRecorder:
    """Counts every decision and, while the decision log is on, writes one event per decided request and one
    summary per connection for the traffic that met no decision."""

    def __init__(
        self, config: ProxyConfig, stats: Stats, now_ms: Callable[[], int], wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.stats = stats
        self._wall_clock = wall_clock
        """Epoch seconds (the log's timestamps); injected beside the policy's monotonic clock."""
        self.log: EventSink | None = open_decision_log(config)
        self.epoch_offset_ms = round(wall_clock() * 1000) - now_ms()
        """Added to the policy's monotonic ms (``now_ms``) to stamp events in epoch ms (one wall-clock read)."""
        self._fair_logged: dict[str, float] = {}
        """Broker -> when its fair share's last "saturated" line was logged (at most one a minute)."""

    def record(
        self,
        conn: PolicyConnection,
        d: Decision,
        bytes_out: int,
        upstream_ms: float | None,
        now_ms: int,
        shadow: bool,
    ) -> None:
        """Count the decision (metrics) and ship it to the decision log."""
        throttle_ms = d.throttle_ms if d.throttle_ms >= d.paced_ms else d.paced_ms
        fair_ms = d.fair_ms
        if d.fair_shadow:  # fair share in shadow mode: the wait it would have given
            shadow = True
        if not d.rejected and throttle_ms <= 0 and fair_ms <= 0 and not shadow:  # the usual decision: a pass,
            self.stats.passes[d.noted].n += 1  # counted once for its set of kinds (Stats.passes)
            if self.log is None:
                return
        if fair_ms > 0:
            self.stats.decisions[("fair_share", "held", shadow)] += 1
        if fair_ms > 0 and fair_ms >= throttle_ms:  # fair share held it longest, or gave the throttle it carries
            # (a paced tenant's Fetch answer: on_response raised throttle_ms to fair_ms): the log says so (its
            # reason, its wait), never the static quotas it passed
            action, throttle_ms = "fair_share", fair_ms
        else:
            action = "reject" if d.rejected else "throttle" if throttle_ms > 0 else "pass"
        if action != "pass" or shadow:
            decisions = self.stats.decisions
            for key in keys_of(d.noted):
                decisions[(key, action, shadow)] += 1
        if self.log is None:
            return
        # This request has its own event: the connection's next summary covers only the traffic that met no
        # decision, so summing any column over all events counts each request once.
        conn.traffic.logged_response(bytes_out + 4 if bytes_out else 0)
        off = self.epoch_offset_ms
        self.log.emit(
            request_event(
                ts_ms=now_ms + off,
                req_ts_ms=d.charged_ms + off,
                conn=conn.id,
                user=d.user,
                client_id=d.client_id,
                api_key=d.api_key,
                api_version=d.api_version,
                bytes_in=d.bytes_in,
                bytes_out=bytes_out,
                mutations=d.mutations,
                new_pids=d.new_pids,
                upstream_ms=upstream_ms,
                action=action,
                throttle_ms=throttle_ms,
                shadow=shadow,
                rejected_topics=d.rejected,
                scope=d.scope,
                topic_partitions=d.topic_partitions,
                values=d.values or {},
                fair=_fair_columns(d) if action == "fair_share" else None,
            )
        )

    def fair_share_change(self, b: BrokerLoad, state: str, shadow: bool) -> None:
        """A broker's fair share opened (``open``: unlimited again) or started limiting: one log line at most a
        minute per broker (the load, not a client, moves it, but it may flap), one decision-log event each."""
        now = self._wall_clock()
        if state == "open" or now - self._fair_logged.get(b.key, -1e9) >= 60:
            self._fair_logged[b.key] = now
            if state != "open":
                log.info(
                    "fair share: %s saturated (delay %.1f ms over a %.1f ms baseline, target %.1f ms): limited to "
                    "%.1f MiB/s of work, shared by %d tenants%s",
                    b.key, b.q, b.base, b.target, b.limit / MIB, len(b.tenants), " (shadow)" if shadow else "",
                )  # fmt: skip
            else:
                log.info("fair share: %s no longer limited%s", b.key, " (shadow)" if shadow else "")
            if len(self._fair_logged) > 4096:
                self._fair_logged.clear()
        if self.log is not None:
            self.log.emit(
                fair_share_event(
                    ts_ms=round(now * 1000),
                    broker=b.key,
                    action="saturated" if state != "open" else "released",
                    limit=b.limit,
                    level=b.level,
                    delay_ms=b.q,
                    baseline_ms=b.base,
                    target_ms=b.target,
                    tenants=len(b.tenants),
                    shadow=shadow,
                )
            )

    def summarise(self, conn: PolicyConnection, scope: str, shadow: bool) -> None:
        """One decision-log event for a connection's traffic since its last summary (pass-through included)."""
        if self.log is None:
            return
        counts = conn.traffic.take()
        if counts is None:
            return
        requests, bytes_in, bytes_out = counts
        self.log.emit(
            summary_event(
                ts_ms=round(self._wall_clock() * 1000),
                conn=conn.id,
                user=conn.identity.principal,
                client_id=conn.client_id,
                requests=requests,
                bytes_in=bytes_in,
                bytes_out=bytes_out,
                shadow=shadow,
                scope=scope,
            )
        )

    def log_stats(self) -> dict[str, int]:
        return dict(self.log.stats()) if self.log is not None else {}

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def _fair_columns(d: Decision) -> dict[str, Any] | None:
    """A held request's fair-share columns: the broker, its limit and the tenant's share when it was held."""
    t = d.state.fair
    if t is None:
        return None
    b = t.broker
    return {"fair_broker": b.key, "fair_limit": b.limit, "fair_level": b.level, "fair_delay_ms": b.q}


def open_decision_log(config: ProxyConfig) -> EventSink | None:
    """The decision log the configuration asks for (a directory, a topic or both), or None when it is off."""
    dc = config.decision_log
    if dc.directory is None and dc.topic is None:
        return None
    from proxy.decision_log.topic import TopicSink
    from proxy.decision_log.writer import DecisionLog  # pyarrow is loaded only when the log is on

    member = config.fleet.member if config.fleet.name else None
    instance = dc.instance or member or f"{socket.gethostname()}-{os.getpid()}"
    topic = None
    if dc.topic is not None:
        topic = TopicSink(dc.topic, dc.bootstrap_servers or config.upstream.bootstrap_servers, instance, dc.client)
    try:
        return DecisionLog(
            dc.directory,
            instance,
            topic=topic,
            max_queue=dc.max_queue,
            rotate_seconds=dc.rotate_seconds,
            rotate_bytes=dc.rotate_bytes,
            fmt=dc.format,
        )
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(
            f"decision_log.directory {dc.directory}: cannot write the decision log there ({type(exc).__name__}: {exc})"
        ) from None
