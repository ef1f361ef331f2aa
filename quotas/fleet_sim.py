"""A fleet of lease holders over one simulated log, for the property tests and ``bench.fleet_scale``.

Pure: a discrete clock, records delayed or lost as told, no I/O. Every member writes :class:`LeaseRecord` s with
its own :class:`LeaseHolder` (on its own, possibly skewed, clock); the log is ordered by when each record lands;
one :class:`LeaseBook` takes them in that order (every member's book would compute the same, so one stands for
all) and each member reads its own record back a read delay after it landed. Clients are modelled as a rate of
demand per member and bucket: a member admits min(demand, share) (smooth enforcement's pacing, at the step's
resolution), or with ``kafka`` Kafka's windowed rate and mute per member.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quotas.fleet_leases import LEASE_MS, Grant, LeaseBook, LeaseHolder, LeaseRecord
from quotas.rate import SampledRate, byte_rate_throttle_ms


@dataclass
class SimMember:
    name: str
    holder: LeaseHolder
    skew_ms: int = 0
    phase_ms: int = 0
    alive: bool = True
    died_ms: int | None = None


@dataclass
class FleetSim:
    quotas: dict[int, float]
    """Lease id -> quota."""
    members: list[SimMember]
    interval_ms: int = 250
    step_ms: int = 10
    write_delay: Callable[[random.Random], int | None] = lambda rng: 20
    """ms from a member's write to its record landing in the log; None: lost."""
    read_delay: Callable[[random.Random], int] = lambda rng: 20
    """ms from a record landing to its writer reading it back."""
    seed: int = 0
    lease_ms: int = LEASE_MS
    book: LeaseBook = field(init=False)
    now: int = 0
    landed: dict[int, list[float]] = field(default_factory=dict)
    """Lease id -> amount admitted per step, over the fleet."""
    max_ratio: float = 0.0
    """The largest sum of enforced shares over a quota, at any step and bucket (from ``check_from_ms`` on)."""
    check_from_ms: int = 0
    _rng: random.Random = field(init=False)
    _landing: list[tuple[int, int, LeaseRecord]] = field(default_factory=list)
    _reading: list[tuple[int, int, str, LeaseRecord, Grant, int]] = field(default_factory=list)
    _seq: int = 0
    _usage: dict[str, dict[int, float]] = field(default_factory=dict)
    _held: dict[str, dict[int, int]] = field(default_factory=dict)
    kafka: bool = False
    """Kafka's enforcement (a windowed rate and a mute per member) instead of smooth pacing."""
    _rates: dict[tuple[str, int], SampledRate] = field(default_factory=dict)
    _muted: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        if self.kafka:
            for m in self.members:
                m.holder.window_ms = 11_000
        self.book = LeaseBook(self.interval_ms)
        self.landed = {lid: [] for lid in self.quotas}

    def shares(self, now: int | None = None) -> dict[str, dict[int, float]]:
        """The share every live member holds now, per bucket."""
        t = self.now if now is None else now
        return {
            m.name: {lid: m.holder.raw_share(lid, q, t + m.skew_ms) for lid, q in self.quotas.items()}
            for m in self.members
            if m.alive
        }

    def run(self, until_ms: int, demand: Callable[[int, str, int], float]) -> None:
        """Advance to ``until_ms``; ``demand(now, member, lid)``: what the member's clients would send (per s)."""
        rng = self._rng
        byname = {m.name: m for m in self.members}
        while self.now < until_ms:
            now = self.now
            # records landing now, in landing order: the book takes them
            while self._landing and self._landing[0][0] <= now:
                _t, _s, rec = heapq.heappop(self._landing)
                grant = self.book.take(rec)
                if grant is None:  # stale: a later record of its writer was taken first
                    continue
                for m in self.members:  # no lease yet (or any more): the equal split among the members in the book
                    g = m.holder.grant
                    if g is None or now + m.skew_ms >= g.until_ms:
                        m.holder.members_seen = self.book.live() + (m.name not in self.book.members)
                self._seq += 1
                heapq.heappush(
                    self._reading,
                    (now + self.read_delay(rng), self._seq, rec.member, rec, grant, self.book.live()),
                )
            while self._reading and self._reading[0][0] <= now:
                _t, _s, name, rec, grant, live = heapq.heappop(self._reading)
                m = byname[name]
                if m.alive:
                    m.holder.read_back(rec, grant, live, now + m.skew_ms)
            # clients: each member admits min(demand, share)
            totals = dict.fromkeys(self.quotas, 0.0)
            landed_now = dict.fromkeys(self.quotas, 0.0)
            for m in self.members:
                if not m.alive:
                    continue
                local = now + m.skew_ms
                usage = self._usage.setdefault(m.name, {})
                for lid, q in self.quotas.items():
                    share = m.holder.share(lid, q, local)  # (with kafka: its average over the window)
                    totals[lid] += m.holder.raw_share(lid, q, local)
                    d = demand(now, m.name, lid)
                    if d <= 0:
                        continue
                    if self.kafka:
                        amount = self._kafka_step(m.name, lid, d, share, now)
                    else:
                        amount = min(d, share) * self.step_ms / 1000
                        if d > share:  # paced: its clients wait
                            self._held.setdefault(m.name, {})[lid] = self.step_ms
                    landed_now[lid] += amount
                    usage[lid] = usage.get(lid, 0.0) + amount
                if (now - m.phase_ms) % self.interval_ms == 0:
                    m.holder.observe(
                        {lid: (a, self.quotas[lid]) for lid, a in usage.items()}, local, self._held.pop(m.name, None)
                    )
                    usage.clear()
                    if m.holder.due(local):
                        rec = m.holder.record(local)
                        delay = self.write_delay(rng)
                        if delay is not None:
                            self._seq += 1
                            heapq.heappush(self._landing, (now + max(0, delay), self._seq, rec))
            for lid, q in self.quotas.items():
                if now >= self.check_from_ms:
                    self.max_ratio = max(self.max_ratio, totals[lid] / q)
                self.landed[lid].append(landed_now[lid])
            self.now += self.step_ms

    def _kafka_step(self, name: str, lid: int, d: float, share: float, now: int) -> float:
        """Kafka's enforcement of the member's share: its clients send a step's worth of their demand unless
        muted; each request is recorded in an 11 x 1 s windowed rate, and one over the share mutes the client
        for Kafka's throttle time (``quotas.rate``)."""
        key = (name, lid)
        if now < self._muted.get(key, 0):
            return 0.0
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = SampledRate(11, 1000)
        amount = d * self.step_ms / 1000
        observed, window = rate.record_and_measure(amount, now)
        if observed > share:
            throttle = byte_rate_throttle_ms(observed, share, window)
            self._muted[key] = now + throttle
            self._held.setdefault(name, {})[lid] = throttle
        return amount

    def kill(self, name: str) -> None:
        for m in self.members:
            if m.name == name:
                m.alive = False
                m.died_ms = self.now

    def leave(self, name: str) -> None:
        """The member stops as a proxy does (``FleetMember.stop``): it admits nothing more, then writes its
        farewell record (:meth:`LeaseHolder.farewell`), delayed or lost like any other."""
        for m in self.members:
            if m.name == name and m.alive:
                self.kill(name)
                rec = m.holder.farewell(self.now + m.skew_ms)
                delay = self.write_delay(self._rng)
                if delay is not None:
                    self._seq += 1
                    heapq.heappush(self._landing, (self.now + max(0, delay), self._seq, rec))

    def rate(self, lid: int, start_ms: int, end_ms: int) -> float:
        """The fleet's admitted rate of a bucket between two times, as a part of its quota."""
        xs = self.landed[lid][start_ms // self.step_ms : end_ms // self.step_ms]
        return float(np.sum(xs)) / ((end_ms - start_ms) / 1000) / self.quotas[lid]


def fleet(
    n: int,
    quotas: dict[int, float],
    seed: int = 0,
    skew_ms: int = 0,
    fallback: str = "zero",
    **kwargs: Any,
) -> FleetSim:
    """``n`` members with phases spread over an interval and clocks skewed by up to ``skew_ms`` either way."""
    rng = random.Random(seed)
    interval = kwargs.get("interval_ms", 250)
    step = kwargs.get("step_ms", 10)
    members = [
        SimMember(
            f"m{i:03d}",
            LeaseHolder(
                f"m{i:03d}",
                lease_ms=kwargs.get("lease_ms", LEASE_MS),
                fallback=fallback,
                interval_ms=interval,
            ),
            skew_ms=rng.randint(-skew_ms, skew_ms),
            phase_ms=step * rng.randrange(max(1, interval // step)),
        )
        for i in range(n)
    ]
    return FleetSim(quotas, members, seed=seed, **kwargs)
