"""QuotaManager (which tracker is charged, idle expiry, limit changes) and QuotaSources (layering, state file)."""

import json

import pytest

from config.quota_sources import QuotaSources, StateFileError
from quotas.entities import DEFAULT, QuotaEntity, QuotaStore
from quotas.manager import QuotaManager, Window, Windows


def _manager(**quotas):
    store = QuotaStore()
    for (user, key), value in quotas.items():
        store.set(QuotaEntity(user=user), key, value)
    return store, QuotaManager(store, Windows(), idle_ms=60_000)


def test_no_quota_no_tracker():
    store, qm = _manager()
    assert qm.charge_rate("producer_byte_rate", "alice", "c", "", 1000, 0) is None
    assert len(qm) == 0


def test_user_quota_shared_by_client_ids_and_reference_vector():
    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", 500)
    qm = QuotaManager(store)
    for s in range(10):
        c = qm.charge_rate("producer_byte_rate", "alice", f"c{s % 2}", "", 400, s * 1000)
        assert c.throttle_ms == 0
    c = qm.charge_rate("producer_byte_rate", "alice", "c9", "", 2300, 10_500)
    assert c.throttle_ms == 2100  # the reference vector: both client ids fed one bucket
    assert len(qm) == 1


def test_default_user_quota_gives_each_user_its_own_bucket_and_scopes_split():
    store = QuotaStore()
    store.set(QuotaEntity(user=DEFAULT), "consumer_byte_rate", 1000)
    qm = QuotaManager(store)
    qm.charge_rate("consumer_byte_rate", "a", "", "broker 1", 10, 0)
    qm.charge_rate("consumer_byte_rate", "b", "", "broker 1", 10, 0)
    qm.charge_rate("consumer_byte_rate", "a", "", "broker 2", 10, 0)
    assert len(qm) == 3
    samples = {(g, n, u, sc) for g, n, u, _c, sc, _v in qm.samples(0)}
    assert ("Fetch", "byte-rate", "a", "broker 2") in samples
    assert ("Fetch", "throttle-time", "b", "broker 1") in samples


def test_idle_trackers_expire_and_limit_changes_keep_history():
    store = QuotaStore()
    entity = QuotaEntity(user="u")
    store.set(entity, "controller_mutation_rate", 10)
    qm = QuotaManager(store, Windows(controller=Window(2, 1000)), idle_ms=60_000)
    t = qm.mutation_tracker("u", "", "", 0)
    t.stat.record(30, 0)  # 20 - 30 = -10
    store.set(entity, "controller_mutation_rate", 5)
    t2 = qm.mutation_tracker("u", "", "", 0)
    assert t2 is t and t.stat.tokens(0) < 0  # the debt survives a quota change, as in Kafka
    assert qm.expire(59_999) == 0
    assert qm.expire(60_000) == 1 and len(qm) == 0


def test_sources_layering_tombstones_and_state_file(tmp_path):
    store = QuotaStore()
    state = tmp_path / "state.json"
    src = QuotaSources(store, state)
    alice = QuotaEntity(user="alice")
    src.set_imported({alice: {"producer_byte_rate": 1.0, "consumer_byte_rate": 2.0}})
    src.set_file({alice: {"producer_byte_rate": 10.0}})
    assert store.get(alice) == {"producer_byte_rate": 10.0, "consumer_byte_rate": 2.0}
    src.alter(alice, {"consumer_byte_rate": None, "request_percentage": 50.0})
    assert store.get(alice) == {"producer_byte_rate": 10.0, "request_percentage": 50.0}
    src.set_file({alice: {"producer_byte_rate": 20.0, "consumer_byte_rate": 3.0}})
    assert store.get(alice) == {"producer_byte_rate": 20.0, "request_percentage": 50.0}  # tombstone holds
    again = QuotaSources(QuotaStore(), state)
    assert again.api == src.api
    src.set_file({})
    assert store.get(alice) == {"request_percentage": 50.0, "producer_byte_rate": 1.0}


def test_bad_state_file_is_named(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"entities": [{"user": "a", "quotas": "nope"}]}))
    with pytest.raises(StateFileError, match="quotas.state_file .*state.json"):
        QuotaSources(QuotaStore(), state)


def test_controller_mutation_bucket_is_one_per_cluster_while_byte_rates_are_per_broker():
    """KRaft forwards every CreateTopics/CreatePartitions/DeleteTopics to the active controller, which holds the
    one KIP-599 bucket: a client that spends it through broker 1 finds it spent through broker 2 too."""
    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "controller_mutation_rate", 10)
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", 1000)
    qm = QuotaManager(store)
    via_1 = qm.mutation_tracker("alice", "c", "broker 1", 0)
    via_2 = qm.mutation_tracker("alice", "c", "broker 2", 0)
    assert via_1 is via_2
    via_1.stat.record(200, 0)  # more than any burst of a 10/s bucket
    assert via_2.stat.tokens(0) == via_1.stat.tokens(0) < 0
    assert qm.charge_rate("producer_byte_rate", "alice", "c", "broker 1", 50_000, 0).throttle_ms > 0
    assert qm.charge_rate("producer_byte_rate", "alice", "c", "broker 2", 500, 0).throttle_ms == 0
    scopes = {(group, scope) for group, _, _, _, scope, _ in qm.samples(0)}
    assert scopes == {("ControllerMutation", ""), ("Produce", "broker 1"), ("Produce", "broker 2")}


def test_trackers_are_capped_least_recently_used_first_and_scrapes_fold_the_rest():
    store = QuotaStore()
    store.set(QuotaEntity(client_id=DEFAULT), "request_percentage", 100)
    qm = QuotaManager(store, max_trackers=1000)
    qm.charge_rate("request_percentage", "alice", "steady", "b1", 50_000, 0)  # throttled: named in any scrape
    for i in range(20_000):
        qm.charge_rate("request_percentage", "mallory", f"c{i}", "b1", 1, i)
        if i % 500 == 0:
            qm.charge_rate("request_percentage", "alice", "steady", "b1", 1, i)  # recently used: never evicted
    assert len(qm) <= 1000 and qm.evicted >= 19_000
    samples = list(qm.samples(20_000, top=10))
    named = {(u, c) for _g, _n, u, c, _s, _v in samples}
    # <default client-id>: buckets are ("", client id), shared by every user of that client id
    assert ("", "steady") in named and ("__other__", "__other__") in named and len(named) == 11
    other = {n: v for _g, n, u, _c, _s, v in samples if u == "__other__"}
    assert set(other) == {"throttle-time", "throttle-time-total", "recorded-total"}
    everything = sum(v for _g, n, _u, _c, _s, v in qm.samples(20_000) if n == "recorded-total")
    named_total = sum(v for _g, n, u, _c, _s, v in samples if n == "recorded-total" and u != "__other__")
    assert other["recorded-total"] == everything - named_total


def test_quota_limit_is_the_quota_configured_now_and_there_is_no_lease_outside_a_fleet():
    """``quota-limit`` is read from the store at scrape time (Kafka's quotaLimit, from the bucket's tags): an alter
    shows at once, a bucket nobody has used since; with no fleet there is no lease to export."""
    store = QuotaStore()
    store.set(QuotaEntity(user=DEFAULT), "producer_byte_rate", 1000)
    store.set(QuotaEntity(user="b%c d"), "producer_byte_rate", 3000)  # sanitized in the bucket's user tag
    qm = QuotaManager(store)
    qm.charge_rate("producer_byte_rate", "a", "c", "b1", 10, 0)
    qm.charge_rate("producer_byte_rate", "b%c d", "c", "b1", 10, 0)
    limits = {(n, u): v for _g, n, u, _c, _s, v in qm.samples(0) if n.endswith("-limit")}
    assert limits == {("quota-limit", "a"): 1000, ("quota-limit", "b%25c%20d"): 3000}
    store.set(QuotaEntity(user=DEFAULT), "producer_byte_rate", 2000)
    limits = {(n, u): v for _g, n, u, _c, _s, v in qm.samples(0) if n.endswith("-limit")}
    assert limits == {("quota-limit", "a"): 2000, ("quota-limit", "b%25c%20d"): 3000}
