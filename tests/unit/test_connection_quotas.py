"""Kafka's connection limits and the KIP-612 connection creation rate, with an injected clock."""

from quotas.connections import ConnectionQuotas


def test_total_and_per_ip_limits_with_overrides():
    q = ConnectionQuotas(max_connections=5, max_per_ip=2, per_ip_overrides={"10.0.0.9": 4, "10.0.0.6": 0}, shed=False)
    first = object()
    assert q.admit(first, "10.0.0.1", 0) is None and q.admit(object(), "10.0.0.1", 0) is None
    assert q.admit(object(), "10.0.0.1", 0).reason == "max_connections_per_ip"
    assert q.admit(object(), "10.0.0.6", 0).reason == "max_connections_per_ip"  # override 0: that ip is refused
    for _ in range(3):
        assert q.admit(object(), "10.0.0.9", 0) is None  # its override allows 4
    assert q.admit(object(), "10.0.0.2", 0).reason == "max_connections"  # 5 open
    q.closed(first)
    assert q.admit(object(), "10.0.0.2", 0) is None and q.total == 5 and q.per_ip("10.0.0.1") == 1


def test_proxy_wide_creation_rate_refuses_past_the_rate_and_recovers():
    q = ConnectionQuotas(max_creation_rate=10, samples=2, window_ms=1000)
    admitted = sum(q.admit(object(), "a", t) is None for t in range(0, 1000, 10))  # 100 attempts in 1 s
    assert 10 <= admitted <= 20  # Kafka's windowed rate: up to rate × samples × window in the first window
    assert q.admit(object(), "a", 5000) is None  # later, under the rate again


def test_ip_connection_rate_throttles_by_closing_after_the_throttle():
    rates = {"10.0.0.1": 2.0}
    q = ConnectionQuotas(ip_rate=rates.get, samples=2, window_ms=1000)
    outcomes = [q.admit(object(), "10.0.0.1", t) for t in range(0, 400, 50)]  # 8 in 0.4 s at 2/s
    refused = [r for r in outcomes if r is not None]
    assert refused and all(r.reason == "ip_connection_rate" and r.close_after_ms > 0 for r in refused)
    assert all(q.admit(object(), "10.0.0.2", t) is None for t in range(0, 400, 50))  # no quota for that ip
    assert q.total == 8 + sum(r is None for r in outcomes)


def test_ip_quotas_through_the_client_quota_apis():
    from kafka.protocol.admin import (
        AlterClientQuotasRequest,
        AlterClientQuotasResponse,
        DescribeClientQuotasRequest,
        DescribeClientQuotasResponse,
    )

    from config.quota_sources import QuotaSources
    from proxy.rules import client_quota_api
    from quotas.connections import IpQuotas
    from quotas.entities import QuotaEntity, QuotaStore

    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", 1000)
    sources, ips = QuotaSources(store, None), IpQuotas()
    ips.set_file({"<default>": 50})
    E = AlterClientQuotasRequest.EntryData

    def alter(name, key="connection_creation_rate", value=5.0, remove=False):
        req = AlterClientQuotasRequest(
            entries=[
                E(
                    entity=[E.EntityData(entity_type="ip", entity_name=name)],
                    ops=[E.OpData(key=key, value=value, remove=remove)],
                )
            ],
            validate_only=False,
        )
        body = client_quota_api.alter(sources, req.encode(version=1), 1, "admin", frozenset({"admin"}), ips)
        return AlterClientQuotasResponse.decode(body, version=1).entries[0].error_code

    def describe(*components, strict=False):
        C = DescribeClientQuotasRequest.ComponentData
        req = DescribeClientQuotasRequest(
            components=[C(entity_type=t, match_type=m, match=n) for t, m, n in components], strict=strict
        )
        body = client_quota_api.describe(sources, req.encode(version=1), 1, "admin", frozenset({"admin"}), ips)
        return {
            tuple((e.entity_type, e.entity_name) for e in x.entity): {v.key: v.value for v in x.values}
            for x in DescribeClientQuotasResponse.decode(body, version=1).entries
        }

    assert alter("10.1.2.3") == 0 and ips.rate("10.1.2.3") == 5.0 and ips.rate("10.9.9.9") == 50
    assert alter("not-an-ip") == 42 and alter("10.1.2.3", key="producer_byte_rate") == 42
    assert describe(("ip", 0, "10.1.2.3")) == {(("ip", "10.1.2.3"),): {"connection_creation_rate": 5.0}}
    assert describe(("ip", 1, None)) == {(("ip", None),): {"connection_creation_rate": 50.0}}
    everything = describe()
    assert (("user", "alice"),) in everything and (("ip", "10.1.2.3"),) in everything
    assert all(k[0][0] == "user" for k in describe(("user", 2, None)))
    assert alter(None, remove=True) == 0 and ips.rate("10.9.9.9") is None  # the API's removal hides the file's
