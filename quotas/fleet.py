"""Quota scope ``fleet``: every proxy of a fleet enforces the sum of everybody's usage.

Pure policy, no I/O (``proxy/fleet.py`` carries the messages over a Kafka topic). Each member records its own
charges as before and, besides, adds them to a :class:`FleetLedger`: usage per bucket since the last sync. A few
times a second the member drains the ledger into one :class:`UsageReport` and publishes it; every member folds
the reports of the others into its own trackers (``QuotaManager.apply_remote``), so the rate or token bucket it
compares against the quota holds the whole fleet's usage, a sync interval late.

Why deltas and not rates: a delta is what a tracker records anyway (bytes, percent-seconds, partitions, new
producer ids), it adds up across any number of members, and a lost report loses only its own usage (the error
is bounded by what one report carries) instead of corrupting a shared state.

A report names each bucket by the quota key, one (user, client id) that was charged to it and the amount: the
receiver resolves that pair against its own quotas, so members agree on buckets exactly when they agree on
quotas (the shared quota configuration makes sure of that).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from quotas.entities import DEFAULT, QuotaEntity, validate_quota
from quotas.kinds import BY_KEY

#: Entries per report at most; more buckets than this in one interval go out in several reports.
MAX_ENTRIES = 2_000
#: Buckets with usage waiting for the next report, at most.
MAX_PENDING = 100_000
#: Largest accepted report (bytes): a member (or anyone writing to the topic) cannot make the others parse more.
MAX_REPORT_BYTES = 1 << 20


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


def authentic(secret: bytes, topic: str, key: bytes | None, value: bytes | None,
              headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
    """Whether a record read from a fleet topic carries the MAC a member would have given it."""
    want = record_mac(secret, topic, key, value)
    return any(name == MAC_HEADER and mac is not None and hmac.compare_digest(mac, want)
               for name, mac in headers or ())


class ReportError(ValueError):
    """A fleet report that is not one: malformed, oversized, or naming an unknown quota key."""


@dataclass(frozen=True, slots=True)
class Usage:
    key: str
    user: str
    client_id: str
    amount: float


@dataclass(slots=True)
class UsageReport:
    member: str
    ts_ms: int
    usage: list[Usage] = field(default_factory=list)

    def encode(self) -> bytes:
        return json.dumps({"v": 1, "m": self.member, "t": self.ts_ms,
                           "u": [[u.key, u.user, u.client_id, u.amount] for u in self.usage]},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> UsageReport:
        if len(data) > MAX_REPORT_BYTES:
            raise ReportError(f"fleet report of {len(data)} bytes is over {MAX_REPORT_BYTES}")
        try:
            doc = json.loads(data)
            if doc.get("v") != 1:
                raise ReportError(f"fleet report version {doc.get('v')!r} is not 1")
            usage = []
            for key, user, client_id, amount in doc["u"]:
                if key not in BY_KEY:
                    raise ReportError(f"fleet report names unknown quota key {key!r}")
                amount = float(amount)
                if not 0 <= amount < float("inf"):
                    raise ReportError(f"fleet report amount {amount!r} for {key} is not a finite amount >= 0")
                usage.append(Usage(key, str(user), str(client_id), amount))
            return cls(str(doc["m"]), int(doc["t"]), usage)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, ReportError):
                raise
            raise ReportError(f"fleet report is malformed ({type(exc).__name__}: {exc})") from None


class FleetLedger:
    """A member's own usage per bucket since the last drain (the tracker key stands for the bucket)."""

    __slots__ = ("_pending", "dropped")

    def __init__(self) -> None:
        self._pending: dict[tuple, list] = {}
        self.dropped = 0
        """Usages not kept because :data:`MAX_PENDING` buckets were already waiting (client ids are the client's
        choice, and while the topic is down nothing drains)."""

    def add(self, tracker_key: tuple, key: str, user: str, client_id: str, amount: float) -> None:
        entry = self._pending.get(tracker_key)
        if entry is not None:
            entry[3] += amount
        elif len(self._pending) < MAX_PENDING:
            self._pending[tracker_key] = [key, user, client_id, amount]
        else:
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self, member: str, now_ms: int) -> list[UsageReport]:
        """Everything added since the last drain, as reports of at most :data:`MAX_ENTRIES` entries."""
        if not self._pending:
            return []
        reports: list[UsageReport] = []
        current, size = UsageReport(member, now_ms), 0
        for k, u, c, a in self._pending.values():
            if a <= 0:
                continue
            cost = len(k) + len(u.encode()) * 6 + len(c.encode()) * 6 + 40  # JSON escapes at most 6x
            if current.usage and (len(current.usage) >= MAX_ENTRIES or size + cost > MAX_REPORT_BYTES // 2):
                reports.append(current)
                current, size = UsageReport(member, now_ms), 0
            current.usage.append(Usage(k, u, c, a))
            size += cost
        if current.usage:
            reports.append(current)
        self._pending = {}
        return reports


# ------------------------------------------------------------------------------------------ shared quota config


def _name_out(name) -> str | None:
    return None if name is None else ("<default>" if name is DEFAULT else str(name))


def _name_in(name) -> object:
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
