"""ProducerIdTracker: per-user "is this producer id new", cleanup of idle users, memory accounting."""

import pytest

from quotas.producer_ids import ProducerIdQuotaConfig, ProducerIdTracker

W = 3_600_000
HALF = W // 2


def test_defaults_are_the_kips():
    c = ProducerIdQuotaConfig()
    assert (c.window_num, c.window_size_s, c.cleanup_interval_ms) == (11, 3600, 10)
    assert c.window_ms == W
    assert c.rate_window_ms == 11 * W
    t = ProducerIdTracker()
    assert (t.bits, t.hashes, t.filter_bytes, t.max_bytes_per_user) == (9586, 7, 1199, 2398)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_num": 0},
        {"window_size_s": 0},
        {"cleanup_interval_ms": 0},
        {"expected_ids": 0},
        {"false_positive_rate": 1.5},
    ],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        ProducerIdQuotaConfig(**kwargs)


def test_new_once_per_window_and_per_user():
    t = ProducerIdTracker()
    assert t.observe("alice", 42, 0)
    assert not t.observe("alice", 42, 10)
    assert t.observe("bob", 42, 10)  # users are independent
    assert t.users() == 2
    assert t.contains("alice", 42, 20) and not t.contains("alice", 43, 20) and not t.contains("carol", 42, 20)


def test_restart_with_same_id_inside_window_not_charged_twice():
    t = ProducerIdTracker()
    assert t.observe("alice", 7, 0)
    # the producer reconnects / bumps its epoch and keeps its id, across a filter rotation
    assert t.observe("alice", 8, HALF + 5)
    for now in (1, HALF, HALF + 10, W - 1):
        assert not t.observe("alice", 7, now)
    assert t.observe("alice", 7, W)  # the window is over: charged again, as the KIP intends


def test_observe_many_counts_new_ids():
    t = ProducerIdTracker()
    assert t.observe_many("u", [1, 2, 3], 0) == 3
    assert t.observe_many("u", {2, 3, 4}, 5) == 1


def test_cleanup_removes_idle_users_only_after_a_window():
    t = ProducerIdTracker()
    t.observe("idle", 1, 0)
    t.observe("busy", 1, 0)
    assert t.cleanup(W - 1) == 0
    t.observe("busy", 2, W - 1)  # creates a new filter for busy
    assert t.cleanup(W) == 1
    assert t.users() == 1
    assert t.user_memory_bytes("idle") == 0
    assert t.contains("busy", 2, W) and not t.contains("busy", 1, W)
    assert t.memory_bytes() == t.filter_bytes  # busy's first filter was trimmed by cleanup
    assert t.cleanup(2 * W - 2) == 0
    assert t.cleanup(2 * W - 1) == 1
    assert t.users() == 0 and t.memory_bytes() == 0


def test_cleanup_cost_follows_expiries_not_users():
    t = ProducerIdTracker()
    for u in range(2000):
        t.observe(u, 1, 0)
    assert t.cleanup(W - 1) == 0 and t.users() == 2000
    assert len(t._expiries) == 2000
    assert t.cleanup(W) == 2000 and not t._expiries


def test_memory_bounded_per_user_whatever_it_sends():
    t = ProducerIdTracker()
    pid = 0
    for now in range(0, 3 * W, W // 10):
        for _ in range(2000):  # twice the sizing: saturated filters, but never more of them
            t.observe("rogue", pid, now)
            pid += 1
        assert t.user_memory_bytes("rogue") <= t.max_bytes_per_user
        assert t.memory_bytes() == t.user_memory_bytes("rogue")


def test_memory_accounting_matches_the_filters():
    t = ProducerIdTracker(ProducerIdQuotaConfig(window_size_s=10, expected_ids=100, false_positive_rate=0.001))
    import random

    rng = random.Random(3)
    now = 0
    for _ in range(5000):
        now += rng.randrange(0, 400)
        t.observe(rng.randrange(30), rng.randrange(1000), now)
        if rng.random() < 0.05:
            t.cleanup(now)
        assert t.memory_bytes() == sum(t.user_memory_bytes(u) for u in range(30))
        assert all(t.user_memory_bytes(u) <= t.max_bytes_per_user for u in range(30))


def test_sequential_ids_default_false_positive_rate():
    t = ProducerIdTracker()
    # Filling the filter up to its sizing: almost every id is new (a false positive is possible near the end).
    assert sum(t.observe("u", pid, 0) for pid in range(1000)) >= 990
    fp = sum(t.contains("u", pid, 1) for pid in range(10**6, 10**6 + 100_000)) / 100_000
    assert fp <= 0.015
    assert t.users() == 1 and t.memory_bytes() == t.filter_bytes


def test_time_going_backwards():
    t = ProducerIdTracker()
    assert t.observe("u", 1, W)
    assert not t.observe("u", 1, 0)
    assert t.cleanup(5) == 0 and t.users() == 1
