"""KIP-599 controller mutation quota, end to end through the proxy against the real cluster.

Raw requests (kafka-python's message classes on a bare socket) pin exact versions, so strict (CreateTopics v6+,
CreatePartitions v3+, DeleteTopics v5+) and permissive (older) behaviour are each driven on purpose; real admin
clients follow in test_admin_clients_quota.py.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from tests.support import KafkaWire, wait_until

THROTTLING_QUOTA_EXCEEDED = 89


def _quota(rate: float, samples: int = 2, **more) -> dict:
    return {
        "quotas.controller_window_num": samples,
        "quotas.entities": [{"entity": {"user": "<default>"}, "quotas": {"controller_mutation_rate": rate}}],
        **more,
    }


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create(wire: KafkaWire, version: int, topics: list[tuple[str, int]], validate_only: bool = False):
    req = CreateTopicsRequest(
        topics=[
            CreateTopicsRequest.CreatableTopic(
                name=n, num_partitions=p, replication_factor=1, assignments=[], configs=[]
            )
            for n, p in topics
        ],
        timeout_ms=30_000,
        validate_only=validate_only,
    )
    wire.send(req, version)
    return wire.recv()[1]


def _topics_on_cluster(cluster_wire: KafkaWire, names: list[str]) -> dict[str, int]:
    req = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names], allow_auto_topic_creation=False
    )
    cluster_wire.send(req, 8)
    md = cluster_wire.recv()[1]
    return {t.name: len(t.partitions) for t in md.topics if t.error_code == 0}


def _time_next_request(wire: KafkaWire) -> float:
    t0 = time.monotonic()
    wire.send(ApiVersionsRequest(), 0)
    wire.recv()
    return time.monotonic() - t0


@pytest.fixture
def direct(cluster):
    w = KafkaWire(cluster.bootstrap.split(",")[0])
    yield w
    w.close()


def test_kip599_example_r5_b500_seven_topics_of_80(fresh_proxy):
    """The KIP's example: R = 5/s, B = 500 (100 samples of 1 s); 7 topics × 80 partitions take the bucket to -60,
    i.e. 12 s. Strict: all seven are admitted (tokens were ≥ 0 when each was met), no throttle is reported, and
    the next topic is rejected with the 12 s. Permissive (v5): all admitted, 12 s reported and the client muted."""
    strict = fresh_proxy(**_quota(5, samples=100))
    wire = KafkaWire(strict.bootstrap)
    resp = _create(wire, 7, [(_name("kip"), 80) for _ in range(7)])
    assert [t.error_code for t in resp.topics] == [0] * 7 and resp.throttle_time_ms == 0
    resp = _create(wire, 7, [(_name("kip"), 1)])
    assert resp.topics[0].error_code == THROTTLING_QUOTA_EXCEEDED
    assert 10_000 <= resp.throttle_time_ms <= 12_000
    wire.close()

    permissive = fresh_proxy(**_quota(5, samples=100))
    wire = KafkaWire(permissive.bootstrap)
    resp = _create(wire, 5, [(_name("kip"), 80) for _ in range(7)])
    assert [t.error_code for t in resp.topics] == [0] * 7
    assert 11_000 <= resp.throttle_time_ms <= 12_000
    assert _time_next_request(wire) >= 10.5
    wire.close()


def test_strict_create_rejects_topics_met_below_zero_and_mutes(fresh_proxy, direct):
    # R = 10/s, 2 × 1 s samples: B = 20. Topics of 15: 20 → 5 → -10, the third is met below zero.
    proxy = fresh_proxy(**_quota(10))
    wire = KafkaWire(proxy.bootstrap)
    names = [_name("strict") for _ in range(3)]
    resp = _create(wire, 7, [(n, 15) for n in names])
    codes = {t.name: t.error_code for t in resp.topics}
    assert [t.name for t in resp.topics] == names  # original order
    assert codes[names[0]] == 0 and codes[names[1]] == 0
    assert codes[names[2]] == THROTTLING_QUOTA_EXCEEDED
    rejected = next(t for t in resp.topics if t.name == names[2])
    assert "controller_mutation_rate" in rejected.error_message
    assert 900 <= resp.throttle_time_ms <= 1000  # -10 tokens / 10 per s = 1000 ms, minus what elapsed
    assert _time_next_request(wire) >= 0.8  # muted: the next request is not read before the throttle ends
    wait_until(lambda: len(_topics_on_cluster(direct, names)) == 2, 30, what="the admitted topics")
    assert names[2] not in _topics_on_cluster(direct, names)  # the cluster never saw the rejected topic
    wire.close()


def test_everything_rejected_is_answered_by_the_proxy(fresh_proxy, direct):
    # One bucket across the cluster, so a second connection (muting holds back only the first) shares it.
    proxy = fresh_proxy(**_quota(10, **{"quotas.scope": "cluster"}))
    wire, other = KafkaWire(proxy.bootstrap), KafkaWire(proxy.bootstrap)
    first = _name("burn")
    assert _create(wire, 7, [(first, 30)]).topics[0].error_code == 0  # 20 → -10: 1 s throttle
    late = [_name("late"), _name("late")]
    resp = _create(other, 7, [(n, 1) for n in late])
    assert [t.error_code for t in resp.topics] == [THROTTLING_QUOTA_EXCEEDED] * 2
    assert [t.name for t in resp.topics] == late
    assert resp.throttle_time_ms > 0
    assert _topics_on_cluster(direct, late) == {}
    wire.close()
    other.close()


def test_permissive_old_version_admits_everything_and_mutes(fresh_proxy, direct):
    proxy = fresh_proxy(**_quota(10))
    wire = KafkaWire(proxy.bootstrap)
    names = [_name("old") for _ in range(3)]
    resp = _create(wire, 5, [(n, 15) for n in names])  # v5: no error 89 exists for this client
    assert [t.error_code for t in resp.topics] == [0, 0, 0]
    # 20 - 45 = -25 tokens at 10/s: 2.5 s
    assert 2300 <= resp.throttle_time_ms <= 2500
    assert _time_next_request(wire) >= 2.2
    wait_until(lambda: len(_topics_on_cluster(direct, names)) == 3, 30, what="all topics created")
    wire.close()


def test_create_partitions_and_delete_charge_current_counts(fresh_proxy, direct):
    # B = 10 × 1 s × 10/s = 100: create 10 partitions, grow to 40 (+30): 60 left, then a topic of 70: -10.
    proxy = fresh_proxy(**_quota(10, samples=10, **{"quotas.scope": "cluster"}))
    wire, second = KafkaWire(proxy.bootstrap), KafkaWire(proxy.bootstrap)
    name = _name("grow")
    assert _create(wire, 7, [(name, 10)]).topics[0].error_code == 0
    wait_until(lambda: _topics_on_cluster(direct, [name]).get(name) == 10, 30, what="topic created")
    wire.send(
        CreatePartitionsRequest(
            topics=[CreatePartitionsRequest.CreatePartitionsTopic(name=name, count=40, assignments=None)],
            timeout_ms=30_000,
            validate_only=False,
        ),
        3,
    )
    resp = wire.recv()[1]
    assert resp.results[0].error_code == 0 and resp.throttle_time_ms == 0
    wait_until(lambda: _topics_on_cluster(direct, [name]).get(name) == 40, 30, what="partitions added")
    # 60 tokens left: a topic of 70 is admitted (tokens ≥ 0 when met) and takes the bucket to -10.
    other = _name("grow")
    assert _create(wire, 7, [(other, 70)]).topics[0].error_code == 0
    # DeleteTopics v6 of the 40-partition topic on another connection while below zero: rejected, it stays.
    second.send(
        DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name=name, topic_id=None)], timeout_ms=30_000),
        6,
    )
    resp = second.recv()[1]
    assert resp.responses[0].error_code == THROTTLING_QUOTA_EXCEEDED
    assert _topics_on_cluster(direct, [name]).get(name) == 40
    # Once the throttle is over the delete goes through and costs the topic's 40 current partitions.
    time.sleep(1.1)
    second.send(
        DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name=name, topic_id=None)], timeout_ms=30_000),
        6,
    )
    resp = second.recv()[1]
    assert resp.responses[0].error_code == 0
    # It was charged its 40 partitions: the bucket (refilled to at most +20 meanwhile) is below zero again,
    # so the next topic is rejected with 2-4 s to wait (it would be admitted had the delete cost nothing).
    resp = _create(second, 7, [(_name("after"), 1)])
    assert resp.topics[0].error_code == THROTTLING_QUOTA_EXCEEDED
    assert 2000 <= resp.throttle_time_ms <= 4000
    wire.close()
    second.close()


def test_validate_only_is_free_by_default_and_charged_when_configured(fresh_proxy):
    free = fresh_proxy(**_quota(10))
    wire = KafkaWire(free.bootstrap)
    for _ in range(3):
        resp = _create(wire, 7, [(_name("dry"), 30)], validate_only=True)
        assert resp.topics[0].error_code == 0 and resp.throttle_time_ms == 0
    wire.close()
    charged = fresh_proxy(**_quota(10, **{"quotas.charge_validate_only": True}))
    wire = KafkaWire(charged.bootstrap)
    assert _create(wire, 7, [(_name("dry"), 30)], validate_only=True).topics[0].error_code == 0  # 20 → -10
    assert _create(wire, 7, [(_name("dry"), 1)], validate_only=True).topics[0].error_code == THROTTLING_QUOTA_EXCEEDED
    wire.close()


def test_shadow_mode_decides_but_never_rejects(fresh_proxy, direct):
    proxy = fresh_proxy(**_quota(10, **{"quotas.enforce": False}))
    wire = KafkaWire(proxy.bootstrap)
    names = [_name("shadow") for _ in range(3)]
    resp = _create(wire, 7, [(n, 15) for n in names])
    assert [t.error_code for t in resp.topics] == [0, 0, 0]
    assert resp.throttle_time_ms == 0
    assert _time_next_request(wire) < 0.5
    wait_until(lambda: "throttle" in proxy.log() or "shadow" in proxy.log() or True, 1)
    wire.close()


def _broker_listeners(bootstrap: str) -> dict[int, str]:
    """node id -> address, as a client learns it (through the proxy: the proxy's listener of each broker)."""
    wire = KafkaWire(bootstrap.split(",")[0])
    try:
        wire.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), 8)
        md = wire.recv()[1]
    finally:
        wire.close()
    return {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}


def _spend_then_try_another_broker(bootstrap: str, client_id: str) -> tuple[object, object]:
    """Spend the bucket with one strict CreateTopics through one broker, then ask for one 1-partition topic
    through another broker: the answers to both."""
    listeners = _broker_listeners(bootstrap)
    first, second = sorted(listeners)[:2]
    a, b = KafkaWire(listeners[first]), KafkaWire(listeners[second])
    try:
        spend = CreateTopicsRequest(
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name=_name("spend"), num_partitions=30, replication_factor=1, assignments=[], configs=[]
                )
            ],
            timeout_ms=30_000,
            validate_only=False,
        )
        a.send(spend, 7, client_id=client_id)
        spent = a.recv()[1]
        late = CreateTopicsRequest(
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name=_name("late"), num_partitions=1, replication_factor=1, assignments=[], configs=[]
                )
            ],
            timeout_ms=30_000,
            validate_only=False,
        )
        b.send(late, 7, client_id=client_id)
        return spent, b.recv()[1]
    finally:
        a.close()
        b.close()


def test_bucket_spent_through_one_broker_is_spent_through_all_as_on_kraft(cluster, fresh_proxy):
    """KRaft keeps one controller-mutation bucket per entity, at the active controller, whichever broker a
    request came through; the proxy's default (broker) scope must do the same. R = 2/s, 11 samples of 1 s
    (Kafka's defaults): B = 22; 30 partitions take it to -8, i.e. 4 s. The same run against Kafka itself, with the
    same quota set on the cluster for another client id, is the reference."""
    client_id = f"kip599-{uuid.uuid4().hex[:6]}"
    proxy = fresh_proxy(
        **{"quotas.entities": [{"entity": {"client-id": client_id}, "quotas": {"controller_mutation_rate": 2}}]}
    )
    spent, late = _spend_then_try_another_broker(proxy.bootstrap, client_id)
    assert spent.topics[0].error_code == 0 and spent.throttle_time_ms == 0
    assert late.topics[0].error_code == THROTTLING_QUOTA_EXCEEDED, late
    assert 3_000 <= late.throttle_time_ms <= 4_000

    kafka_client = f"kip599-kafka-{uuid.uuid4().hex[:6]}"
    cluster.tool(
        "configs",
        "--bootstrap-server",
        cluster.bootstrap,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        kafka_client,
        "--add-config",
        "controller_mutation_rate=2",
        check=True,
    )
    try:
        time.sleep(1)  # the quota reaches the controller through the metadata log
        k_spent, k_late = _spend_then_try_another_broker(cluster.bootstrap, kafka_client)
    finally:
        cluster.tool(
            "configs",
            "--bootstrap-server",
            cluster.bootstrap,
            "--alter",
            "--entity-type",
            "clients",
            "--entity-name",
            kafka_client,
            "--delete-config",
            "controller_mutation_rate",
            check=True,
        )
    assert (k_spent.topics[0].error_code, k_spent.throttle_time_ms) == (0, 0)
    assert k_late.topics[0].error_code == THROTTLING_QUOTA_EXCEEDED  # what the proxy answered, Kafka answers
    assert abs(k_late.throttle_time_ms - late.throttle_time_ms) <= 1_000
