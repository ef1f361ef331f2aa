"""Quota scope ``fleet`` with leases (issue 39): each member holds a share of every quota, and the shares the members
enforce never add up to more than the quota.

Pure policy, no I/O, no clock (time comes in as ms). ``proxy/fleet/member.py`` carries the records over the
fleet's topic and hands them to :class:`LeaseBook` in the topic's order.

Why leases and not shared usage: with usage folding, a member compares the fleet's usage, as it saw it one sync
ago, against the whole quota; N members each spend the same headroom before the others hear of it, an error of
about (N - 1) x delay / window that grows with the fleet (BENCHMARKS.md, "Fleet at scale"). With a lease a member
never spends what it has not been given, whatever the delay: the delay only slows how fast shares follow demand.

The scheme (docs/fleet.md, "Leases", has the derivation):

- Every ``sync_interval_ms`` a member writes one :class:`LeaseRecord`: per bucket its quota, its *demand* (its
  recent usage with some headroom, or the whole quota while it is held at its share: "wants more") and its *hold*
  (the share it enforces now).
- Every member reads the one-partition topic in the same order and runs the same :class:`LeaseBook` over it, so
  at every position of the log every member computes the same state; no allocator is elected.
- Targets: at each epoch boundary (the first record whose timestamp enters a new interval) the book divides each
  bucket's quota max-min fairly (:func:`max_min_fair`) among the live members, by the demands of their latest
  records, after a floor for each (so an idle member can start at once).
- Shares: when the book takes member m's record, m's share of each bucket is min(its target (at most what the
  record demands, its floor at least), quota - the caps of all the others); m takes them (a grant) only from its
  *own* record, once it has read it back.
- Caps: the most m may enforce until its next record is taken: cap = max(hold, share, floor, and the unclaimed
  share its record states on the buckets the grant it holds does not name). The caps of every live member on
  every bucket add up in ``total``. So a share is only ever raised into what the others' caps leave, and every
  other member's cap bounds what it enforces: the shares enforced at any instant add up to at most the quota (the
  argument in docs/fleet.md).
- Unclaimed shares: a bucket the book does not hold (nobody holds more than a floor of it) is split equally: each
  grant carries u = min(1 / live members, 1 - the others' unclaimed caps), enforced on every bucket it does not
  name, so a first burst is served at quota / N at once. A bucket leaves the book only once every cap on it is a
  floor.
- Leases expire: a member enforces a grant at most the lease its record asked for (1-4 s, by its round trips)
  after that record's timestamp (its own clock); the book drops a member whose latest record is its lease +
  ``skew_ms`` older than a boundary, so a dead member's share returns one lease (plus the clock skew allowed
  between hosts) after its last record.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from quotas.entities import BucketKey, QuotaStore, Resolved
from quotas.fleet_reports import MAX_MEMBER_BYTES, MAX_REPORT_BYTES, ReportError, bucket_id, member_id

LEASE_MS = 4_000
"""The longest lease a member asks for: how long a grant may be enforced after the record it came from was written
(the writer's clock); a dead member's share returns this (plus :data:`SKEW_MS`) after its last record. A member asks
for less when its records come back quickly (:meth:`LeaseHolder.lease_for`): a grant must outlive two record delays
and an interval (a member writes its next record at the tick after the last is back), so slow records need up to
this (p99 up to 1.45 s measured at 100 members on a loaded host; with 2 s, grants ran out between records there
and the fleet used 80 % of the quota), while on a quick cluster a dead member's share comes back within ~1.5 s."""
MIN_LEASE_MS = 1_000
"""The shortest lease a member asks for (an interval and a margin for a stall of the loop or a collection)."""
LEASE_ROUND_TRIPS = 4
"""A member's lease: an interval and this many times its slowest record round trip (written to read back) of
the last :data:`ROUND_TRIPS_KEPT`, within [:data:`MIN_LEASE_MS`, :data:`LEASE_MS`]."""
ROUND_TRIPS_KEPT = 64
SKEW_MS = 250
"""The clock difference allowed between two members' hosts (NTP keeps it to milliseconds): the book drops a member
this long after its own lease has run out by its clock."""
FLOOR_FRACTION = 0.05
"""Part of each quota set aside as every live member's floor (split among them equally): a member with no
demand still holds floor x quota / members and admits a new client at once at that rate, while its demand
travels."""
HUNGRY = 0.9
"""A member whose recent usage is at least this part of its share is held back by it: its demand is the whole
quota (it gets what max-min fairness gives it)."""
HEADROOM = 1.25
"""Demand of a member not held back: its recent usage times this (room to grow before it is held back)."""
MIN_SHARE = 1e-6
"""Smallest share enforced, as a part of the quota (the throttle formulas divide by the limit)."""
USAGE_TAU_MS = 250.0
"""Time constant of the usage a member's demand is computed from (an exponential average)."""

FAREWELL_LEASE_MS = 1
"""The lease a member's last record asks for when it stops (:meth:`LeaseHolder.farewell`): the shortest a record
may state, so the book drops it at the first epoch boundary after :data:`SKEW_MS`, not a whole lease later."""
MAX_LEASE_MS = 10_000
"""The longest lease a record may state (the book keeps the buckets of every epoch a live grant may come from)."""
NO_EPOCH = -(1 << 62)
"""A record's ``grant_epoch`` when its writer holds no live grant."""

MAGIC = b"KTL\x02"
"""Lease record, format 2 (on the fleet's usage topic; usage reports start ``KTP``). Format 1 had no unclaimed
share, grant epoch nor lease length."""
_HEAD = struct.Struct("<4sqIIHdqI")  # magic, ts_ms, members seen, entries, member length, unclaimed, epoch, lease
_IDS = np.dtype("<u8")
_F8 = np.dtype("<f8")
MAX_LEASE_ENTRIES = 30_000
"""Buckets per lease record at most (32 bytes each: within :data:`MAX_REPORT_BYTES`)."""


def max_min_fair(quota: np.ndarray, demand: np.ndarray, floor_fraction: float = FLOOR_FRACTION) -> np.ndarray:
    """Divide each row's quota among the row's members (columns) by their demand, max-min fairly, after a floor.

    Every member first gets ``floor_fraction x quota / members``; the rest is water-filled over what each wants
    beyond its floor (no member gets more than it wants while another wants more than it has); what nobody
    wants is split equally (spare capacity a member may grow into without waiting). Each row sums to its quota
    (up to rounding, never above: the level is rounded down). ``quota``: shape (B,), ``demand``: (B, M)."""
    b, m = demand.shape
    if m == 0 or b == 0:
        return np.zeros((b, m))
    floor = quota * (floor_fraction / m)
    rest = quota - floor * m
    want = np.maximum(demand - floor[:, None], 0.0)
    want = np.minimum(want, rest[:, None])
    s = np.sort(want, axis=1)
    before = np.concatenate([np.zeros((b, 1)), np.cumsum(s, axis=1)[:, :-1]], axis=1)
    level = (rest[:, None] - before) / (m - np.arange(m))[None, :]
    short = level < s  # from the first such k on, members get the level, not what they want
    any_short = short.any(axis=1)
    k = np.argmax(short, axis=1)
    lam = np.where(any_short, level[np.arange(b), k], np.inf) * (1 - 1e-12)
    got = np.minimum(want, lam[:, None])
    spare = np.where(any_short, 0.0, rest - got.sum(axis=1)) * (1 - 1e-12)
    wanting = demand > 0
    count = wanting.sum(axis=1)
    per = np.where(count > 0, np.maximum(spare, 0.0) / np.maximum(count, 1), 0.0)
    out: np.ndarray = floor[:, None] + got + per[:, None] * wanting
    return out


@dataclass(slots=True)
class LeaseRecord:
    """One member's lease state as it writes it: per bucket (lease id) the quota it applies, its demand and the
    share it enforces now (its hold). ``members``: how many members its floors are divided by. ``unclaimed``: the
    part of a quota it enforces now on a bucket its grant does not name (``grant_epoch``: the book's epoch that
    grant was computed in, whose buckets it names; :data:`NO_EPOCH` without a live grant). ``lease_ms``: how long
    a grant from this record may be enforced after ``ts_ms``."""

    member: str
    ts_ms: int
    members: int
    ids: np.ndarray
    quota: np.ndarray
    demand: np.ndarray
    hold: np.ndarray
    unclaimed: float = 0.0
    grant_epoch: int = NO_EPOCH
    lease_ms: int = LEASE_MS

    def encode(self) -> bytes:
        member = self.member.encode()[:MAX_MEMBER_BYTES]
        order = np.argsort(self.ids, kind="stable")
        return b"".join(
            (
                _HEAD.pack(
                    MAGIC,
                    self.ts_ms,
                    self.members,
                    len(self.ids),
                    len(member),
                    self.unclaimed,
                    self.grant_epoch,
                    self.lease_ms,
                ),
                member,
                np.ascontiguousarray(self.ids[order], dtype=_IDS).tobytes(),
                np.ascontiguousarray(self.quota[order], dtype=_F8).tobytes(),
                np.ascontiguousarray(self.demand[order], dtype=_F8).tobytes(),
                np.ascontiguousarray(self.hold[order], dtype=_F8).tobytes(),
            )
        )

    @staticmethod
    def decode(data: bytes) -> LeaseRecord:
        if len(data) > MAX_REPORT_BYTES or len(data) < _HEAD.size:
            raise ReportError(f"lease record of {len(data)} bytes is malformed")
        magic, ts_ms, members, n, mlen, unclaimed, grant_epoch, lease_ms = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise ReportError(f"lease record version {magic!r} is not {MAGIC!r}")
        if not 0.0 <= unclaimed <= 1.0 or not 0 < lease_ms <= MAX_LEASE_MS:
            raise ReportError(f"lease record is malformed (unclaimed {unclaimed}, lease {lease_ms} ms)")
        pos = _HEAD.size + mlen
        if n > MAX_LEASE_ENTRIES or pos + 32 * n != len(data) or members < 1:
            raise ReportError(f"lease record is malformed ({n} entries in {len(data)} bytes)")
        member = member_id(data, _HEAD.size, pos, "lease record")
        ids = np.frombuffer(data, _IDS, n, pos)
        arrays = [np.frombuffer(data, _F8, n, pos + 8 * n * (i + 1)) for i in range(3)]
        if n and not all(((a >= 0) & (a < np.inf)).all() for a in arrays):
            raise ReportError("lease record has an amount that is not finite and >= 0")
        if n > 1 and not (ids[1:] > ids[:-1]).all():
            raise ReportError("lease record's buckets are not sorted and distinct")
        quota, demand, hold = arrays
        return LeaseRecord(member, ts_ms, members, ids, quota, demand, hold, unclaimed, grant_epoch, lease_ms)


@dataclass(slots=True)
class _Held:
    """What the book knows of one live member: its latest record and its caps."""

    ts_ms: int
    lease_ms: int
    floor_ratio: float
    """floor_fraction / the members its record divides floors by: its floor on a bucket it has no grant on, once
    this record is read back."""
    cap_ratio: float
    """The larger of that and its previous record's: the floor it may use until this record is read back."""
    ucap: float
    """The most it may enforce, as a part of the quota, on a bucket the book does not hold (its floor, the
    unclaimed share its record states and the one the grant from its record gives), until its next record."""
    ids: np.ndarray
    """Sorted lease ids it has caps on (its record's and the boundary's buckets)."""
    caps: np.ndarray
    above: np.ndarray
    """Per bucket of ``ids``: whether its cap is above its floor (the book then keeps the bucket)."""
    demand_ids: np.ndarray
    demand: np.ndarray
    quota: np.ndarray
    """The quota its record applies to each of ``demand_ids``."""
    hold: np.ndarray


@dataclass(slots=True)
class Grant:
    """A member's grants from one of its own records: shares per lease id, enforceable until ``until_ms``."""

    ids: np.ndarray
    shares: np.ndarray
    quota: np.ndarray
    """The quota the book divided, per lease id."""
    until_ms: int
    floor_ratio: float
    """Its floor, as a part of a quota (what it lowers an unused share to)."""
    unclaimed: float = 0.0
    """Its share, as a part of the quota, of any bucket ``ids`` does not name (no member holds more than its floor
    of it): the unclaimed quota split among the live members, so a client's first burst is served at once."""
    epoch: int = NO_EPOCH
    """The book's epoch it was computed in (``ids`` are that epoch's buckets)."""


def _named(ids: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Per id of ``ids``: whether the sorted ``among`` has it."""
    if not len(among) or not len(ids):
        return np.zeros(len(ids), dtype=bool)
    at = np.minimum(np.searchsorted(among, ids), len(among) - 1)
    named: np.ndarray = among[at] == ids
    return named


@dataclass
class LeaseBook:
    """The deterministic state every member computes from the fleet's records, taken in the topic's order."""

    interval_ms: int
    skew_ms: int = SKEW_MS
    floor_fraction: float = FLOOR_FRACTION
    members: dict[str, _Held] = field(default_factory=dict)
    epoch: int = -(1 << 62)
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=_IDS))
    """The boundary's buckets (sorted): those some live member demanded or has a cap above its floor on."""
    quota: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Per bucket: the least quota the demanding members applied."""
    order: dict[str, int] = field(default_factory=dict)
    """Member -> column of :attr:`targets` (the members live at the boundary)."""
    targets: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    dense: dict[str, np.ndarray] = field(default_factory=dict)
    """Member -> its caps over :attr:`ids` (a floor where it has none)."""
    total: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Per bucket of :attr:`ids`: the sum of every live member's cap."""
    utotal: float = 0.0
    """The sum of every live member's :attr:`_Held.ucap`: what they may enforce of a bucket the book does not hold."""
    history: dict[int, np.ndarray] = field(default_factory=dict)
    """Epoch -> its buckets (:attr:`ids` then), for the epochs a live grant may come from: a record names the epoch
    of the grant its writer enforces, and that grant's unclaimed share applies to every bucket not among them."""
    boundaries: int = 0

    # -------------------------------------------------------------------------------------------- taking

    def take(self, rec: LeaseRecord, grant: bool = True) -> Grant | None:
        """Take one record, in the topic's order; returns the grants its writer takes when it reads it back
        (``grant`` False: None; a member computes only its own, the others' caps are all the book needs). A
        record older than its writer's latest one taken is ignored (None)."""
        prev = self.members.get(rec.member)
        if prev is not None and rec.ts_ms <= prev.ts_ms:
            # Older than the member's latest record (it came late, after one its writer wrote later, e.g. a
            # retried send): stale, what its writer holds is in the later one. No grant: its writer took it lost.
            return None
        epoch = rec.ts_ms // self.interval_ms
        if epoch > self.epoch:
            self._boundary(rec.ts_ms)
            self.epoch = epoch
            self.history[epoch] = self.ids
            oldest = epoch - (MAX_LEASE_MS + 4 * self.skew_ms) // self.interval_ms - 2
            for e in [e for e in self.history if e < oldest]:
                del self.history[e]
        floor_ratio = self.floor_fraction / max(1, rec.members)
        prev = self.members.get(rec.member)  # (again: the boundary may have dropped it)
        # Until this record is read back its writer still uses the floor of its previous one.
        cap_ratio = floor_ratio if prev is None else max(floor_ratio, prev.floor_ratio)
        # The unclaimed share it takes from this record: an equal part of the quota, as far as the others' caps on
        # a bucket the book does not hold leave it (a member joining gets its part as the others give theirs up).
        others_u = self.utotal - (prev.ucap if prev is not None else 0.0)
        live = len(self.members) + (prev is None)
        unclaimed = max(0.0, min(1.0 / live, 1.0 - others_u) * (1 - 1e-12))
        stated = min(1.0, rec.unclaimed)
        ucap = max(cap_ratio, stated, unclaimed)
        self.utotal = others_u + ucap
        col = self.order.get(rec.member)
        ids = self.ids
        target = self.targets[:, col] if col is not None and len(ids) else np.zeros(len(ids))
        floor_share = floor_ratio * self.quota
        floor_cap = cap_ratio * self.quota
        old = self.dense.get(rec.member)
        others = self.total - old if old is not None else self.total
        # Its record's holds and demands, on the boundary's buckets and on those new since (fast path: the same
        # buckets). Its target is at most what this record demands (its floor at least): the boundary divided by
        # its previous demand, and a member whose demand fell holds no more than it wants from this record on (it
        # lowered itself so when writing it), so its cap falls a record sooner and a demand shift is followed
        # sooner. Its share: the target, as far as the others' caps leave it. Its cap counts the share itself, not
        # the target: the share is what it enforces once this record is back, and a target the others' caps cut
        # would, counted whole, cut the next member's share for nothing (to nothing, once: a throttle for ever).
        if len(rec.ids) == len(ids) and np.array_equal(rec.ids, ids):
            target = np.maximum(np.minimum(target, rec.demand), floor_share)
            shares = np.clip(np.minimum(target, self.quota - others), 0.0, None)
            cap_dense = np.maximum(np.maximum(rec.hold, shares), floor_cap)
            new_ids = new_caps = None
        else:
            where = np.searchsorted(ids, rec.ids)
            where = np.minimum(where, max(0, len(ids) - 1))
            known = (ids[where] == rec.ids) if len(ids) else np.zeros(len(rec.ids), dtype=bool)
            hold_dense = np.zeros(len(ids))
            hold_dense[where[known]] = rec.hold[known]
            wants = np.zeros(len(ids))
            wants[where[known]] = rec.demand[known]
            target = np.maximum(np.minimum(target, wants), floor_share)
            shares = np.clip(np.minimum(target, self.quota - others), 0.0, None)
            cap_dense = np.maximum(np.maximum(hold_dense, shares), floor_cap)
            new_ids = rec.ids[~known]
            # (once this record is back it holds the unclaimed share of a bucket the book does not hold)
            new_caps = np.maximum(rec.hold[~known], max(cap_ratio, unclaimed) * rec.quota[~known])
        # Until this record is read back, it enforces the unclaimed share it states on every bucket the grant it
        # holds does not name (the buckets of that grant's epoch; every bucket when that epoch is unknown here).
        named = self.history.get(rec.grant_epoch)
        if named is not ids and stated > cap_ratio and len(ids):
            unnamed = ~_named(ids, named) if named is not None else np.ones(len(ids), dtype=bool)
            np.maximum(cap_dense, np.where(unnamed, stated * self.quota, 0.0), out=cap_dense)
        above = cap_dense > floor_cap * (1 + 1e-9)
        if new_ids is None or new_caps is None:
            all_ids, all_caps = ids, cap_dense
        else:
            all_ids = np.concatenate([ids, new_ids])
            all_caps = np.concatenate([cap_dense, new_caps])
            above = np.concatenate([above, np.ones(len(new_ids), dtype=bool)])
            sort = np.argsort(all_ids, kind="stable")
            all_ids, all_caps, above = all_ids[sort], all_caps[sort], above[sort]
        total = self.total
        if old is not None:
            total -= old
        total += cap_dense  # (in place: the boundary made it, nobody else holds it)
        self.dense[rec.member] = cap_dense
        lease_ms = min(rec.lease_ms, MAX_LEASE_MS)
        self.members[rec.member] = _Held(
            rec.ts_ms,
            lease_ms,
            floor_ratio,
            cap_ratio,
            ucap,
            all_ids,
            all_caps,
            above,
            rec.ids,
            rec.demand,
            rec.quota,
            rec.hold,
        )
        if not grant:
            return None
        return Grant(ids.copy(), shares, self.quota.copy(), rec.ts_ms + lease_ms, floor_ratio, unclaimed, self.epoch)

    def _boundary(self, now_ms: int) -> None:
        """A new epoch: drop the members whose lease has run out, then new buckets, quotas, targets and caps."""
        self.boundaries += 1
        dead = [m for m, h in self.members.items() if now_ms - h.ts_ms > h.lease_ms + self.skew_ms]
        for m in dead:
            del self.members[m]
        names = sorted(self.members)
        self.order = {m: i for i, m in enumerate(names)}
        held = [self.members[m] for m in names]
        self.utotal = sum(h.ucap for h in held)
        # The buckets some member demands, holds more than its floor of, or may enforce more than its floor of (its
        # cap: a grant it has not read back yet, an unclaimed share). Only then may the book forget a bucket: every
        # member enforces at most its floor of it, so the unclaimed shares given out from now on are counted in
        # full. Fast path (a steady fleet): every member's record and caps name exactly the last boundary's
        # buckets, so no sets are merged nor searched.
        prev = self.ids
        wanted = [(h.demand > 0) | (h.hold > h.floor_ratio * h.quota * (1 + 1e-9)) for h in held]
        aligned = [
            len(h.demand_ids) == len(prev)
            and (h.ids is prev or (len(h.ids) == len(prev) and np.array_equal(h.ids, prev)))
            and np.array_equal(h.demand_ids, prev)
            for h in held
        ]
        if held and all(aligned):
            keep = np.logical_or.reduce([w | h.above for w, h in zip(wanted, held, strict=True)])
            keep = keep if len(prev) else np.zeros(0, dtype=bool)
            ids = prev if keep.all() else prev[keep]
        else:
            keep = None
            listed = [h.demand_ids[w] for h, w in zip(held, wanted, strict=True)]
            listed += [h.ids[h.above] for h in held]
            ids = np.unique(np.concatenate(listed)).astype(_IDS) if listed else np.empty(0, dtype=_IDS)
            if len(ids) == len(prev) and np.array_equal(ids, prev):
                ids = prev  # (the same object: a record naming this epoch's grant needs no search)
        b, width = len(ids), len(names)
        if keep is not None and width:
            dem = np.stack([np.minimum(h.demand, h.quota) for h in held], axis=1)[keep]
            quota = np.min(np.stack([h.quota for h in held], axis=1)[keep], axis=1)
            demand = dem
        else:
            quota = np.full(b, np.inf)
            demand = np.zeros((b, width))
            for j, h in enumerate(held):
                if not len(h.demand_ids) or not b:
                    continue
                at = np.searchsorted(ids, h.demand_ids)
                ok = at < b
                ok[ok] = ids[at[ok]] == h.demand_ids[ok]
                demand[at[ok], j] = np.minimum(h.demand[ok], h.quota[ok])
                np.minimum.at(quota, at[ok], h.quota[ok])
            unlisted = ~np.isfinite(quota)
            if unlisted.any():  # kept for a cap alone: the quota it was divided by (it was in the book)
                in_prev = _named(ids, prev)
                at = np.minimum(np.searchsorted(prev, ids), max(0, len(prev) - 1))
                quota[unlisted & in_prev] = self.quota[at[unlisted & in_prev]] if len(prev) else 0.0
            quota[~np.isfinite(quota)] = 0.0
        self.ids, self.quota = ids, quota
        self.targets = max_min_fair(quota, demand, self.floor_fraction)
        self.dense = {}
        total = np.zeros(b)
        for name, h in zip(names, held, strict=True):
            # a bucket new to it: its floor, or the unclaimed share it may enforce of a bucket the book did not hold
            caps = max(h.cap_ratio, h.ucap) * quota
            if len(h.ids) == b and (h.ids is ids or np.array_equal(h.ids, ids)):
                caps = np.maximum(h.cap_ratio * quota, h.caps)
            elif len(h.ids) and b:
                at = np.searchsorted(h.ids, ids)
                ok = at < len(h.ids)
                ok[ok] = h.ids[at[ok]] == ids[ok]
                caps[ok] = np.maximum(h.cap_ratio * quota[ok], h.caps[at[ok]])
            self.dense[name] = caps
            total += caps
        self.total = total

    def live(self) -> int:
        return len(self.members)


class LeaseHolder:
    """A member's own side: the shares it enforces (from its latest own record read back), its demand meter and
    what it writes next. Time passed in; no I/O.

    One record in flight at a time: a member writes its next record only once it has read its last one back (or
    after :attr:`lost_ms`, when that one counts as lost), and takes a grant only from the newest record it wrote.
    Why: a record states the hold the member enforces until that record is read back; were a grant taken from an
    older record while a newer one is on its way, the newer one would state a hold the member no longer keeps."""

    def __init__(
        self,
        member: str,
        lease_ms: int = LEASE_MS,
        floor_fraction: float = FLOOR_FRACTION,
        fallback: str = "split",
        interval_ms: int = 250,
        window_ms: int = 0,
    ) -> None:
        self.member = member
        self.interval_ms = interval_ms
        """How often it observes its usage (the first observation counts as that long)."""
        self.lease_ms = lease_ms
        """The longest lease it asks for (:meth:`lease_for`)."""
        self.lost_ms = lease_ms // 2
        self.round_trips: deque[int] = deque(maxlen=ROUND_TRIPS_KEPT)
        """Its last records' round trips (ms from writing to reading back; a lost one as :attr:`lost_ms`)."""
        self.floor_fraction = floor_fraction
        self.fallback = fallback
        """What it enforces without a live lease: "split", quota / members (cut off from the topic: the others
        stop counting it a lease later, so up to that much more per member cut off); "floor", its floor
        (connected: before its first record is back, uncounted for ~0.2 s, or its records late, counted by the
        book while they land; uncounted only for a member whose records are a lease late); "zero", the minimum
        share (strict, for the tests; a throttle against it would be endless)."""
        self.grant: Grant | None = None
        self.shares: dict[int, float] = {}
        self.usage: dict[int, float] = {}
        """Lease id -> exponential average of its usage rate (per second)."""
        self.quotas: dict[int, float] = {}
        """Lease id -> the quota applied here (the last one seen)."""
        self.last_ms: int | None = None
        self.members_seen = 1
        self.in_flight: int | None = None
        """The timestamp of the newest record written and not read back yet."""
        self.written_ms = 0
        self.expired = 0
        """Shares asked while the lease had run out (the topic unreachable, or records later than a lease)."""
        self.granted_count = 0
        self.granted_quota: dict[int, float] = {}
        self.prev_shares: dict[int, float] = {}
        self.self_caps: dict[int, float] = {}
        """Lease id -> the share it lowered itself to since its last grant (what its records since state)."""
        self.lowered = False
        """Set when a record lowered a share (the caller binds its connections again), cleared by the caller."""
        self.window_ms = window_ms
        """Kafka's enforcement: the rate window (ms) the enforced limit averages the share over (0: the share)."""
        self._history: dict[int, list[tuple[int, float]]] = {}
        """Lease id -> the shares it held (from, share) over the last :attr:`window_ms`."""
        self.hungry: dict[int, int] = {}
        """Lease id -> until when (ms) its clients count as held back by its share: its last interval's usage
        reached the share, or they were throttled (then until their wait is over)."""
        self.last_rate: dict[int, float] = {}
        """Lease id -> its usage rate in the last interval it had any."""

    def floor_ratio(self) -> float:
        g = self.grant
        return g.floor_ratio if g is not None else self.floor_fraction / max(1, self.members_seen)

    def share(self, lid: int, quota: float, now_ms: int) -> float:
        """The limit to enforce for this bucket now: its share (:meth:`raw_share`) or, with :attr:`window_ms`
        (Kafka's enforcement), its share's average over that window.

        Why an average with Kafka's enforcement: a windowed rate compares the last W seconds' usage with the
        limit, so a share that drops to a tenth would mute a client that used its old share for ~10 x W, though
        that usage was within the old lease. Each member's usage over a window is at most its average share times
        W (Kafka's own check), and the members' shares add up to at most Q at every instant, so their usage over
        any window ending at a check adds up to at most Q x W: the same bound as one broker's."""
        s = self.raw_share(lid, quota, now_ms)
        if not self.window_ms:
            return s
        h = self._history.get(lid)
        if h is None:
            if len(self._history) > 4 * max(1024, len(self.shares)):  # bounded: forget the idle ones
                self._history = {k: v for k, v in self._history.items() if v[-1][0] > now_ms - self.window_ms}
            h = self._history[lid] = []
        if not h or h[-1][1] != s:
            h.append((now_ms, s))
        start = now_ms - self.window_ms
        while len(h) > 1 and h[1][0] <= start:
            h.pop(0)
        total = 0.0
        for i, (t, v) in enumerate(h):
            t0 = max(t, start)
            t1 = h[i + 1][0] if i + 1 < len(h) else now_ms
            if t1 > t0:
                total += v * (t1 - t0)
        span = now_ms - max(h[0][0], start)
        return total / span if span > 0 else s

    def fallback_ratio(self) -> float:
        """What it enforces of every quota without a live lease, as a part of the quota."""
        if self.fallback == "split":
            return 1.0 / max(1, self.members_seen)
        if self.fallback == "zero":
            return 0.0
        return self.floor_ratio()  # its floor, which the book counts while its records land

    def raw_share(self, lid: int, quota: float, now_ms: int) -> float:
        """The share it holds now (what its records state and the book counts)."""
        g = self.grant
        if g is None or now_ms >= g.until_ms:  # no record read back yet, or not for a lease
            self.expired += 1
            s = quota * self.fallback_ratio()
        else:
            got = self.shares.get(lid)
            # a bucket its grant does not name: nobody held more than a floor of it, its unclaimed share
            s = quota * g.unclaimed if got is None else min(got, quota)
            cap = self.self_caps.get(lid)
            if cap is not None:  # lowered since the grant (a floor at least)
                s = min(s, max(cap, quota * g.floor_ratio))
        return max(s, quota * MIN_SHARE)

    def due(self, now_ms: int) -> bool:
        """Whether to write a record now (none in flight, or the one in flight is taken as lost)."""
        if self.in_flight is None:
            return True
        if now_ms - self.written_ms >= self.lost_ms:
            self.round_trips.append(self.lost_ms)  # (lost: ask for long leases for a while)
            return True
        return False

    def lease_for(self) -> int:
        """The lease to ask for in its next record: long enough for its next grant to come before this one runs
        out (an interval and two round trips, with a margin of two more), short so that a dead member's share
        comes back soon (the book drops a member a lease and the skew after its last record)."""
        if not self.round_trips:
            return self.lease_ms
        want = self.interval_ms + LEASE_ROUND_TRIPS * max(self.round_trips)
        return int(min(self.lease_ms, max(MIN_LEASE_MS, want)))

    def read_back(self, rec: LeaseRecord, grant: Grant, members: int, now_ms: int | None = None) -> bool:
        """Its own record, read back and taken by the book: take the grant if it is the newest record written.
        ``now_ms``: when (its clock), for the round trip its leases are sized by."""
        if rec.ts_ms != self.in_flight:
            return False
        self.in_flight = None
        if now_ms is not None:
            self.round_trips.append(max(0, now_ms - rec.ts_ms))
        self.grant = grant
        self.members_seen = max(1, members)
        ids = grant.ids.tolist()
        self.prev_shares = self.shares
        self.shares = dict(zip(ids, grant.shares.tolist(), strict=True))
        self.granted_quota = dict(zip(ids, grant.quota.tolist(), strict=True))
        self.self_caps = {}
        self.granted_count += 1
        return True

    def observe(self, usage: dict[int, tuple[float, float]], now_ms: int, held: dict[int, int] | None = None) -> None:
        """This interval's usage: lease id -> (amount, quota here); ``held``: lease id -> how long (ms) its
        clients were told to wait in this interval (throttles given; none: no throttle). Updates the demand
        meter."""
        dt = float(self.interval_ms if self.last_ms is None else max(0, now_ms - self.last_ms))
        self.last_ms = now_ms
        alpha = 1.0 - float(np.exp(-dt / USAGE_TAU_MS)) if dt else 1.0
        rate_scale = 1000.0 / dt if dt else 0.0
        for lid in list(self.usage):
            if lid not in usage:
                self.usage[lid] *= 1.0 - alpha
                if self.usage[lid] < 1e-9 and self.hungry.get(lid, 0) <= now_ms:
                    del self.usage[lid]
        self.hungry = {lid: until for lid, until in self.hungry.items() if until > now_ms}
        self.last_rate = {}
        for lid, wait_ms in (held or {}).items():
            # Throttled: held back at least until its clients may send again (with Kafka's enforcement a client is
            # muted for whole intervals: no usage then is not "wants less").
            self.hungry[lid] = max(self.hungry.get(lid, 0), now_ms + max(wait_ms, 1))
        for lid, (amount, quota) in usage.items():
            self.quotas[lid] = quota
            prev = self.usage.get(lid, 0.0)
            rate = amount * rate_scale
            self.usage[lid] = prev + alpha * (rate - prev)
            # Held back: it used (nearly) all of the smaller of its last two shares (a share just raised is not
            # used yet; comparing with it would read as no longer wanting more).
            s = self.raw_share(lid, quota, now_ms)
            before = self.prev_shares.get(lid)
            if before is not None:
                s = min(s, before)
            self.last_rate[lid] = rate
            # (and it used some in this interval: a member cut to nothing is not held back by what it used before)
            if rate > 0 and max(rate, self.usage[lid]) >= HUNGRY * s:
                self.hungry[lid] = max(self.hungry.get(lid, 0), now_ms + 1)

    def record(self, now_ms: int) -> LeaseRecord:
        """The record to write now (marks it in flight): every bucket with usage (its demand) and every bucket
        it holds a share of (its hold, which the book counts until this record is read back)."""
        if self.in_flight is not None and now_ms <= self.in_flight:
            now_ms = self.in_flight + 1  # a record is known by its timestamp: never two alike
        ids: list[int] = []
        quota: list[float] = []
        demand: list[float] = []
        hold: list[float] = []
        live = self.grant is not None and now_ms < self.grant.until_ms
        for lid, rate in self.usage.items():
            q = self.quotas[lid]
            s = self.raw_share(lid, q, now_ms)
            ids.append(lid)
            quota.append(q)
            if self.hungry.get(lid, 0) > now_ms:
                demand.append(q)
            else:  # what it used lately, with room to grow; a fall shows within an interval or two
                d = min(q, HEADROOM * max(self.last_rate.get(lid, 0.0), 0.25 * rate))
                demand.append(d)
                if live:  # lower at once: it holds no more than it wants from this record on (its floor at least)
                    lowered = max(d, q * self.floor_ratio())
                    if lowered < s:
                        self.self_caps[lid] = s = lowered
                        self.lowered = True
            hold.append(s)
        if live:
            seen = set(ids)
            assert self.grant is not None
            floor_ratio = self.grant.floor_ratio
            for lid, s in self.shares.items():
                q = self.granted_quota[lid]
                if lid not in seen and s > floor_ratio * q * (1 + 1e-9) and self.self_caps.get(lid, s) > 0:
                    # held, not used any more: back to its floor (the book counts every member's floor)
                    self.self_caps[lid] = 0.0
                    self.lowered = True
        self.in_flight = now_ms
        self.written_ms = now_ms
        g = self.grant
        return LeaseRecord(
            self.member,
            now_ms,
            self.members_seen,
            np.array(ids, dtype=_IDS),
            np.array(quota, dtype=_F8),
            np.array(demand, dtype=_F8),
            np.array(hold, dtype=_F8),
            g.unclaimed if live and g is not None else self.fallback_ratio(),
            g.epoch if live and g is not None else NO_EPOCH,
            self.lease_for(),
        )

    def farewell(self, now_ms: int) -> LeaseRecord:
        """The record a member writes when it stops, after its last client connection is closed: it demands and
        holds nothing of any bucket it knew, states no unclaimed share and asks for a lease of
        :data:`FAREWELL_LEASE_MS`. The book counts its floor on each bucket until it drops it, at the first
        boundary :data:`SKEW_MS` after this record, and the others' next grants take its share then. Why: a
        rolling restart stops every member in turn, and a stopped member's share otherwise came back only when its
        last lease ran out (up to :data:`LEASE_MS`), while its clients, reconnected to the others, were held to
        what the others held. Safe because it admits nothing any more: what it enforced before, no cap needs to
        cover now."""
        if self.in_flight is not None and now_ms <= self.in_flight:
            now_ms = self.in_flight + 1
        known = dict(self.granted_quota)
        known.update(self.quotas)
        ids = sorted(known)
        zeros = np.zeros(len(ids), dtype=_F8)
        self.in_flight = self.written_ms = now_ms
        return LeaseRecord(
            self.member,
            now_ms,
            self.members_seen,
            np.array(ids, dtype=_IDS),
            np.array([known[lid] for lid in ids], dtype=_F8),
            zeros,
            zeros.copy(),
            0.0,
            NO_EPOCH,
            FAREWELL_LEASE_MS,
        )


def lease_id(key: str, bucket: BucketKey) -> int:
    """A bucket's lease id: the same 64-bit id a usage report gives (quota key, bucket user, bucket client id),
    from the bucket Kafka's sharing rule makes, so that every member charging any (user, client id) of one bucket
    names the same lease."""
    return bucket_id(key, bucket.user, bucket.client_id)


class LeasedStore(QuotaStore):
    """The quota store a fleet member's :class:`~quotas.manager.QuotaManager` resolves through: the quota of every
    bucket replaced by this member's share of it. Why a store: the manager enforces whatever limit the store
    resolves (a share changes like an altered quota: the holder's owner bumps the manager's stamp and the
    connections bind again), so the charge path needs no change to enforce shares in either enforcement mode.

    Only :meth:`resolve`, :meth:`quota_limit` and :meth:`on_change`, all the manager uses, work here; alters and
    descriptions go to the real store (:attr:`inner`), which the rest of the proxy keeps using."""

    leased = True

    def __init__(self, inner: QuotaStore, holder: LeaseHolder, now_ms: Callable[[], int]) -> None:
        # not QuotaStore.__init__: this store keeps no quotas of its own
        self.inner = inner
        self.holder = holder
        self.now_ms = now_ms

    def on_change(self, listener: Callable[[], None]) -> None:
        self.inner.on_change(listener)

    def quota_limit(self, key: str, user: str, client_id: str) -> float | None:
        """The quota itself, not this member's share of it (the ``quota-limit`` metric; the share is
        ``lease-limit``): the share is an allocation that moves every interval, the quota is what an operator
        set, and a dashboard that showed the share as the quota hid both (issue 48)."""
        return self.inner.quota_limit(key, user, client_id)

    def resolve(self, user: str, client_id: str | None, key: str) -> Resolved | None:
        r = self.inner.resolve(user, client_id, key)
        if r is None:
            return None
        share = self.holder.share(lease_id(key, r.bucket), r.limit, self.now_ms())
        return r if share == r.limit else replace(r, limit=share)
