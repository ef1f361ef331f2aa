"""KIP-599's token bucket for ``controller_mutation_rate``, and strict / permissive admission of topics.

Pure policy: time is always passed in (integer or float milliseconds); nothing here reads a clock.

Reference: Apache Kafka ``org.apache.kafka.common.metrics.stats.TokenBucket``, ``Sensor.checkQuotas`` (a
TokenBucket violates when its value is ``< 0``), ``kafka.server.ControllerMutationQuotaManager``
(``StrictControllerMutationQuota``, ``PermissiveControllerMutationQuota``, ``throttleTimeMs``) and
``ClientQuotaManager.updateQuotaMetricConfigs``. Behaviour is reproduced, code is not copied.

Why a token bucket and not :class:`quotas.rate.SampledRate`: one large burst keeps a sampled average above the
quota until its sample expires (``samples * window``), far longer than the burst deserves. Tokens refill
continuously, so a client waits exactly ``-tokens / rate``.

The bucket
----------
* Burst ``B = rate * samples * window_s`` (``controller.quota.window.num`` x ``.size.seconds`` x quota).
* It starts full (Kafka starts at 0 tokens with its clock at 0; the first refill fills it).
* Refill: ``tokens = min(B, tokens + rate * dt)``; ``record(n)``: ``tokens = min(B, tokens - n)``. Tokens may go
  far below zero: one topic is never split, whatever its partition count.
* Throttle: ``round(-tokens / rate * 1000)`` ms when ``tokens < 0``, else 0; it shrinks as the bucket refills
  (Kafka: ``lastThrottleTimeMs - elapsed``, the same thing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from quotas.throttle import java_round

__all__ = [
    "THROTTLING_QUOTA_EXCEEDED",
    "Admission",
    "TokenBucket",
    "admit",
    "admit_permissive",
    "admit_strict",
]

THROTTLING_QUOTA_EXCEEDED: Final = 89
"""Error code for a topic rejected by a strict controller-mutation quota."""


class TokenBucket:
    """Tokens for one quota entity: refill ``rate`` per second up to ``burst``; may go negative.

    One exists per entity with a ``controller_mutation_rate`` quota, hence ``__slots__``. Not thread-safe.
    ``now_ms`` only anchors the refill clock: the bucket starts full, so it makes no difference which past
    time it is given.
    """

    __slots__ = ("_burst", "_last_ms", "_rate", "_refilled", "_samples", "_tokens", "_window_s")

    def __init__(self, rate: float, samples: int = 11, window_s: float = 1.0, now_ms: float = 0.0) -> None:
        _check_rate(rate)
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if not window_s > 0 or math.isinf(window_s):
            raise ValueError(f"window_s must be > 0 and finite, got {window_s}")
        self._rate = float(rate)
        self._samples = samples
        self._window_s = float(window_s)
        self._burst = self._rate * samples * self._window_s
        self._tokens = self._burst
        self._last_ms = now_ms
        self._refilled = 0.0
        """Every token the refill has added since creation, clamped or not (:meth:`refilled`)."""

    @property
    def rate(self) -> float:
        """Refill rate R, units (partition mutations) per second: the quota."""
        return self._rate

    @property
    def burst(self) -> float:
        """Bucket size B = R x samples x window_s."""
        return self._burst

    def _refill(self, now_ms: float) -> None:
        dt = now_ms - self._last_ms
        if dt > 0:  # a clock that went backwards neither refills nor drains
            add = self._rate * dt / 1000.0
            self._refilled += add
            t = self._tokens + add
            self._tokens = t if t < self._burst else self._burst
            self._last_ms = now_ms

    def refilled(self, now_ms: float) -> float:
        """Every token refilled from creation to ``now_ms``, at the rates in force as time passed, burst clamp
        ignored: a running total a debt can be measured against. A paced request owing ``d`` tokens when it is
        charged is paid once this total has grown by ``d`` (:meth:`quotas.manager.QuotaManager.pace_mark`),
        however the rate changes meanwhile (the clamp only bites once no debt is left). Why: the wait of a request
        already charged must follow a rate raised or lowered while it waits (a fleet member's lease), without
        counting what later requests charged."""
        self._refill(now_ms)
        return self._refilled

    def tokens(self, now_ms: float) -> float:
        """Tokens at ``now_ms`` after refilling (Kafka's ``tokens`` metric); ``< 0`` means exhausted."""
        self._refill(now_ms)
        return self._tokens

    def exhausted(self, now_ms: float) -> bool:
        """True when tokens are below zero: a strict request is rejected, a quota violation is reported."""
        return self.tokens(now_ms) < 0

    def record(self, n: float, now_ms: float) -> None:
        """Spend ``n`` tokens at ``now_ms``, unconditionally (may go far below zero)."""
        self._refill(now_ms)
        t = self._tokens - n
        self._tokens = t if t < self._burst else self._burst

    def throttle_ms(self, now_ms: float) -> int:
        """Time until tokens are back to zero, ``round(-tokens / rate * 1000)`` ms; 0 when not negative.

        Shrinks as time passes without new records (non-increasing in ``now_ms``).
        """
        t = self.tokens(now_ms)
        if t >= 0:
            return 0
        return java_round(-t / self._rate * 1000.0)

    def set_rate(self, rate: float, now_ms: float) -> None:
        """Apply a quota altered at runtime (AlterClientQuotas), keeping the client's debt and credit.

        Tokens accrued up to ``now_ms`` are settled at the old rate, then the new rate and burst apply and the
        tokens are clamped to the new burst. A debt (negative tokens) is kept: lowering or raising the quota
        must not forgive a burst already taken. Raising the quota does not top the bucket up either.

        Kafka does not rebuild the sensor: it swaps the metric's ``MetricConfig`` in place
        (``ClientQuotaManager.updateQuotaMetricConfigs``), so tokens survive, and its ``TokenBucket`` reads the
        new quota lazily - the time since its last update is refilled at the *new* rate. We settle that interval
        at the old rate instead, since that is the quota that was in force; the difference is at most
        ``|new - old| x (time since the last record)``, and disappears once the bucket is full.
        """
        _check_rate(rate)
        self._refill(now_ms)
        self._rate = float(rate)
        self._burst = self._rate * self._samples * self._window_s
        if self._tokens > self._burst:
            self._tokens = self._burst

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self._rate:g}, burst={self._burst:g}, tokens={self._tokens:g} @ {self._last_ms:g})"


def _check_rate(rate: float) -> None:
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"rate must be > 0 and finite, got {rate}")


def admit_strict(bucket: TokenBucket, counts: Iterable[float], now_ms: float) -> list[bool]:
    """Strict admission (new clients), per topic in request order.

    A topic met while tokens are ``< 0`` is rejected (THROTTLING_QUOTA_EXCEEDED) and nothing is recorded for
    it; otherwise it is admitted and its whole partition count is spent, even far below zero. Kafka's
    ``StrictControllerMutationQuota.record``: ``checkQuotas`` then ``record(permits, checkQuotas=false)``.
    """
    admitted: list[bool] = []
    for n in counts:
        if bucket.tokens(now_ms) < 0:
            admitted.append(False)
        else:
            bucket.record(n, now_ms)
            admitted.append(True)
    return admitted


def admit_permissive(bucket: TokenBucket, counts: Iterable[float], now_ms: float) -> list[bool]:
    """Permissive admission (old clients, which know no THROTTLING_QUOTA_EXCEEDED): admit and record every
    topic; the client is held back by muting for :meth:`TokenBucket.throttle_ms` instead."""
    admitted: list[bool] = []
    for n in counts:
        bucket.record(n, now_ms)
        admitted.append(True)
    return admitted


class Admission(NamedTuple):
    """Outcome of one mutation request against a bucket."""

    admitted: list[bool]
    """Per topic, in request order: True admitted (and charged), False rejected with error 89."""
    throttle_ms: int
    """The controller-mutation ``throttle_time_ms`` exactly as Kafka computes it at ``now_ms``; if the response
    goes out later, send ``max(0, throttle_ms - elapsed)`` (``AbstractControllerMutationQuota.throttleTime``)."""


def admit(bucket: TokenBucket, counts: Sequence[float], now_ms: float, *, strict: bool) -> Admission:
    """Admit a mutation request and compute its throttle with Kafka's rules.

    Kafka only reports a throttle when a quota *violation was observed*: strict requests throttle only if some
    topic was rejected (so a request that is fully admitted but drives tokens negative gets 0 - its *next*
    request is rejected instead); permissive requests throttle if tokens are negative after recording at least
    one topic. An empty request throttles 0 either way. :meth:`TokenBucket.throttle_ms` alone would throttle on
    any negative balance - stricter than Kafka.
    """
    if strict:
        admitted = admit_strict(bucket, counts, now_ms)
        violated = not all(admitted)
    else:
        admitted = admit_permissive(bucket, counts, now_ms)
        violated = bool(admitted)
    return Admission(admitted, bucket.throttle_ms(now_ms) if violated else 0)
