"""Kafka's sampled Rate and throttle-time formula: the reference vectors, the window edge cases, properties."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from quotas.rate import (
    SampledRate,
    byte_rate_throttle_ms,
    max_value_in_quota_window,
    request_throttle_ms,
    request_time_to_percent,
    throttle_time_ms,
)

# ----------------------------------------------------------------------------------------- reference vectors


def test_byte_rate_vector_2100_ms() -> None:
    """11 x 1 s, quota 500 B/s; 400 B every second for 10 s, then 2300 B at +0.5 s -> 600 B/s -> 2100 ms."""
    rate = SampledRate(11, 1000)
    for t in range(0, 10_000, 1000):
        rate.record(400, t)
    rate.record(2300, 9500)
    assert rate.total(9500) == 6300
    assert rate.window_ms(9500) == 10_500
    assert rate.measure(9500) == pytest.approx(600)
    assert byte_rate_throttle_ms(rate.measure(9500), 500, rate.window_ms(9500)) == 2100
    assert rate.throttle_ms(500, 9500) == 2100


def test_byte_rate_vector_record_then_check() -> None:
    rate = SampledRate()
    for t in range(0, 10_000, 1000):
        assert rate.record_and_throttle_ms(400, 500, t) == 0
    assert rate.record_and_throttle_ms(2300, 500, 9500) == 2100


def test_kip13_example_two_seconds() -> None:
    """5 MB/s over a 10 s window, at quota for 9 s, then a 15 MB burst: (60 - 50) / 5 = 2 s."""
    mb = 1_000_000
    assert byte_rate_throttle_ms(60 * mb / 10, 5 * mb, 10_000) == 2000
    rate = SampledRate(11, 1000)  # the window is 10 s once 10 samples exist
    for t in range(0, 9000, 1000):
        rate.record(5 * mb, t)
    rate.record(15 * mb, 9000)
    assert rate.window_ms(9000) == 10_000
    assert rate.throttle_ms(5 * mb, 9000) == 2000


def _request_load(last_request_ms: float) -> SampledRate:
    rate = SampledRate(11, 1000)
    for t in range(0, 10_000, 1000):
        rate.record(request_time_to_percent(4), t)  # 4 ms of thread time per second = 0.4 %
    rate.record(request_time_to_percent(last_request_ms), 9500)
    return rate


def test_request_quota_vector_210_ms() -> None:
    rate = _request_load(67.1)
    observed = rate.measure(9500)
    assert observed == pytest.approx(1.02)
    assert request_throttle_ms(observed, 1.0, rate.window_ms(9500), 1000) == 210
    assert rate.throttle_ms(1.0, 9500, cap_ms=1000) == 210


def test_request_quota_vector_capped_at_one_window() -> None:
    rate = _request_load(500)
    observed = rate.measure(9500)
    assert throttle_time_ms(observed, 1.0, rate.window_ms(9500)) > 1000
    assert request_throttle_ms(observed, 1.0, rate.window_ms(9500), 1000) == 1000
    assert rate.throttle_ms(1.0, 9500, cap_ms=1000) == 1000


def test_request_time_to_percent() -> None:
    assert request_time_to_percent(10) == 1.0  # 10 ms of a 1000 ms window = 1 % of a thread
    assert request_time_to_percent(0) == 0.0


# ----------------------------------------------------------------------------------------- throttle formula


def test_throttle_zero_within_quota() -> None:
    assert throttle_time_ms(500, 500, 10_000) == 0  # equal is acceptable (Quota.acceptable: value <= bound)
    assert throttle_time_ms(10, 500, 10_000) == 0
    assert byte_rate_throttle_ms(0, 1, 1) == 0
    assert request_throttle_ms(0.5, 1, 10_000, 1000) == 0


def test_throttle_rounds_like_java() -> None:
    # (observed - quota) / quota * window = 2.5 -> Math.round gives 3 (Python's round would give 2)
    assert throttle_time_ms(1.25, 1.0, 10) == 3
    assert throttle_time_ms(1.05, 1.0, 10) == 1  # 0.5000000000000004 -> 1


def test_byte_rate_throttle_has_no_cap() -> None:
    assert byte_rate_throttle_ms(1_000_000, 1, 10_000) == 9_999_990_000


def test_throttle_rejects_non_positive_quota() -> None:
    with pytest.raises(ValueError):
        throttle_time_ms(1, 0, 1000)


def test_max_value_in_quota_window() -> None:
    assert max_value_in_quota_window(500, 11, 1000) == 5000


# ----------------------------------------------------------------------------------------- window edge cases


def test_empty_rate_is_zero() -> None:
    rate = SampledRate()
    assert rate.measure(123_456) == 0
    assert rate.throttle_ms(1, 123_456) == 0


def test_window_padding_is_a_saw_tooth() -> None:
    """Kafka adds (samples - 1 - full windows) whole windows, not max(elapsed, (samples - 1) * window)."""
    rate = SampledRate(11, 1000)
    rate.record(100, 0)
    assert rate.window_ms(0) == 10_000
    assert rate.window_ms(500) == 10_500
    assert rate.measure(500) == pytest.approx(100 / 10.5)
    assert rate.window_ms(999) == 10_999
    assert rate.window_ms(1000) == 10_000  # one full window elapsed: one less padding window
    assert rate.window_ms(2500) == 10_500
    assert rate.window_ms(10_000) == 10_000  # 10 full windows: no padding
    assert rate.window_ms(10_999) == 10_999


def test_throttle_not_monotone_without_records_kafka_quirk() -> None:
    """Because of the saw-tooth padding the throttle can grow with no new records (Kafka does the same)."""
    rate = SampledRate(11, 1000)
    rate.record(10_000, 0)
    before = rate.throttle_ms(100, 999)
    after = rate.throttle_ms(100, 1000)
    assert after > before
    assert after - before == 999


def test_minimum_window_one_ms() -> None:
    rate = SampledRate(samples=1, window_ms=1000)
    rate.record(5, 0)
    assert rate.window_ms(0) == 1
    assert rate.measure(0) == pytest.approx(5000)  # 5 per ms
    assert rate.window_ms(400) == 400


def test_purge_after_idle() -> None:
    rate = SampledRate(11, 1000)
    rate.record(1000, 0)
    assert rate.total(10_999) == 1000  # last event 10 999 ms ago: < 11 x 1000, still counted
    assert rate.total(11_000) == 0  # >= samples x window: purged
    assert rate.measure(11_000) == 0
    assert rate.window_ms(11_000) == 10_000  # the purged sample restarts at now: fully padded


def test_purge_is_by_last_event_not_start() -> None:
    """A sample that started long ago but saw a recent event is kept whole (window may exceed samples x size)."""
    rate = SampledRate(2, 1000)
    rate.record(1, 0)
    rate.record(1, 999)  # same sample (started at 0), last event 999
    assert rate.total(2500) == 2  # 2500 - 999 < 2000
    assert rate.window_ms(2500) == 2500
    assert rate.total(2998) == 2
    assert rate.total(2999) == 0  # 2999 - 999 = 2000 >= samples x window


def test_keeps_samples_plus_one_slots() -> None:
    """Kafka >= 3.8: a third sample (samples=2) does not overwrite one that still has a live event."""
    rate = SampledRate(2, 1000)
    rate.record(1, 0)
    rate.record(10, 999)  # sample A: start 0, last 999
    rate.record(1, 1000)  # sample B
    rate.record(1, 2000)  # sample C: with only `samples` slots this would have recycled A
    assert rate.total(2000) == 13
    assert rate.window_ms(2000) == 2000
    assert rate.measure(2000) == pytest.approx(6.5)
    # Once A's last event is samples x window old it goes: B and C remain, over B's start.
    assert rate.total(2999) == 2
    assert rate.window_ms(2999) == 1999


def test_slots_are_recycled_round_robin() -> None:
    rate = SampledRate(3, 100)
    for t in range(0, 100_000, 100):
        rate.record(1, t)
    assert len(rate._values) == 4  # fixed memory: samples + 1 slots
    assert rate.total(99_900) == 3  # 99 900, 99 800, 99 700; 99 600 is 300 ms old (>= 3 x 100): purged
    assert rate.window_ms(99_900) == 200


def test_measuring_empty_rate_starts_its_first_sample() -> None:
    """Kafka's oldest() creates the first sample at the measurement time; a later record joins it."""
    rate = SampledRate(11, 1000)
    rate.measure(0)
    rate.record(100, 500)
    assert rate.window_ms(500) == 10_500  # the sample started at 0, not at 500


def test_new_sample_when_window_complete() -> None:
    rate = SampledRate(11, 1000)
    rate.record(1, 0)
    rate.record(1, 999)
    rate.record(1, 1000)
    assert rate._size == 2


def test_clock_going_backwards_is_harmless() -> None:
    rate = SampledRate(11, 1000)
    rate.record(100, 5000)
    assert rate.window_ms(4000) == 10_000
    assert rate.measure(4000) >= 0


def test_float_times() -> None:
    rate = SampledRate(11, 1000)
    rate.record(1000, 0.25)
    assert rate.window_ms(500.75) == pytest.approx(10_500.5)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_record_rejects_bad_values(bad: float) -> None:
    with pytest.raises(ValueError):
        SampledRate().record(bad, 0)


@pytest.mark.parametrize(("samples", "window"), [(0, 1000), (11, 0), (11, -5), (11, float("inf"))])
def test_constructor_validates(samples: int, window: float) -> None:
    with pytest.raises(ValueError):
        SampledRate(samples, window)


def test_slots_keep_instances_small() -> None:
    rate = SampledRate()
    assert not hasattr(rate, "__dict__")


# ----------------------------------------------------------------------------------------- properties

_events = st.lists(
    st.tuples(st.integers(0, 5000), st.floats(0, 1e9, allow_nan=False, allow_infinity=False)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.integers(1, 12),
    window=st.integers(1, 3000),
    events=_events,
    probe=st.integers(0, 100_000),
)
def test_rate_never_negative_and_memory_bounded(samples: int, window: int, events: list, probe: int) -> None:
    rate = SampledRate(samples, window)
    now = 0
    for dt, value in events:
        now += dt
        rate.record(value, now)
        assert rate.measure(now) >= 0
        assert rate.window_ms(now) >= 1
    assert rate.measure(now + probe) >= 0
    assert rate._size <= samples + 1
    assert len(rate._values) == samples + 1


@settings(max_examples=200, deadline=None)
@given(
    samples=st.integers(1, 12),
    window=st.integers(1, 3000),
    events=_events,
    later=st.integers(0, 100_000),
)
def test_total_is_what_was_recorded_recently(samples: int, window: int, events: list, later: int) -> None:
    """Nothing is lost while live, and everything is forgotten once samples x window passes with no events."""
    rate = SampledRate(samples, window)
    now = 0
    recorded = 0.0
    for dt, value in events:
        now += dt
        rate.record(value, now)
        recorded += value
    live = rate.total(now)
    assert live <= recorded * (1 + 1e-12) + 1e-9
    assert rate.total(now + samples * window + later) == 0


@settings(max_examples=300, deadline=None)
@given(
    samples=st.integers(1, 12),
    window=st.one_of(st.integers(1, 3000), st.floats(0.01, 3000, allow_nan=False)),
    start=st.integers(0, 10**9),
    elapsed=st.one_of(st.floats(0, 50_000, allow_nan=False), st.integers(0, 50_000)),
)
@example(samples=11, window=1000, start=0, elapsed=10_000)  # where the shortcut begins
@example(samples=1, window=0.5, start=0, elapsed=0.7)  # past the shortcut's start, still under the 1 ms floor
@example(samples=3, window=333.3, start=10**9, elapsed=999.9)
@example(samples=11, window=0.14960774247194566, start=0, elapsed=1.4960774247194566)  # e / w rounds up to 10
@example(samples=11, window=1000, start=0, elapsed=8999.999999999998)
def test_window_is_kafkas_padded_window(samples: int, window: float, start: int, elapsed: float) -> None:
    """The window from one sample is Kafka's ``Rate.windowSize``: elapsed plus the whole windows missing from
    ``samples - 1``, at least 1 ms, whether or not elapsed is past the point where the padding is skipped."""
    rate = SampledRate(samples, window)
    rate.record(1, start)
    now = start + elapsed
    elapsed = now - start  # as the rate sees it
    if elapsed >= samples * window:  # purged: the sample starts again at now
        elapsed = 0
    full = int(elapsed // window)
    wanted = elapsed + (samples - 1 - full) * window if full < samples - 1 else elapsed
    assert rate.window_ms(now) == max(wanted, 1)


@settings(max_examples=200, deadline=None)
@given(
    observed=st.floats(0, 1e12, allow_nan=False),
    quota=st.floats(1e-3, 1e9, allow_nan=False),
    window=st.floats(1, 1e6, allow_nan=False),
    cap=st.integers(0, 10_000),
)
def test_throttle_formula_properties(observed: float, quota: float, window: float, cap: int) -> None:
    t = throttle_time_ms(observed, quota, window)
    assert t >= 0
    assert (t == 0) or observed > quota
    assert request_throttle_ms(observed, quota, window, cap) == min(t, cap)
    assert byte_rate_throttle_ms(observed, quota, window) == t


class _AlwaysPurging(SampledRate):
    """SampledRate without the expiry shortcut: the reference the shortcut must agree with."""

    __slots__ = ()

    def _purge(self, now_ms: float) -> None:
        expire = self._samples * self._window_ms
        self._flush()
        for i in range(self._size):
            if now_ms - self._last[i] >= expire:
                self._reset(i, now_ms)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.integers(1, 6),
    window=st.sampled_from([1.0, 10.0, 100.0, 250.0]),
    steps=st.lists(st.tuples(st.integers(-50, 3000), st.floats(0, 1e6), st.booleans()), max_size=60),
)
# Found by hypothesis in CI: a record 1 ms back in time lowered a slot's last event below _min_last, so the
# shortcut skipped an expiry that the full scan made.
@example(samples=1, window=1.0, steps=[(0, 0.0, False), (-1, 1.0, False), (1, 0.0, True)])
def test_expiry_shortcut_changes_nothing(samples: int, window: float, steps) -> None:
    fast, slow = SampledRate(samples, window), _AlwaysPurging(samples, window)
    now = 1_000_000.0
    for dt, value, check_only in steps:
        now += dt  # now and then backwards
        if not check_only:
            fast.record(value, now)
            slow.record(value, now)
        assert fast.measure_and_window(now) == slow.measure_and_window(now)
        assert fast.throttle_ms(5000.0, now) == slow.throttle_ms(5000.0, now)
