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
from proxy.decisions import Buffer, Decision
from quotas.manager import Bound, QuotaManager
from quotas.plans import Charged

_I32: Final = struct.Struct(">i")


PACE_RECHECK_MS: Final = 250
"""The longest a paced request waits before its wait is asked again (:func:`paced`). Why: the rate it waits at
can change under it, above all a fleet member's share (issue 39): a member restarted in a rolling restart holds its
floor until the old instance's lease expires, and a first large request paced at that floor would otherwise wait
seconds after the share came back. A quarter second follows a lease change well inside the one second the fleet
has to follow demand, for one timer per paced request per quarter second."""


def pace_marks(quotas: QuotaManager, charged: tuple[Charged, ...], now_ms: int) -> list[tuple[Bound, float]]:
    """A request just charged over its pacing buckets: where each bucket must have refilled to for it to go, for
    the decision to keep (:func:`owed_ms` reads them). Called only for a paced request, never on the common path."""
    marks = []
    for _kind, h, _how in charged:
        mark = quotas.pace_mark(h, now_ms)
        if mark is not None:
            marks.append((h, mark))
    return marks


def owed_ms(quotas: QuotaManager, marks: list[tuple[Bound, float]], now_ms: int) -> int:
    """How long a paced request still waits at the rates in force now (they may have moved while it waited, or this
    was one slice of a longer wait): the longest of its buckets' waits to their marks."""
    wait = 0
    for h, mark in marks:
        w = quotas.pace_wait_ms(h, mark, now_ms)
        if w > wait:
            wait = w
    return wait


def wait_slice_s(wait_ms: int) -> float:
    """One slice of a paced request's wait, in seconds: all of it, or :data:`PACE_RECHECK_MS`."""
    return (wait_ms if wait_ms < PACE_RECHECK_MS else PACE_RECHECK_MS) / 1000


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
