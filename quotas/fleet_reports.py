"""Quota scope ``fleet``: every proxy of a fleet enforces the sum of everybody's usage (issue 32's scheme).

Since issue 39 the members hold leases instead (``quotas.fleet_leases``): a member's :class:`FleetLedger` feeds
its demand meter, and the record authentication (:func:`record_mac`, :func:`authentic`), :func:`bucket_id` and the
quota records here are the leases' too; the usage reports and their fold below are no longer exchanged.

Pure policy, no I/O (``proxy/fleet/member.py`` carries the messages over a Kafka topic). Each member records its own
charges as before and, besides, adds them to a :class:`FleetLedger`: usage per bucket since the last sync. A few
times a second the member drains the ledger into one :class:`UsageReport` and publishes it; every member folds
the reports of the others into its own trackers (``QuotaManager.apply_remote``), so the rate or token bucket it
compares against the quota holds the whole fleet's usage, a sync interval late.

Why deltas and not rates: a delta is what a tracker records anyway (bytes, percent-seconds, partitions, new
producer ids), it adds up across any number of members, and a lost report loses only its own usage (the error
is bounded by what one report carries) instead of corrupting a shared state.

A report names each bucket by the quota key, one (user, client id) that was charged to it and the amount: the
receiver resolves that pair against its own quotas, so members agree on buckets exactly when they agree on
quotas (the shared quota configuration makes sure of that). On the wire (format 2, issue 32) a bucket is an
8-byte id (:func:`bucket_id`) and its name travels only when first reported and every
:data:`NAMES_REFRESH_MS`; a receiver sums a fold's worth of reports per bucket in one vectorised pass
(:class:`FleetFold`) and resolves each bucket once. Why: with N members a receiver folds (N - 1) x buckets
entries per interval; as JSON, one ``apply_remote`` per entry, 100 members of 1,000 buckets needed more than a
core per member (``bench.fleet_scale``; BENCHMARKS.md, "Fleet at scale").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any, NamedTuple

import numpy as np

from quotas.entities import DEFAULT, EntityName, QuotaEntity, validate_quota
from quotas.kinds import BY_KEY

MAX_ENTRIES = 20_000
"""Entries per report at most; more buckets than this in one interval go out in several reports. Large on
purpose: a receiver pays per report (MAC, framing) plus a vectorised pass over its entries, so fewer, larger
reports are cheaper (20,000 entries are 320 kB, plus the names they carry)."""
#: Buckets with usage waiting for the next report, at most.
MAX_PENDING = 100_000
#: Largest accepted report (bytes): a member (or anyone writing to the topic) cannot make the others parse more.
MAX_REPORT_BYTES = 1 << 20
NAMES_REFRESH_MS = 5_000
"""A member names a bucket (quota key, user, client id) in its report the first time it reports it and again
every this many ms; otherwise the report carries only the bucket's 8-byte id. A member that joins learns every
active bucket's name within this long; until then it drops (and counts) the usage of buckets it cannot name."""
MAX_NAMES = 200_000
"""Bucket names a receiver keeps (id -> name); past that the oldest quarter is forgotten (and learnt again
within :data:`NAMES_REFRESH_MS` while still active)."""
MAX_MEMBER_BYTES = 1_000

MAGIC = b"KTP\x02"
"""Report format 2 (binary, issue 32). Format 1 (JSON) is refused as malformed, and format 1 members refuse
these: the members of a fleet upgrade together (no mixed fleet)."""
_HEAD = struct.Struct("<4sqIIH")  # magic, ts_ms, entries, named entries, member length
_U32 = struct.Struct("<I")
_IDS = np.dtype("<u8")
_AMOUNTS = np.dtype("<f8")
_INDEX = np.dtype("<u4")


MAC_HEADER = "ktp-mac"
"""The record header holding a record's MAC (HMAC-SHA256 under the fleet's secret)."""


def record_mac(secret: bytes, topic: str, key: bytes | None, value: bytes | None) -> bytes:
    """The MAC of one record on a fleet topic. The topic is part of it, so a usage report cannot be replayed as a
    quota record; lengths frame each part, so no two (key, value) pairs hash the same bytes."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (topic.encode(), key, value):
        if part is None:
            mac.update(b"\xff\xff\xff\xff")
        else:
            mac.update(len(part).to_bytes(4, "big"))
            mac.update(part)
    return mac.digest()


def authentic(
    secret: bytes,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
) -> bool:
    """Whether a record read from a fleet topic carries the MAC a member would have given it."""
    want = record_mac(secret, topic, key, value)
    return any(name == MAC_HEADER and mac is not None and hmac.compare_digest(mac, want) for name, mac in headers or ())


class ReportError(ValueError):
    """A fleet report that is not one: malformed, oversized, or naming an unknown quota key."""


def member_id(data: bytes, start: int, end: int, what: str) -> str:
    """The member id a record (a usage report, a lease record) carries at ``data[start:end]``."""
    try:
        return bytes(data[start:end]).decode()
    except UnicodeDecodeError:
        raise ReportError(f"{what} is malformed (member id is not UTF-8)") from None


def _name_bytes(key: str, user: str, client_id: str) -> bytes:
    k, u, c = key.encode(), user.encode(), client_id.encode()
    return b"".join((bytes((len(k),)), k, _U32.pack(len(u)), u, _U32.pack(len(c)), c))


@lru_cache(maxsize=1 << 16)
def bucket_id(key: str, user: str, client_id: str) -> int:
    """A bucket's id on the wire: 64 bits of BLAKE2b over its name (quota key, user, client id), so a report
    carries 8 bytes per bucket instead of the name. Every member computes the same id for the same name; to hit
    someone else's bucket a client would need a second preimage (2^64 work), and a collision it crafts between
    two client ids of its own (2^32) only merges its own two buckets."""
    return int.from_bytes(hashlib.blake2b(_name_bytes(key, user, client_id), digest_size=8).digest(), "little")


class Usage(NamedTuple):
    """One bucket's usage in a report. A tuple, not a frozen dataclass: a member makes one per bucket per report
    and a receiver one per bucket per fold (a frozen dataclass cost ~1 us each: most of a 1,000-bucket drain)."""

    key: str
    user: str
    client_id: str
    amount: float


@dataclass(slots=True)
class UsageReport:
    """What a member publishes: its usage per bucket since its last report.

    On the wire (format 2, little-endian): a header (magic ``KTP\\x02``, ts_ms, n entries, m named entries, the
    member's id length), the member id, n bucket ids (u64), n amounts (f64), the m indexes of the named entries
    (u32), and the m names (quota key, user, client id; length-prefixed). Why binary: a receiver of N members
    folds (N - 1) x entries x 4 a second; as two arrays it sums them per bucket in one vectorised pass (numpy)
    instead of parsing and resolving every entry (JSON cost ~1 s of CPU a second at 100 members x 1k buckets)."""

    member: str
    ts_ms: int
    usage: list[Usage] = field(default_factory=list)
    named: list[bool] | None = None
    """Per entry: whether this report names its bucket (None: every entry is named)."""
    ids: list[int] | None = None
    """Per entry: its :func:`bucket_id`, when the ledger already has them (None: computed here)."""

    def encode(self) -> bytes:
        member = self.member.encode()[:MAX_MEMBER_BYTES]
        usage = self.usage
        ids = np.array(self.ids if self.ids is not None else [bucket_id(u[0], u[1], u[2]) for u in usage], dtype=_IDS)
        amounts = np.fromiter([u[3] for u in usage], dtype=_AMOUNTS, count=len(usage))
        order = np.argsort(ids, kind="stable")  # sorted by id: the receivers' binary search is then a merge
        where = np.empty_like(order)
        where[order] = np.arange(len(order))
        ids, amounts = ids[order], amounts[order]
        named = range(len(usage)) if self.named is None else [i for i, yes in enumerate(self.named) if yes]
        index = where[np.array(named, dtype=np.intp)].astype(_INDEX)
        names = b"".join(_name_bytes(usage[i][0], usage[i][1], usage[i][2]) for i in named)
        return b"".join(
            (
                _HEAD.pack(MAGIC, self.ts_ms, len(usage), len(index), len(member)),
                member,
                ids.tobytes(),
                amounts.tobytes(),
                index.tobytes(),
                names,
            )
        )

    @staticmethod
    def decode(data: bytes) -> ReceivedReport:
        """The framing and the amounts, checked; the names are checked when read (:meth:`ReceivedReport.names`).
        Anything but a well-formed format-2 report raises :class:`ReportError`."""
        if len(data) > MAX_REPORT_BYTES:
            raise ReportError(f"fleet report of {len(data)} bytes is over {MAX_REPORT_BYTES}")
        if len(data) < _HEAD.size:
            raise ReportError(f"fleet report is malformed ({len(data)} bytes, shorter than a header)")
        magic, ts_ms, n, m, member_len = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise ReportError(f"fleet report version {magic!r} is not {MAGIC!r} (members upgrade together)")
        pos = _HEAD.size + member_len
        names_at = pos + 16 * n + 4 * m
        if n > MAX_ENTRIES or m > n or names_at > len(data):
            raise ReportError(f"fleet report is malformed ({n} entries, {m} named, in {len(data)} bytes)")
        member = member_id(data, _HEAD.size, pos, "fleet report")
        ids = np.frombuffer(data, _IDS, n, pos)
        amounts = np.frombuffer(data, _AMOUNTS, n, pos + 8 * n)
        index = np.frombuffer(data, _INDEX, m, pos + 16 * n)
        if n and not ((amounts >= 0) & (amounts < np.inf)).all():
            raise ReportError("fleet report has an amount that is not a finite amount >= 0")
        if m and int(index.max()) >= n:
            raise ReportError("fleet report is malformed (a name for an entry it does not have)")
        return ReceivedReport(member, ts_ms, ids, amounts, index, bytes(data), names_at)


@dataclass(frozen=True, slots=True)
class ReceivedReport:
    """A decoded report: its entries as arrays (bucket id, amount), its names still in the bytes."""

    member: str
    ts_ms: int
    ids: np.ndarray
    amounts: np.ndarray
    named: np.ndarray
    """Indexes of the entries this report names."""
    data: bytes
    names_at: int

    def named_ids(self) -> list[int]:
        ids: list[int] = self.ids[self.named].tolist()  # u8 array: Python ints (numpy types tolist() as Any)
        return ids

    def names(self) -> dict[int, tuple[str, str, str]]:
        """Bucket id -> (quota key, user, client id) for the named entries, each checked: a known quota key,
        UTF-8, and the id is the name's (a member cannot file usage under another bucket's name)."""
        data, pos, end = self.data, self.names_at, len(self.data)
        out: dict[int, tuple[str, str, str]] = {}
        try:
            for i in self.named.tolist():
                klen = data[pos]
                key = data[pos + 1 : pos + 1 + klen].decode()
                pos += 1 + klen
                (ulen,) = _U32.unpack_from(data, pos)
                user = data[pos + 4 : pos + 4 + ulen].decode()
                pos += 4 + ulen
                (clen,) = _U32.unpack_from(data, pos)
                client_id = data[pos + 4 : pos + 4 + clen].decode()
                pos += 4 + clen
                if pos > end:
                    raise ReportError("fleet report is malformed (a name runs past its end)")
                if key not in BY_KEY:
                    raise ReportError(f"fleet report names unknown quota key {key!r}")
                bid = int(self.ids[i])
                if bucket_id(key, user, client_id) != bid:
                    raise ReportError(f"fleet report names bucket {bid:#x} {key}/{user!r}/{client_id!r}, not its id")
                out[bid] = (key, user, client_id)
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise ReportError(f"fleet report is malformed ({type(exc).__name__}: {exc})") from None
        if pos != end:
            raise ReportError(f"fleet report is malformed ({end - pos} bytes after its names)")
        return out

    def usage(self) -> list[Usage]:
        """Every entry with its name, in id order, for a report that names all of them (tests, tools)."""
        names = self.names()
        return [Usage(*names[i], a) for i, a in zip(self.ids.tolist(), self.amounts.tolist(), strict=True)]


class FleetLedger:
    """A member's own usage per bucket since the last drain (the tracker key stands for the bucket)."""

    __slots__ = ("_named", "_pending", "dropped")

    def __init__(self) -> None:
        self._pending: dict[tuple[Hashable, ...], list[Any]] = {}
        """Tracker key -> [quota key, user, client id, amount] (a list, so that ``add`` sums in place)."""
        self._named: dict[int, int] = {}
        """Bucket name (quota key, user, client id), by its :func:`bucket_id` -> when this member last published it
        (ms): names go out once every :data:`NAMES_REFRESH_MS`, ids every time. By name, not tracker key: the pair a
        report names for a bucket is the first one charged in the interval, and may change from one report to the
        next."""
        self.dropped = 0
        """Usages not kept because :data:`MAX_PENDING` buckets were already waiting (client ids are the client's
        choice, and while the topic is down nothing drains)."""

    def add(self, tracker_key: tuple[Hashable, ...], key: str, user: str, client_id: str, amount: float) -> None:
        entry = self._pending.get(tracker_key)
        if entry is not None:
            entry[3] += amount
        elif len(self._pending) < MAX_PENDING:
            self._pending[tracker_key] = [key, user, client_id, amount]
        else:
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._pending)

    def take(self) -> list[Usage]:
        """Everything added since the last drain, one :class:`Usage` per tracker key (a lease holder's usage: it
        resolves each to its bucket itself)."""
        pending, self._pending = self._pending, {}
        return [e for e in map(_as_usage, pending.values()) if e[3] > 0]

    def drain(self, member: str, now_ms: int) -> list[UsageReport]:
        """Everything added since the last drain, as reports of at most :data:`MAX_ENTRIES` entries and half of
        :data:`MAX_REPORT_BYTES`.

        Per entry only comprehensions and cached lookups (the id, when its name is due): at 10,000 buckets a
        member drains 40,000 entries a second, and a loop of Python statements per entry cost ~1.5 us of them."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, {}
        entries = [e for e in map(_as_usage, pending.values()) if e[3] > 0]
        if not entries:
            return []
        ids = [bucket_id(e[0], e[1], e[2]) for e in entries]
        named_at = self._named
        if len(named_at) > MAX_PENDING:  # bounded: forgetting only means naming those buckets again
            named_at.clear()
        due = [i for i, bid in enumerate(ids) if now_ms - named_at.get(bid, _NEVER) >= NAMES_REFRESH_MS]
        named = [False] * len(entries)
        for i in due:
            named[i] = True
            named_at[ids[i]] = now_ms
        cost = {i: 20 + _name_cost(entries[i]) for i in due}  # u32 index + name, beside the 16 of every entry
        if len(entries) <= MAX_ENTRIES and 16 * len(entries) + sum(cost.values()) <= MAX_REPORT_BYTES // 2:
            return [UsageReport(member, now_ms, entries, named, ids)]
        reports: list[UsageReport] = []
        start, size = 0, 0
        for i in range(len(entries)):
            c = cost.get(i, 16)
            if i > start and (i - start >= MAX_ENTRIES or size + c > MAX_REPORT_BYTES // 2):
                reports.append(UsageReport(member, now_ms, entries[start:i], named[start:i], ids[start:i]))
                start, size = i, 0
            size += c
        reports.append(UsageReport(member, now_ms, entries[start:], named[start:], ids[start:]))
        return reports


_NEVER = -(1 << 62)


def _name_cost(u: Usage) -> int:
    return 9 + len(u[0]) + len(u[1].encode()) + len(u[2].encode())


_as_usage = partial(tuple.__new__, Usage)
"""A ledger entry ([key, user, client id, amount]) as a :class:`Usage`, without NamedTuple's Python-level
``__new__``: C calls only (the drain makes one per bucket)."""


class FleetFold:
    """Other members' reports waiting to be folded in, summed per bucket in one vectorised pass per fold.

    Why batched: at N members a receiver gets (N - 1) reports per interval naming mostly the same buckets; summing
    them per bucket first turns (N - 1) x entries tracker updates into one per bucket. Folding a sum at one
    instant records the same in a windowed rate or token bucket as folding its parts at that instant; the fold's
    own period adds to the sync delay (README, enforcement error).

    How: the ids of the buckets named so far are kept sorted (``_known``); a fold concatenates the reports' ids
    and amounts, finds each id's slot by binary search (``searchsorted``; senders sort their entries by id, which
    makes it a near-linear merge), and sums amounts per slot (``bincount``): no Python per entry. 100 members x
    1,000 buckets, 99,000 entries a fold, cost ~1.5 ms against ~10 ms for a sort (``np.unique``) and ~300 ms for
    JSON and ``apply_remote`` per entry."""

    __slots__ = ("_amounts", "_ids", "_known", "entries", "names", "unnamed")

    def __init__(self) -> None:
        self.names: dict[int, tuple[str, str, str]] = {}
        """Bucket id -> name, learnt from reports that name it; at most :data:`MAX_NAMES`."""
        self._known = np.empty(0, dtype=_IDS)
        """The keys of :attr:`names`, sorted."""
        self._ids: list[np.ndarray] = []
        self._amounts: list[np.ndarray] = []
        self.entries = 0
        """Entries waiting (the caller folds early past a bound)."""
        self.unnamed = 0
        """Entries dropped because no report had named their bucket here yet (a member's first seconds)."""

    def add(self, report: ReceivedReport) -> None:
        """Take one report in; raises :class:`ReportError` (and takes nothing) when its names are malformed.
        Names are read only when the report names a bucket not known yet: they come again every few seconds."""
        if len(report.named):
            names = self.names
            if any(i not in names for i in report.named_ids()):
                learnt = report.names()
                if len(names) + len(learnt) > MAX_NAMES:
                    for old in list(names)[: max(len(learnt), MAX_NAMES // 4)]:
                        del names[old]
                    names.update(learnt)
                    self._known = np.sort(np.fromiter(names, dtype=_IDS, count=len(names)))
                else:
                    names.update(learnt)
                    self._known = np.union1d(self._known, np.fromiter(learnt, dtype=_IDS, count=len(learnt)))
        if len(report.ids):
            self._ids.append(report.ids)
            self._amounts.append(report.amounts)
            self.entries += len(report.ids)

    def drain(self) -> list[Usage]:
        """The usage taken in since the last drain, one :class:`Usage` per bucket (its amounts summed)."""
        names = self.names
        return [Usage(*names[bid], amount) for bid, amount in zip(*self.drain_ids(), strict=True)]

    def drain_ids(self) -> tuple[list[int], list[float]]:
        """:meth:`drain` as bucket ids (each in :attr:`names`) and amounts: a member keeps a handle per id."""
        if not self._ids:
            return [], []
        ids = np.concatenate(self._ids) if len(self._ids) > 1 else self._ids[0]
        amounts = np.concatenate(self._amounts) if len(self._amounts) > 1 else self._amounts[0]
        self._ids, self._amounts, self.entries = [], [], 0
        known = self._known
        if not len(known):
            self.unnamed += len(ids)
            return [], []
        slots = np.searchsorted(known, ids)
        np.minimum(slots, len(known) - 1, out=slots)
        hit = known[slots] == ids
        if not hit.all():
            self.unnamed += int(len(hit) - np.count_nonzero(hit))
            slots, amounts = slots[hit], amounts[hit]
        sums = np.bincount(slots, weights=amounts, minlength=len(known))
        used = np.flatnonzero(sums)
        return known[used].tolist(), sums[used].tolist()


# ------------------------------------------------------------------------------------------ shared quota config


def _name_out(name: EntityName) -> str | None:
    return None if name is None else ("<default>" if name is DEFAULT else str(name))


def _name_in(name: object) -> EntityName:
    if name is None:
        return None
    if not isinstance(name, str):
        raise ReportError(f"quota record entity name {name!r} is not a string")
    return DEFAULT if name == "<default>" else name


def encode_quota_record(entity: QuotaEntity, layer: dict[str, float | None]) -> tuple[bytes, bytes]:
    """One entity's admin-set quotas (``None`` = removed, a tombstone that hides file and cluster values) as the
    key and value of a record on the fleet's compacted quota topic: the key is the entity, so compaction keeps
    the last alter of each entity."""
    key = json.dumps([_name_out(entity.user), _name_out(entity.client_id)], separators=(",", ":")).encode()
    value = json.dumps({"v": 1, "quotas": layer}, separators=(",", ":")).encode()
    return key, value


def decode_quota_record(key: bytes | None, value: bytes | None) -> tuple[QuotaEntity, dict[str, float | None]]:
    """The inverse of :func:`encode_quota_record`, checking every value as an alter through the API would."""
    if key is None or value is None or len(key) + len(value) > MAX_REPORT_BYTES:
        raise ReportError("quota record without key or value, or too large")
    try:
        user, client_id = json.loads(key)
        entity = QuotaEntity(_name_in(user), _name_in(client_id))
        doc = json.loads(value)
        if doc.get("v") != 1:
            raise ReportError(f"quota record version {doc.get('v')!r} is not 1")
        layer: dict[str, float | None] = {}
        for k, v in doc["quotas"].items():
            if v is not None:
                v = float(v)
                validate_quota(entity, k, v)
            elif k not in BY_KEY:
                raise ReportError(f"quota record names unknown quota key {k!r}")
            layer[str(k)] = v
        return entity, layer
    except ReportError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # QuotaValueError/QuotaEntityError included
        raise ReportError(f"quota record is malformed ({type(exc).__name__}: {exc})") from None
