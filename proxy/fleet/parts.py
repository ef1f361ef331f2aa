"""What a fleet member shares with the policy, built once at start (quota scope ``fleet``).

Why a module of its own: the policy's quota manager must enforce the member's lease (its store resolves shares),
record every charge for the other members (its ledger) and publish every quota alter (the sources' outbox), and the
fleet's sync (``proxy.fleet.member.FleetSync``) reads and feeds the same three. Built here first and handed to both
through their constructors, nothing reaches into another object after it is built to wire it (issue 49).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from config.model import ProxyConfig
from protocol.topic_guard import RESERVED_PREFIX
from quotas.entities import QuotaEntity, QuotaStore
from quotas.fleet_leases import LeasedStore, LeaseHolder
from quotas.fleet_reports import FleetLedger
from quotas.manager import Windows

log = logging.getLogger(__name__)

MAX_PENDING_ALTERS = 10_000
"""Quota alters kept for publishing while the fleet's topic is unreachable (a quota change must not be lost,
unlike usage), at most."""

Alter = tuple[QuotaEntity, dict[str, float | None]]


def wall_ms() -> int:
    """The lease records' clock: a wall clock, compared across hosts (within ``quotas.fleet_leases.SKEW_MS``)."""
    return time.time_ns() // 1_000_000


def topic_name(fleet: str) -> str:
    """The fleet's usage topic; its quota topic adds ``_quotas``. In the proxy's namespace, so no client of any
    member can name either (``protocol.topic_guard``)."""
    return f"{RESERVED_PREFIX}fleet_{fleet}"


def member_name(config: ProxyConfig, worker: int | None) -> str:
    """This process's name in the fleet: ``fleet.member`` (with its worker index: a host's workers are members of
    their own), else host and pid."""
    fc = config.fleet
    if fc.member:
        return fc.member + (f"-w{worker}" if worker is not None else "")
    return f"{socket.gethostname()}-{os.getpid()}"


class AlterOutbox:
    """Quota alters made on this member, waiting for the fleet's sync to publish them (bounded)."""

    __slots__ = ("queue", "topic")

    def __init__(self, topic: str, maxsize: int = MAX_PENDING_ALTERS) -> None:
        self.topic = topic
        self.queue: asyncio.Queue[Alter] = asyncio.Queue(maxsize=maxsize)

    def altered(self, entity: QuotaEntity, layer: dict[str, float | None]) -> None:
        """``config.quota_sources.QuotaSources``' hook, on the event loop: queue the entity's new layer for every
        member. Past the bound the alter stays local, and says so."""
        try:
            self.queue.put_nowait((entity, layer))
        except asyncio.QueueFull:
            log.warning(
                "fleet %s: %d quota alters waiting for the topic; the alter of %s stays local to this member",
                self.topic,
                self.queue.qsize(),
                entity,
            )


@dataclass(frozen=True, slots=True)
class FleetParts:
    """The member's lease holder, ledger and alter outbox, and the wall clock its leases run on."""

    member: str
    holder: LeaseHolder
    ledger: FleetLedger
    alters: AlterOutbox
    wall_ms: Callable[[], int]

    def leased(self, store: QuotaStore) -> LeasedStore:
        """The store the member's quota manager resolves through: every quota replaced by this member's share."""
        return LeasedStore(store, self.holder, self.wall_ms)


def fleet_parts(
    config: ProxyConfig, worker: int | None = None, clock: Callable[[], int] = wall_ms
) -> FleetParts | None:
    """The parts for quota scope ``fleet`` (None for any other scope: no lease, ledger or outbox). Restart-only, as
    the scope is (config.reload)."""
    fc = config.fleet
    if config.quotas.scope != "fleet" or fc.name is None:  # (the configuration requires a name with scope fleet)
        return None
    member = member_name(config, worker)
    window_ms = 0
    if config.quotas.enforcement == "kafka":  # the limit is the share's average over the rate window
        rate = Windows.from_settings(config.quotas.model_dump()).rate
        window_ms = rate.samples * rate.size_ms
    holder = LeaseHolder(member, interval_ms=fc.sync_interval_ms, window_ms=window_ms)
    return FleetParts(member, holder, FleetLedger(), AlterOutbox(topic_name(fc.name) + "_quotas"), clock)
