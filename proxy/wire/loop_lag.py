"""How late the event loop runs what is due: the loop-lag histogram, and the per-request timeline (issue 37).

Why: every connection of a worker is served by one event loop, so whatever one connection makes the loop do
(read, copy, forward or answer megabytes, a synchronous step on a large frame) every other connection waits for.
That wait is invisible in per-request latencies (they start when the request was read, after the wait), so it is
measured where it happens: a timer due every ``INTERVAL_S`` notes how late the loop ran it. The lateness is the
time the loop spent on other work past the deadline: the longest slice of work that held the loop, seen from any
connection's point of view.

The timeline (off unless ``KTP_TIMELINE`` names a file) records, per request, when its frame was read, when it was
forwarded (after any decision), when the broker's answer was read and when the answer was handed to the client's
transport, plus every lag sample over ``TIMELINE_LAG_S``: enough to put one tenant's waits beside another tenant's
bursts (bench/isolation reads it). It is written by the sampler once a second, never on the request path; off, it
costs the request path one attribute test per request and response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

INTERVAL_S = 0.1
"""The sampler's period. Its timer falls at instants unrelated to the connections' work, so each sample is the wait
a request arriving at a random moment would see (the rest of whatever holds the loop then): the histogram is that
wait's distribution, whatever the period, and any hold longer than the period is caught for sure. Ten wake-ups a
second cost the request path nothing measurable (bench.live_instructions counts every instruction of the process
while it times Produce round trips; a 10 ms period added about 8k instructions a round trip under valgrind)."""
TIMELINE_INTERVAL_S = 0.01
"""The period while the timeline is on (diagnosis): every hold over 10 ms is then seen and stamped."""
BUCKETS_S: Sequence[float] = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds of the histogram's buckets (Prometheus ``le``), seconds."""
TIMELINE_LAG_S = 0.002
"""Lag samples at least this long go to the timeline (shorter ones are the loop's ordinary scheduling noise)."""
TIMELINE_ENV = "KTP_TIMELINE"
TIMELINE_MAX = 1_000_000
"""Records kept between two writes at most (a burst of tiny requests must not grow memory without bound)."""


class LoopLag:
    """The event-loop lag histogram (cumulative, as Prometheus wants it), and the timeline when it is on."""

    def __init__(self, timeline_path: str | None = None) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)  # per bucket, the last one +Inf (not cumulative: see buckets())
        self.sum_s = 0.0
        self.max_s = 0.0
        self.timeline: list[Any] | None = [] if timeline_path else None
        """Timeline records waiting to be written; None when the timeline is off (the request path's test)."""
        self._path = timeline_path
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._interval = INTERVAL_S if self.timeline is None else TIMELINE_INTERVAL_S
        self._due = 0.0
        self._cpu = 0.0
        self._next_flush = 0.0

    @classmethod
    def from_env(cls, worker: int | None = None) -> LoopLag:
        path = os.environ.get(TIMELINE_ENV) or None
        if path and worker is not None:
            path = f"{path}.{worker}"
        return cls(path)

    def observe(self, lag_s: float) -> None:
        i = 0
        for bound in BUCKETS_S:
            if lag_s <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum_s += lag_s
        if lag_s > self.max_s:
            self.max_s = lag_s

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs, +Inf last, as prometheus_client's HistogramMetricFamily takes them."""
        out = []
        total = 0
        for bound, n in zip([*map(str, BUCKETS_S), "+Inf"], self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._next_flush = loop.time() + 1.0
        self._cpu = time.thread_time()
        self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()

    def _arm(self) -> None:
        """A plain timer callback, not a task sleeping: a tenth of the instructions a wake-up."""
        assert self._loop is not None
        self._due = self._loop.time() + self._interval
        self._timer = self._loop.call_at(self._due, self._sample)

    def _sample(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        lag = max(0.0, now - self._due)
        self.observe(lag)
        if self.timeline is not None:
            cpu_then, self._cpu = self._cpu, time.thread_time()
            if lag >= TIMELINE_LAG_S:  # with the loop's CPU time over the interval: busy, or not scheduled
                self.timeline.append(("lag", time.monotonic(), lag, self._cpu - cpu_then))
            if now >= self._next_flush:
                self._next_flush = now + 1.0
                self.flush()
        self._arm()

    def flush(self) -> None:
        """Append the timeline's records to its file, one JSON array a line (see docs/performance.md)."""
        if not self.timeline or self._path is None:
            return
        records, self.timeline[:] = list(self.timeline), []
        try:
            with open(self._path, "a", encoding="utf-8") as f:
                for rec in records:
                    f.write(json.dumps(rec, separators=(",", ":")))
                    f.write("\n")
        except OSError as exc:
            log.warning("cannot write the timeline to %s: %s", self._path, exc)

    def note(self, record: Any) -> None:
        """One timeline record (the caller checked that the timeline is on)."""
        timeline = self.timeline
        if timeline is not None and len(timeline) < TIMELINE_MAX:
            timeline.append(record)
