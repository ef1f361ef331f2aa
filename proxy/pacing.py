"""Smooth enforcement: a request paced before the broker sees it, and a Fetch asking for no more than its bucket.

Why a module of its own: these are the two things ``quotas.enforcement: smooth`` changes about a request (docs/
quotas.md); the charges themselves are the same as in Kafka's mode. Compiled with the dispatcher
(``proxy.build_info.COMPILED``): :func:`fetch_cap` runs on every paced consumer's Fetch.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.headers import RequestHeader
from protocol.request_fields import fetch_max_bytes_at
from proxy.decisions import Buffer, Decision, Verdict
from proxy.verdicts import PolicyConnection
from quotas.manager import QuotaManager

_I32: Final = struct.Struct(">i")


async def paced(conn: PolicyConnection, d: Decision) -> Verdict:
    """A request held for its pacing wait (the connection waited ``Defer.wait_s``), now affordable: it goes to the
    broker. A throttle of its own (KIP-936) still holds the reads behind it until served, as at arrival."""
    if d.throttle_ms > 0:
        d.holds = True
        conn.mute.hold()
    return d


def fetch_cap(quotas: QuotaManager, d: Decision, header: RequestHeader, frame: Buffer, now_ms: int) -> bytes | None:
    """A Fetch asks for at most what the consumer's pacing buckets hold (its ``max_bytes``, v3+), so the broker
    never sends more than the quota allows now; the frame with the lower ``max_bytes``, or None when it asks for no
    more already. A broker still sends a first record batch larger than ``max_bytes`` whole, and what overdraws is
    throttled as in Kafka's mode."""
    at = fetch_max_bytes_at(header.api_version)
    if at < 0 or header.body_offset is None or not isinstance(frame, bytes):
        return None
    room: float | None = None
    for _kind, h, how in d.later:
        if how == "response_bytes":
            tokens = quotas.pace_tokens(h, now_ms)
            if tokens is not None and (room is None or tokens < room):
                room = tokens
    if room is None:
        return None
    at += 4 + header.body_offset
    if len(frame) < at + 4:
        return None
    asked = _I32.unpack_from(frame, at)[0]
    cap = int(room) if room >= 1 else 1  # in debt (a batch larger than the last cap): one batch, no more
    if asked <= cap:
        return None
    return frame[:at] + _I32.pack(cap) + frame[at + 4 :]
