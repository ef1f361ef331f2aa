"""Kafka's windowed rate (``Rate`` over a ``SampledStat``) and the throttle time computed from it.

Pure policy: time is always passed in (integer or float milliseconds); nothing here reads a clock.

Used for ``producer_byte_rate`` / ``consumer_byte_rate`` (KIP-13), ``request_percentage`` (KIP-124) and the
producer-id rate (KIP-936). Controller mutations use :mod:`quotas.token_bucket` instead.

Reference: Apache Kafka ``org.apache.kafka.common.metrics.stats.SampledStat`` (3.8+, which keeps
``samples + 1`` slots), ``stats.Rate`` (``windowSize``), ``Sensor.checkQuotas`` / ``Quota.acceptable``, and
``org.apache.kafka.server.quota.QuotaUtils.throttleTime`` / ``boundedThrottleTime``;
``ClientRequestQuotaManager`` for the request-time units and cap. Behaviour is reproduced, code is not copied.

How Kafka measures (and so how :class:`SampledRate` does)
---------------------------------------------------------
* A *sample* covers one ``window_ms`` from the first event recorded into it. Recording at ``now`` goes into the
  current sample unless ``now - start >= window_ms``; then the next slot (round robin over ``samples + 1``
  slots) is reset to start at ``now``. Recording never purges.
* Measuring first *purges*: every sample whose last event is ``>= samples * window_ms`` old is reset to an
  empty sample starting at ``now``. A sample that started earlier but saw an event recently is kept whole -
  that is why Kafka 3.8 keeps one extra slot, and why the window can span more than ``samples`` windows.
* The rate is ``sum(samples) / window``, where ``window = now - start of the oldest sample``; when fewer than
  ``samples - 1`` whole windows have elapsed, the missing whole windows are added (Kafka pads with
  ``(samples - 1 - full) * window_ms``, so the padded window is ``(samples - 1) * window_ms`` plus the part of
  the current window elapsed, a saw-tooth, not ``max(elapsed, (samples - 1) * window_ms)``). The window is at
  least 1 ms (only reachable with ``samples == 1``; Kafka would divide by zero).
* Measuring an empty rate creates its first sample at ``now`` (Kafka's ``oldest()``), so a later record in the
  same window joins a sample that started at the measurement. Reproduced because it changes the window.
* Violation is ``observed > quota`` (``Quota.acceptable`` is ``value <= bound``); Kafka records first and checks
  after, so a violating request is already counted.

Throttle time
-------------
``round((observed - quota) / quota * window)`` where ``window`` is the rate's *current* window length,
:meth:`SampledRate.window_ms` (``QuotaUtils.throttleTime`` uses ``Rate.windowSize(config, now)``, "the precise
window used by the rate calculation"), rounded like Java's ``Math.round``. Byte rates are not capped; the request
quota is capped at one sample window (``ClientRequestQuotaManager``: ``quota.window.size.seconds * 1000``).

A Kafka quirk worth knowing: with no new records the throttle does *not* shrink monotonically. It equals
``total / quota - window`` and the padded window drops by a whole ``window_ms`` each time another full window
elapses (and when an old sample is purged). Compute the throttle once, at record time, and mute for it - which
is what Kafka does.

Quota changes: Kafka keeps the sensor and swaps its ``MetricConfig`` (``ClientQuotaManager
.updateQuotaMetricConfigs``), so samples survive a new quota. A :class:`SampledRate` holds no quota at all: keep
it and pass the new quota to the throttle functions.
"""

from __future__ import annotations

import math
from array import array

from mypy_extensions import mypyc_attr

from quotas.throttle import java_round

__all__ = [
    "SampledRate",
    "byte_rate_throttle_ms",
    "max_value_in_quota_window",
    "request_throttle_ms",
    "request_time_to_percent",
    "throttle_time_ms",
]


@mypyc_attr(allow_interpreted_subclasses=True)  # tests subclass it (a reference without the purge shortcut)
class SampledRate:
    """Kafka's ``Rate`` over a ``SampledTotal``: units per second over ``samples`` windows of ``window_ms``.

    Memory is fixed: three arrays of ``samples + 1`` doubles, allocated once (one of these exists per quota
    entity, and there may be many). Not thread-safe; the proxy runs on one event loop.
    """

    __slots__ = (
        "_cur_last",
        "_cur_start",
        "_cur_value",
        "_current",
        "_last",
        "_min_last",
        "_oldest",
        "_samples",
        "_size",
        "_starts",
        "_total",
        "_unpadded_from",
        "_values",
        "_whole_ms",
        "_window_ms",
    )

    def __init__(self, samples: int = 11, window_ms: float = 1000) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if not window_ms > 0 or math.isinf(window_ms):
            raise ValueError(f"window_ms must be > 0 and finite, got {window_ms}")
        slots = samples + 1  # Kafka >= 3.8: one extra slot so a sample still inside the window is not recycled
        self._samples = samples
        self._window_ms = window_ms
        self._whole_ms = float(window_ms).is_integer()
        self._unpadded_from = (samples - 1) * window_ms * (1 + 1e-9)
        """An elapsed time from which :meth:`_window` pads nothing, with a margin so that the float floor division
        it stands in for cannot round below ``samples - 1``. Steady traffic is past it, and the division was a
        large share of a charge's cost."""
        self._values = array("d", bytes(8 * slots))
        self._starts = array("d", bytes(8 * slots))
        self._last = array("d", bytes(8 * slots))
        self._size = 0  # slots in use so far (Kafka's growing sample list)
        self._current = 0
        self._min_last = -math.inf  # no slot's last event is older: while it is recent, nothing can expire
        self._total = 0.0
        """Sum of the live slots: kept so a charge reads it instead of summing every slot (re-summed exactly
        whenever a slot is reset, so additions cannot drift for longer than one sample window)."""
        self._oldest = 0.0
        """Earliest start among the live slots (the rate's window begins there); updated when a slot is reset."""
        # The current slot's value, last event and start, as native floats: every record touches only these
        # (compiled, an array item costs a generic call to read or write). The arrays hold the current slot's
        # value and last event only after _flush(): anything reading them for every slot flushes first.
        self._cur_value = 0.0
        self._cur_last = 0.0
        self._cur_start = 0.0

    def _flush(self) -> None:
        """Write the current slot's value and last event into the arrays."""
        if self._size:
            i = self._current
            self._values[i] = self._cur_value
            self._last[i] = self._cur_last

    def _reset(self, i: int, now_ms: float) -> None:
        """Empty slot ``i`` (which must be below ``_size``) to start at ``now_ms``; rare (a new sample, an
        expiry), so the running total and the oldest start are recomputed here rather than kept incrementally.
        The arrays must be flushed (:meth:`_flush`) before the current slot changes or any slot is reset."""
        self._values[i] = 0.0
        self._starts[i] = now_ms
        self._last[i] = now_ms
        if now_ms < self._min_last:  # a clock that went backwards: keep _min_last a lower bound
            self._min_last = now_ms
        size = self._size
        self._total = math.fsum(self._values[:size])
        self._oldest = min(self._starts[:size])
        if i == self._current:
            self._cur_value = 0.0
            self._cur_last = now_ms
            self._cur_start = now_ms

    def _ensure_one(self, now_ms: float) -> None:
        if self._size == 0:
            self._size = 1
            self._current = 0
            self._reset(0, now_ms)

    def record(self, value: float, now_ms: float) -> None:
        """Add ``value`` (bytes, percent-seconds, producer ids...) at ``now_ms``. Record first, then check.

        Negative values (Kafka's "unrecord") are refused: the proxy never takes back what it delivered, and a
        negative total would make the rate meaningless.
        """
        if not 0.0 <= value < math.inf:  # also refuses NaN
            raise ValueError(f"value must be >= 0 and finite, got {value}")
        if self._size == 0:
            self._ensure_one(now_ms)
        if now_ms - self._cur_start >= self._window_ms:
            self._flush()
            i = (self._current + 1) % (self._samples + 1)
            self._current = i
            if i >= self._size:
                self._size = i + 1
            self._reset(i, now_ms)
        self._cur_value += value
        self._total += value
        self._cur_last = now_ms
        if now_ms < self._min_last:  # see _reset
            self._min_last = now_ms

    def _purge(self, now_ms: float) -> None:
        # Why the shortcut: every charge checks expiry two or three times, and a sample can only expire
        # once the oldest "last event" is a whole window set old. _min_last is kept a lower bound of every
        # slot's last time (a time going backwards lowers it at once), so it errs towards looking, never
        # towards skipping.
        expire = self._samples * self._window_ms
        if now_ms - self._min_last < expire:
            return
        self._flush()
        last = self._last
        size = self._size
        for i in range(size):
            if now_ms - last[i] >= expire:
                self._reset(i, now_ms)
        self._min_last = min(last[:size]) if size else -math.inf

    def total(self, now_ms: float) -> float:
        """Sum of the live samples at ``now_ms`` (after purging expired ones)."""
        self._purge(now_ms)
        return self._total

    def window_ms(self, now_ms: float) -> float:
        """The window the rate divides by at ``now_ms`` (Kafka's ``Rate.windowSize``), in ms, at least 1.

        This is the window Kafka's throttle formula uses; pass it to :func:`byte_rate_throttle_ms` /
        :func:`request_throttle_ms`.
        """
        self._purge(now_ms)
        self._ensure_one(now_ms)
        return self._window(now_ms)

    def _window(self, now_ms: float) -> float:
        """:meth:`window_ms` once purged, with at least one sample."""
        elapsed = now_ms - self._oldest
        if elapsed >= self._unpadded_from:  # the usual case
            return elapsed if elapsed >= 1.0 else 1.0  # 1.0, not 1: compiled, a mixed conditional is boxed
        if elapsed < 0:  # a clock that went backwards: treat as no time elapsed
            elapsed = 0.0
        w = self._window_ms
        if self._whole_ms:  # the proxy's windows (whole ms): a division, one less if it rounded up to an integer,
            full = int(elapsed / w)  # is the floor exactly, and float // (fmod, then floor) was a sixth of a young
            if full * w > elapsed:  # rate's charge
                full -= 1
        else:
            full = int(elapsed // w)
        wanted = self._samples - 1
        if full < wanted:
            elapsed += (wanted - full) * w
        return elapsed if elapsed >= 1.0 else 1.0

    def measure(self, now_ms: float) -> float:
        """Observed rate at ``now_ms`` in units per second (never negative)."""
        return self.measure_and_window(now_ms)[0]

    def record_and_measure(self, value: float, now_ms: float) -> tuple[float, float]:
        """:meth:`record` then :meth:`measure_and_window` in one pass (the per-request charge: Kafka records
        first, then checks), with the same result."""
        self.record(value, now_ms)
        if now_ms - self._min_last >= self._samples * self._window_ms:  # _purge's own shortcut, without a call
            self._purge(now_ms)
        window = self._window(now_ms)
        return self._total / (window / 1000.0), window

    def measure_and_window(self, now_ms: float) -> tuple[float, float]:
        """``(measure(now_ms), window_ms(now_ms))`` in one pass: the quota check needs both on every charge."""
        total = self.total(now_ms)
        window = self.window_ms(now_ms)
        return total / (window / 1000.0), window

    def throttle_ms(self, quota: float, now_ms: float, cap_ms: float | None = None) -> int:
        """Kafka's throttle for this rate against ``quota`` at ``now_ms`` (0 within quota); ``cap_ms`` caps it
        (request quota: one sample window), ``None`` for no cap (byte rates)."""
        observed, window = self.measure_and_window(now_ms)
        t = throttle_time_ms(observed, quota, window)
        return t if cap_ms is None else min(t, java_round(cap_ms))

    def record_and_throttle_ms(self, value: float, quota: float, now_ms: float, cap_ms: float | None = None) -> int:
        """Record ``value`` then check, as Kafka's ``Sensor.record(value, now, checkQuotas=true)`` does."""
        self.record(value, now_ms)
        return self.throttle_ms(quota, now_ms, cap_ms)

    def __repr__(self) -> str:
        self._flush()
        live = ", ".join(f"({self._starts[i]:g}..{self._last[i]:g}: {self._values[i]:g})" for i in range(self._size))
        return f"SampledRate(samples={self._samples}, window_ms={self._window_ms:g}, [{live}])"


def throttle_time_ms(observed: float, quota: float, window_ms: float) -> int:
    """``round((observed - quota) / quota * window_ms)`` (Java rounding), 0 when ``observed <= quota``.

    From ``QuotaUtils.throttleTime``: the delay X that brings ``observed * W / (W + X)`` down to ``quota``.
    """
    if not quota > 0:
        raise ValueError(f"quota must be > 0, got {quota}")
    if not observed > quota:
        return 0
    return max(0, java_round((observed - quota) / quota * window_ms))


def byte_rate_throttle_ms(observed: float, quota: float, window_ms: float) -> int:
    """Throttle for a byte-rate quota (KIP-13): :func:`throttle_time_ms`, no cap (``ClientQuotaManager``)."""
    return throttle_time_ms(observed, quota, window_ms)


def request_throttle_ms(observed: float, quota: float, window_ms: float, cap_ms: float) -> int:
    """Throttle for ``request_percentage`` (KIP-124): :func:`throttle_time_ms` capped at ``cap_ms``.

    ``window_ms`` is the rate's current window (:meth:`SampledRate.window_ms`); ``cap_ms`` is one *sample*
    window (``quota.window.size.seconds * 1000``, 1000 ms by default), so a GC pause or one huge request cannot
    stall heartbeats for long.
    """
    return min(throttle_time_ms(observed, quota, window_ms), java_round(cap_ms))


def request_time_to_percent(time_ms: float) -> float:
    """Convert time spent on a request to the unit the request-quota rate records: percent-seconds of a thread.

    Kafka records ``nanos * 100 / 1e9`` (``ClientRequestQuotaManager.nanosToPercentage``), so that the rate in
    units/s reads directly as "% of one thread": 10 ms every second -> 1.0 (%).
    """
    return time_ms / 10.0


def max_value_in_quota_window(quota: float, samples: int, window_ms: float) -> float:
    """Largest value that can be recorded at once without certain throttling: ``quota * (samples - 1) * window``.

    Kafka (``ClientQuotaManager.maxValueInQuotaWindow``) caps a throttled-by-design fetch size with it; a proxy
    can use it the same way, e.g. to bound a Fetch's ``max_bytes``.
    """
    return quota * (samples - 1) * window_ms / 1000.0
