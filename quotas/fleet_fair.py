"""Fair share in a fleet (issue 48): the record a member writes to say on which brokers it has light tenants.

Pure, no I/O (``proxy/fleet/member.py`` carries it over the fleet's usage topic, MAC'd like the lease records).

Why a record of its own: each member of a fleet sees only its own clients, so a member whose only tenant on a
broker is a flooder finds nobody to protect there, while the victim is on another member
(``quotas.fair_share.FairShare.note_remote``). What the others need is only where somebody light is, and how much
it uses (``FairShare.light``): no tenant names, no shares, nothing that must be agreed on. Broker keys are the
proxy's listener labels ("broker 1"), the same on every member fronting the same cluster (a bootstrap connection's
key is the broker's address, the same too).

On the wire (little-endian): a header (magic ``KTF\\x01``, ts_ms: the writer's wall clock, valid_ms: how long after
ts_ms the report counts, the member id's length, the number of brokers), the member id (UTF-8), then per broker its
key's length (u8), the key (UTF-8) and the light tenants' demand there (f64, work bytes/s). Its magic differs from
the lease record's (``KTL\\x02``) and the old usage report's (``KTP\\x02``), so the topic's reader dispatches on the
first four bytes.

Bounded: at most :data:`MAX_BROKERS` brokers of keys of at most :data:`MAX_KEY_BYTES` bytes and a member id of
``MAX_MEMBER_BYTES``, so a report is at most ~0.55 MB whatever is in it, within the fleet's ``MAX_REPORT_BYTES``
(checked first, before any parsing). A reader refuses anything else with a :class:`ReportError` that says what is
wrong.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from quotas.fleet_reports import MAX_MEMBER_BYTES, MAX_REPORT_BYTES, ReportError, member_id

MAGIC = b"KTF\x01"
"""Fair-share light report, format 1."""
MAX_BROKERS = 2_048
"""Brokers per report at most: more than any cluster a proxy fronts, and a proxy's fair share tracks at most 4,096
keys (listeners and bootstrap addresses). Past it a writer leaves the rest out (by key order): those brokers are
then protected only by the members that see both tenants."""
MAX_KEY_BYTES = 255
"""A broker key's length at most (one byte on the wire): a listener label ("broker 1") or a broker's host:port. A
longer key (a host name of 250 bytes and a port) is left out by the writer: that broker's bootstrap connections
alone lose the fleet's protection."""
MAX_VALID_MS = 10_000
"""The longest a report may count after it was written: a writer refreshes its report every second or so; a report
claiming longer is malformed (it would keep a broker limited long after the light tenant left)."""
_HEAD = struct.Struct("<4sqIHH")  # magic, ts_ms, valid_ms, member id length, brokers
_AMOUNTS = struct.Struct("<dd")  # demand, baseline

MAX_BYTES = _HEAD.size + MAX_MEMBER_BYTES + MAX_BROKERS * (1 + MAX_KEY_BYTES + _AMOUNTS.size)
"""The largest report the bounds allow (~0.55 MB)."""
assert MAX_BYTES <= MAX_REPORT_BYTES


@dataclass(frozen=True, slots=True)
class LightReport:
    """One member's light tenants' demand per broker (``FairShare.light``), written at ``ts_ms`` (its wall clock) and
    counting until ``ts_ms + valid_ms``."""

    member: str
    ts_ms: int
    valid_ms: int
    light: dict[str, float] = field(default_factory=dict)
    base: dict[str, float] = field(default_factory=dict)
    """Per broker of :attr:`light`, the member's smallest baseline there (ms); a broker without one is absent."""

    def entries(self) -> list[tuple[bytes, float, float]]:
        """What :meth:`encode` writes: the brokers in key order, each key at most :data:`MAX_KEY_BYTES` bytes and
        its demand finite and >= 0 (others are left out), its baseline when finite and > 0 (else 0), at most
        :data:`MAX_BROKERS` of them."""
        out: list[tuple[bytes, float, float]] = []
        for key in sorted(self.light):
            raw, demand = key.encode(), self.light[key]
            base = self.base.get(key, 0.0)
            if 0 < len(raw) <= MAX_KEY_BYTES and 0.0 <= demand < math.inf:
                out.append((raw, float(demand), float(base) if 0.0 < base < math.inf else 0.0))
                if len(out) == MAX_BROKERS:
                    break
        return out

    def encode(self) -> bytes:
        if not 0 < self.valid_ms <= MAX_VALID_MS:
            raise ValueError(f"a light report counts for 1 to {MAX_VALID_MS} ms, not {self.valid_ms}")
        # cut at a character, not inside one: the reader refuses a member id that is not UTF-8
        member = self.member.encode()[:MAX_MEMBER_BYTES].decode(errors="ignore").encode()
        entries = self.entries()
        parts = [_HEAD.pack(MAGIC, self.ts_ms, self.valid_ms, len(member), len(entries)), member]
        for raw, demand, base in entries:
            parts += (bytes((len(raw),)), raw, _AMOUNTS.pack(demand, base))
        return b"".join(parts)

    @staticmethod
    def decode(data: bytes) -> LightReport:
        """A light report, every field checked; anything else raises :class:`ReportError` naming what is wrong."""
        if len(data) > MAX_REPORT_BYTES:
            raise ReportError(f"light report of {len(data)} bytes is over {MAX_REPORT_BYTES}")
        if len(data) < _HEAD.size:
            raise ReportError(
                f"light report is malformed ({len(data)} bytes, shorter than its {_HEAD.size}-byte header)"
            )
        magic, ts_ms, valid_ms, mlen, n = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise ReportError(f"light report version {magic!r} is not {MAGIC!r}")
        if ts_ms < 0:
            raise ReportError(f"light report is malformed (timestamp {ts_ms} ms is negative)")
        if not 0 < valid_ms <= MAX_VALID_MS:
            raise ReportError(f"light report is malformed (counts for {valid_ms} ms, not 1 to {MAX_VALID_MS})")
        if not 0 < mlen <= MAX_MEMBER_BYTES:
            raise ReportError(f"light report is malformed (member id of {mlen} bytes, not 1 to {MAX_MEMBER_BYTES})")
        if n > MAX_BROKERS:
            raise ReportError(f"light report names {n} brokers, over {MAX_BROKERS}")
        pos = _HEAD.size + mlen
        if pos > len(data):
            raise ReportError(f"light report is malformed (member id runs past its {len(data)} bytes)")
        member = member_id(data, _HEAD.size, pos, "light report")
        light: dict[str, float] = {}
        bases: dict[str, float] = {}
        for i in range(n):
            if pos >= len(data):
                raise ReportError(f"light report is malformed (broker {i} of {n} runs past its {len(data)} bytes)")
            klen = data[pos]
            end = pos + 1 + klen
            if klen == 0 or end + _AMOUNTS.size > len(data):
                raise ReportError(
                    f"light report is malformed (broker {i}: key of {klen} bytes at {pos} of {len(data)})"
                )
            try:
                key = bytes(data[pos + 1 : end]).decode()
            except UnicodeDecodeError:
                raise ReportError(f"light report is malformed (broker {i}'s key is not UTF-8)") from None
            demand, base = _AMOUNTS.unpack_from(data, end)
            if not 0.0 <= demand < math.inf:
                raise ReportError(f"light report's demand on {key!r} is {demand}, not a finite amount >= 0")
            if not 0.0 <= base < math.inf:
                raise ReportError(f"light report's baseline on {key!r} is {base} ms, not a finite time >= 0")
            if key in light:
                raise ReportError(f"light report names broker {key!r} twice")
            light[key] = demand
            if base > 0:
                bases[key] = base
            pos = end + _AMOUNTS.size
        if pos != len(data):
            raise ReportError(f"light report is malformed ({len(data) - pos} bytes after its {n} brokers)")
        return LightReport(member, ts_ms, valid_ms, light, bases)
