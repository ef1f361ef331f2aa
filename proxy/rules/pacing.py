"""Smooth enforcement: a request paced before the broker sees it, and a Fetch asking for no more than its bucket.

Why a module of its own: these are the two things ``quotas.enforcement: smooth`` changes about a request (docs/
quotas.md); the charges themselves are the same as in Kafka's mode. Compiled with the dispatcher
(``proxy.build_info.COMPILED``): :func:`fetch_room` runs on every paced consumer's Fetch.
"""

from __future__ import annotations

from typing import Final

from proxy.rules.decisions import Decision
from quotas.manager import Bound, QuotaManager
from quotas.plans import Charged

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


def fetch_room(quotas: QuotaManager, d: Decision, now_ms: int) -> float | None:
    """How many bytes a Fetch may ask for now (its ``max_bytes``, v3+: ``protocol.request.Request.capped_fetch``):
    what the consumer's pacing buckets hold, so the broker never sends more than the quota allows now; None when no
    bucket paces it. A broker still sends a first record batch larger than ``max_bytes`` whole, and what overdraws
    is throttled as in Kafka's mode."""
    room: float | None = None
    for _kind, h, how in d.later:
        if how == "response_bytes":
            tokens = quotas.pace_tokens(h, now_ms)
            if tokens is not None and (room is None or tokens < room):
                room = tokens
    return room
