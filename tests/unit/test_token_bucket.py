"""KIP-599 token bucket and strict / permissive admission: the reference vectors, edge cases, properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.token_bucket import (
    THROTTLING_QUOTA_EXCEEDED,
    Admission,
    TokenBucket,
    admit,
    admit_permissive,
    admit_strict,
)

# ----------------------------------------------------------------------------------------- reference vectors


def test_kip599_example_twelve_seconds() -> None:
    """R = 5/s, B = 500 (100 x 1 s); 7 topics x 80 partitions -> tokens -60 -> 12 s."""
    bucket = TokenBucket(5, samples=100, window_s=1.0, now_ms=0)
    assert bucket.burst == 500
    admit_permissive(bucket, [80] * 7, 0)
    assert bucket.tokens(0) == -60
    assert bucket.throttle_ms(0) == 12_000


def test_kip599_example_strict_admits_all_seven() -> None:
    """Strict admission only looks at the balance *before* each topic: 20 tokens left admit the 7th topic."""
    bucket = TokenBucket(5, 100, 1.0, 0)
    result = admit(bucket, [80] * 7, 0, strict=True)
    assert result.admitted == [True] * 7
    assert bucket.tokens(0) == -60
    assert result.throttle_ms == 0  # Kafka: no topic rejected -> no violation observed -> no throttle
    # ... and the next request is rejected, throttled for what is left of the 12 s.
    nxt = admit(bucket, [1], 2000, strict=True)
    assert nxt == Admission([False], 10_000)


def test_strict_two_topics_rate_two() -> None:
    """R = 2/s, 10 x 1 s (B = 20), two topics of 30: one admitted, one rejected (89), throttle <= 5000 ms."""
    bucket = TokenBucket(2, samples=10, window_s=1.0, now_ms=0)
    assert bucket.burst == 20
    result = admit(bucket, [30, 30], 0, strict=True)
    assert result.admitted == [True, False]
    assert THROTTLING_QUOTA_EXCEEDED == 89
    assert 0 < result.throttle_ms <= 5000
    assert result.throttle_ms == 5000
    assert bucket.tokens(0) == -10  # nothing recorded for the rejected topic


def test_permissive_two_topics_rate_two() -> None:
    bucket = TokenBucket(2, samples=10, window_s=1.0, now_ms=0)
    result = admit(bucket, [30, 30], 0, strict=False)
    assert result.admitted == [True, True]
    assert 0 < result.throttle_ms <= 20_000
    assert result.throttle_ms == 20_000
    assert bucket.tokens(0) == -40


def test_bucket_at_minus_ten_rate_ten_is_one_second() -> None:
    bucket = TokenBucket(10, now_ms=0)
    bucket.record(bucket.burst + 10, 0)
    assert bucket.tokens(0) == -10
    assert bucket.throttle_ms(0) == 1000


def test_throttle_shrinks_by_elapsed_time() -> None:
    """8000 ms recorded at t -> 3000 ms at t + 5 s (Kafka: lastThrottleTimeMs - elapsed)."""
    t = 1_000_000
    bucket = TokenBucket(10, now_ms=t)
    bucket.record(bucket.burst + 80, t)
    assert bucket.throttle_ms(t) == 8000
    assert bucket.throttle_ms(t + 5000) == 3000
    assert bucket.throttle_ms(t + 8000) == 0
    assert bucket.throttle_ms(t + 9000) == 0


# ----------------------------------------------------------------------------------------- bucket mechanics


def test_starts_full_and_refills_up_to_burst() -> None:
    bucket = TokenBucket(2, samples=10, window_s=1.0, now_ms=500)
    assert bucket.tokens(500) == 20
    bucket.record(15, 500)
    assert bucket.tokens(500) == 5
    assert bucket.tokens(1500) == 7  # + 2/s x 1 s
    assert bucket.tokens(100_000) == 20  # capped at burst


def test_default_now_is_harmless() -> None:
    bucket = TokenBucket(3)  # positional (rate, samples, window_s, now_ms) with defaults
    assert bucket.burst == 33
    assert bucket.tokens(1_700_000_000_000) == 33


def test_record_may_go_far_below_zero() -> None:
    bucket = TokenBucket(1, now_ms=0)
    bucket.record(1_000_011, 0)
    assert bucket.tokens(0) == -1_000_000
    assert bucket.exhausted(0)
    assert bucket.throttle_ms(0) == 1_000_000_000


def test_zero_tokens_is_not_exhausted() -> None:
    bucket = TokenBucket(1, now_ms=0)
    bucket.record(11, 0)
    assert bucket.tokens(0) == 0
    assert not bucket.exhausted(0)
    assert bucket.throttle_ms(0) == 0
    assert admit_strict(bucket, [5, 5], 0) == [True, False]


def test_negative_record_capped_at_burst() -> None:
    bucket = TokenBucket(1, now_ms=0)
    bucket.record(-100, 0)
    assert bucket.tokens(0) == bucket.burst


def test_throttle_rounds_like_java() -> None:
    bucket = TokenBucket(2000, samples=1, window_s=1.0, now_ms=0)
    bucket.record(2001, 0)  # -1 token at 2000 per s = 0.5 ms -> Math.round -> 1 (Python's round: 0)
    assert bucket.tokens(0) == -1
    assert bucket.throttle_ms(0) == 1


def test_clock_going_backwards_neither_refills_nor_drains() -> None:
    bucket = TokenBucket(10, now_ms=10_000)
    bucket.record(bucket.burst + 10, 10_000)
    assert bucket.tokens(5_000) == -10
    assert bucket.tokens(10_500) == -5


def test_set_rate_settles_old_rate_then_switches() -> None:
    bucket = TokenBucket(10, samples=10, window_s=1.0, now_ms=0)  # B = 100
    bucket.record(150, 0)  # -50
    bucket.set_rate(1, 2000)  # 2 s at 10/s -> -30, then 1/s, B = 10
    assert bucket.rate == 1
    assert bucket.burst == 10
    assert bucket.tokens(2000) == -30
    assert bucket.throttle_ms(2000) == 30_000
    assert bucket.tokens(12_000) == -20


def test_set_rate_lower_clamps_to_new_burst() -> None:
    bucket = TokenBucket(10, samples=10, window_s=1.0, now_ms=0)
    bucket.set_rate(2, 0)
    assert bucket.tokens(0) == 20


def test_set_rate_higher_does_not_top_up() -> None:
    bucket = TokenBucket(1, samples=10, window_s=1.0, now_ms=0)
    bucket.record(10, 0)
    bucket.set_rate(100, 0)
    assert bucket.burst == 1000
    assert bucket.tokens(0) == 0
    assert bucket.tokens(1000) == 100


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_rate_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(bad)
    with pytest.raises(ValueError):
        TokenBucket(1).set_rate(bad, 0)


def test_constructor_validates_window() -> None:
    with pytest.raises(ValueError):
        TokenBucket(1, samples=0)
    with pytest.raises(ValueError):
        TokenBucket(1, window_s=0)


def test_slots() -> None:
    assert not hasattr(TokenBucket(1), "__dict__")


# ----------------------------------------------------------------------------------------- admission


def test_strict_rejects_everything_once_exhausted() -> None:
    bucket = TokenBucket(1, now_ms=0)
    bucket.record(12, 0)
    assert admit_strict(bucket, [1, 2, 3], 0) == [False, False, False]
    assert bucket.tokens(0) == -1  # nothing recorded


def test_strict_admits_after_refill() -> None:
    bucket = TokenBucket(1, now_ms=0)
    bucket.record(12, 0)  # -1
    assert admit_strict(bucket, [3], 999) == [False]
    assert admit_strict(bucket, [3, 1], 1001) == [True, False]  # 1000 ms: ~0 in floating point


def test_empty_request() -> None:
    bucket = TokenBucket(1, now_ms=0)
    bucket.record(100, 0)
    assert admit(bucket, [], 0, strict=True) == Admission([], 0)
    assert admit(bucket, [], 0, strict=False) == Admission([], 0)
    assert admit_strict(bucket, [], 0) == []


def test_permissive_records_everything_and_throttles_on_debt() -> None:
    bucket = TokenBucket(1, now_ms=0)
    result = admit(bucket, [5, 5, 5], 0, strict=False)
    assert result == Admission([True, True, True], 4000)
    ok = admit(TokenBucket(1), [5], 0, strict=False)
    assert ok == Admission([True], 0)


def test_admit_takes_a_generator() -> None:
    bucket = TokenBucket(1, now_ms=0)
    assert admit_strict(bucket, (n for n in [12, 1]), 0) == [True, False]


# ----------------------------------------------------------------------------------------- properties

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(0, 3000), st.floats(-50, 500, allow_nan=False)),
        st.tuples(st.just("rate"), st.integers(0, 3000), st.floats(0.01, 100, allow_nan=False)),
        st.tuples(st.just("strict"), st.integers(0, 3000), st.lists(st.integers(0, 300), max_size=8)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.01, 100, allow_nan=False), samples=st.integers(1, 20), ops=_ops)
def test_tokens_never_exceed_burst(rate: float, samples: int, ops: list) -> None:
    bucket = TokenBucket(rate, samples, 1.0, 0)
    now = 0
    for kind, dt, arg in ops:
        now += dt
        if kind == "record":
            bucket.record(arg, now)
        elif kind == "rate":
            bucket.set_rate(arg, now)
        else:
            admit_strict(bucket, arg, now)
        assert bucket.tokens(now) <= bucket.burst
        assert bucket.throttle_ms(now) >= 0


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.1, 50, allow_nan=False),
    samples=st.integers(1, 20),
    requests=st.lists(
        st.tuples(st.integers(0, 5000), st.lists(st.integers(0, 200), max_size=6)), min_size=1, max_size=30
    ),
)
def test_strict_admits_at_most_burst_plus_refill_plus_one_topic(rate: float, samples: int, requests: list) -> None:
    """In any interval T, strict admission lets through at most B + R*T + the largest single topic."""
    bucket = TokenBucket(rate, samples, 1.0, 0)
    now = 0
    log: list[tuple[int, int]] = []  # (time, partitions admitted) per request
    largest = 0
    for dt, counts in requests:
        now += dt
        admitted = admit_strict(bucket, counts, now)
        got = sum(c for c, ok in zip(counts, admitted, strict=True) if ok)
        largest = max([largest, *(c for c, ok in zip(counts, admitted, strict=True) if ok)])
        log.append((now, got))
    for i in range(len(log)):
        total = 0
        for j in range(i, len(log)):
            total += log[j][1]
            interval_s = (log[j][0] - log[i][0]) / 1000
            assert total <= bucket.burst + rate * interval_s + largest + 1e-6


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.01, 100, allow_nan=False),
    debt=st.floats(0, 1e6, allow_nan=False),
    probes=st.lists(st.integers(0, 10_000_000), min_size=1, max_size=20),
)
def test_throttle_non_increasing_without_records(rate: float, debt: float, probes: list) -> None:
    bucket = TokenBucket(rate, now_ms=0)
    bucket.record(bucket.burst + debt, 0)
    prev = bucket.throttle_ms(0)
    prev_tokens = bucket.tokens(0)
    for t in sorted(probes):
        cur = bucket.throttle_ms(t)
        assert cur <= prev
        assert bucket.tokens(t) >= prev_tokens
        prev, prev_tokens = cur, bucket.tokens(t)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 100, allow_nan=False),
    debt=st.floats(0.001, 1e5, allow_nan=False),
    elapsed=st.integers(0, 10_000_000),
)
def test_throttle_decays_like_kafka(rate: float, debt: float, elapsed: int) -> None:
    """Kafka reports max(0, throttle_at_record - elapsed); the refilled bucket gives the same (+-1 ms rounding)."""
    bucket = TokenBucket(rate, now_ms=0)
    bucket.record(bucket.burst + debt, 0)
    at_record = bucket.throttle_ms(0)
    assert abs(bucket.throttle_ms(elapsed) - max(0, at_record - elapsed)) <= 1
