"""Kafka's connection limits and the KIP-612 connection creation rate, with an injected clock."""

from quotas.connections import ConnectionQuotas


def test_total_and_per_ip_limits_with_overrides():
    q = ConnectionQuotas(max_connections=5, max_per_ip=2, per_ip_overrides={"10.0.0.9": 4, "10.0.0.6": 0})
    assert q.admit("10.0.0.1", 0) is None and q.admit("10.0.0.1", 0) is None
    assert q.admit("10.0.0.1", 0).reason == "max_connections_per_ip"
    assert q.admit("10.0.0.6", 0).reason == "max_connections_per_ip"  # override 0: that ip is refused
    for _ in range(3):
        assert q.admit("10.0.0.9", 0) is None  # its override allows 4
    assert q.admit("10.0.0.2", 0).reason == "max_connections"  # 5 open
    q.closed("10.0.0.1")
    assert q.admit("10.0.0.2", 0) is None and q.total == 5 and q.per_ip("10.0.0.1") == 1


def test_proxy_wide_creation_rate_refuses_past_the_rate_and_recovers():
    q = ConnectionQuotas(max_creation_rate=10, samples=2, window_ms=1000)
    admitted = sum(q.admit("a", t) is None for t in range(0, 1000, 10))  # 100 attempts in 1 s
    assert 10 <= admitted <= 20  # Kafka's windowed rate: up to rate × samples × window in the first window
    assert q.admit("a", 5000) is None  # later, under the rate again


def test_ip_connection_rate_throttles_by_closing_after_the_throttle():
    rates = {"10.0.0.1": 2.0}
    q = ConnectionQuotas(ip_rate=rates.get, samples=2, window_ms=1000)
    outcomes = [q.admit("10.0.0.1", t) for t in range(0, 400, 50)]  # 8 in 0.4 s at 2/s
    refused = [r for r in outcomes if r is not None]
    assert refused and all(r.reason == "ip_connection_rate" and r.close_after_ms > 0 for r in refused)
    assert all(q.admit("10.0.0.2", t) is None for t in range(0, 400, 50))  # no quota for that ip
    assert q.total == 8 + sum(r is None for r in outcomes)
