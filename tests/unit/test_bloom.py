"""Bloom filter sizing, no false negatives, measured false-positive rate, and the KIP-936 rotation schedule."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.bloom import BloomFilter, TimeControlledBloomFilter, bit_positions, bloom_size

W = 3_600_000  # ms, producer.id.quota.window.size.seconds default
HALF = W // 2


def test_sizing_follows_the_formulas():
    assert bloom_size(1000, 0.01) == (9586, 7)
    n, p = 123_456, 0.001
    m, k = bloom_size(n, p)
    assert m == math.ceil(-n * math.log(p) / math.log(2) ** 2)
    assert k == round(m / n * math.log(2))
    assert BloomFilter.for_capacity(n, p).nbytes == (m + 7) // 8


@pytest.mark.parametrize(("n", "p"), [(0, 0.01), (10, 0.0), (10, 1.0), (10, -1)])
def test_sizing_rejects_nonsense(n, p):
    with pytest.raises(ValueError):
        bloom_size(n, p)


def test_positions_are_in_range_and_deterministic():
    for key in (0, -1, 2**63 - 1, -(2**63), 42):
        pos = bit_positions(key, 9586, 7)
        assert len(pos) == 7 and all(0 <= x < 9586 for x in pos)
        assert pos == bit_positions(key, 9586, 7)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=500), st.integers(1, 200), st.sampled_from([0.1, 0.01]))
def test_no_false_negatives(keys, n, p):
    f = BloomFilter.for_capacity(n, p)  # often overfilled on purpose: still no false negatives
    for k in keys:
        f.add(k)
    assert all(f.might_contain(k) for k in keys)


def test_false_positive_rate_over_a_million_ids():
    n, p, queries = 100_000, 0.01, 1_000_000
    f = BloomFilter.for_capacity(n, p)
    base = 7_000_000  # brokers hand out producer ids sequentially, in blocks: the hard case for a weak hash
    for pid in range(base, base + n):
        f.add(pid)
    assert all(f.might_contain(pid) for pid in range(base, base + n))
    rate = sum(f.might_contain(pid) for pid in range(base + n, base + n + queries)) / queries
    assert 0.5 * p <= rate <= 1.5 * p, rate  # and not accidentally oversized either


def test_false_positive_rate_at_default_sizing():
    n, p = 1000, 0.01
    f = BloomFilter.for_capacity(n, p)
    for pid in range(n):
        f.add(pid)
    queries = 200_000
    rate = sum(f.might_contain(pid) for pid in range(10**9, 10**9 + queries)) / queries
    assert rate <= 1.5 * p, rate


def test_memory_is_fixed_whatever_is_added():
    f = BloomFilter.for_capacity(1000, 0.01)
    before = f.nbytes
    for pid in range(50_000):
        f.add(pid)
    assert f.nbytes == before == 1199


def test_rotation_first_id_known_for_exactly_one_window():
    t = TimeControlledBloomFilter(*bloom_size(100, 1e-6), W)
    assert t.add_if_absent(5, 1000)
    assert t.might_contain(5, 1000 + W - 1)
    assert not t.might_contain(5, 1000 + W)
    assert t.expired(1000 + W)
    assert t.add_if_absent(5, 1000 + W)


def test_rotation_late_id_known_for_at_least_half_a_window():
    t = TimeControlledBloomFilter(*bloom_size(100, 1e-6), W)
    assert t.add_if_absent(1, 0)  # filter 1 created at 0
    assert t.add_if_absent(2, HALF - 1)  # last moment filter 1 is written
    assert t.add_if_absent(3, HALF)  # filter 2 created, filter 1 now read-only
    assert t.filters == 2
    assert not t.add_if_absent(2, W - 1)  # still known: filter 1 is read
    assert t.might_contain(2, W - 1) and not t.might_contain(2, W)  # filter 1 dropped at one window
    assert t.filters == 1
    assert t.might_contain(3, W) and t.might_contain(3, HALF + W - 1) and not t.might_contain(3, HALF + W)


def test_at_most_two_filters_and_bounded_bytes():
    bits, hashes = bloom_size(1000, 0.01)
    t = TimeControlledBloomFilter(bits, hashes, W)
    pid = 0
    for now in range(0, 5 * W, W // 7):
        for _ in range(300):
            t.add_if_absent(pid, now)
            pid += 1
        assert t.filters <= 2
        assert t.nbytes <= 2 * ((bits + 7) // 8)


def test_time_going_backwards_is_clamped():
    t = TimeControlledBloomFilter(*bloom_size(100, 1e-6), W)
    assert t.add_if_absent(1, W)
    assert not t.add_if_absent(1, 0)  # clamped to W: still known, no crash
    assert t.might_contain(1, 5)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, W // 3)), min_size=1, max_size=80))
def test_schedule_model(events):
    """An id charged at t is never charged again before t + W/2, and always charged again from t + W."""
    t = TimeControlledBloomFilter(*bloom_size(100, 1e-9), W)
    charged: dict[int, int] = {}
    now = 0
    for pid, dt in events:
        now += dt
        new = t.add_if_absent(pid, now)
        last = charged.get(pid)
        if last is not None and now < last + HALF:
            assert not new, (pid, last, now)
        if last is None or now >= last + W:
            assert new, (pid, last, now)
        if new:
            charged[pid] = now
        assert t.filters <= 2
