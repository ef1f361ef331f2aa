"""Every response that can carry a broker address, at every version the cluster and the proxy both
speak, names only the proxy's listeners — checked on the wire, against the real cluster."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from protocol.address_free import offered_caps
from protocol.api_versions import WITHDRAWN
from protocol.apis import response_class
from tests.harness.request_bodies import fetch_request
from tests.support import KafkaWire

pytestmark = pytest.mark.cluster


def _versions(address: str) -> dict[int, tuple[int, int]]:
    wire = KafkaWire(address)
    wire.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)
    _, resp = wire.recv()
    wire.close()
    assert resp.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


@pytest.fixture(scope="module")
def via_proxy(proxy):
    return _versions(proxy.bootstrap)


def _assert_proxy_address(proxy, host: str, port: int) -> None:
    assert host == "127.0.0.1"
    assert port in proxy.listening_ports(), f"{host}:{port} is not one of the proxy's listeners"


def test_api_versions_are_the_brokers_capped_at_what_the_proxy_decodes(cluster, via_proxy):
    direct = _versions(cluster.brokers[0].bootstrap)
    for key, (lo, hi) in direct.items():
        if key in WITHDRAWN:
            assert key not in via_proxy
            continue
        cls = response_class(key)
        if key in (0, 1, 3, 10, 18, 60):  # decoded: capped at the schema the proxy decodes it with
            expected_hi = min(hi, cls.max_version)
        else:  # forwarded unread: capped at the version vouched address-free (DescribeQuorum: v1, not v2)
            expected_hi = min(hi, offered_caps({}).get(key, hi))
        assert via_proxy[key] == (lo, expected_hi), f"api {key}"
    assert set(via_proxy) == set(direct) - WITHDRAWN


def test_metadata_every_version(proxy, via_proxy):
    lo, hi = via_proxy[3]
    wire = KafkaWire(proxy.bootstrap)
    for v in range(lo, hi + 1):
        wire.send(MetadataRequest(topics=None, allow_auto_topic_creation=False), v)
        _, md = wire.recv()
        assert len(md.brokers) == 3, f"v{v}"
        for b in md.brokers:
            _assert_proxy_address(proxy, b.host, b.port)


def test_find_coordinator_every_version(proxy, via_proxy):
    lo, hi = via_proxy[10]
    wire = KafkaWire(proxy.bootstrap)
    for v in range(lo, hi + 1):
        req = FindCoordinatorRequest(key="grp-a", key_type=0, coordinator_keys=["grp-a", "grp-b"])
        for _ in range(30):  # the offsets topic may still be being created on a fresh cluster
            wire.send(req, v)
            _, resp = wire.recv()
            entries = resp.coordinators if v >= 4 else [resp]
            if all(e.error_code == 0 for e in entries):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"FindCoordinator v{v} kept failing: {resp}")
        assert len(entries) == (2 if v >= 4 else 1)
        for e in entries:
            _assert_proxy_address(proxy, e.host, e.port)


def test_describe_cluster_every_version(proxy, via_proxy):
    lo, hi = via_proxy[60]
    wire = KafkaWire(proxy.bootstrap)
    for v in range(lo, hi + 1):
        wire.send(
            DescribeClusterRequest(
                include_cluster_authorized_operations=False, endpoint_type=1, include_fenced_brokers=False
            ),
            v,
        )
        _, resp = wire.recv()
        assert resp.error_code == 0 and len(resp.brokers) == 3, f"v{v}"
        for b in resp.brokers:
            _assert_proxy_address(proxy, b.host, b.port)


def _topic_on_one_broker(proxy):
    """A single-replica topic, its id, its leader and a proxy listener of a broker that is not it."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kip951-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    wire = KafkaWire(proxy.bootstrap)
    for _ in range(50):
        wire.send(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)],
                allow_auto_topic_creation=False,
            ),
            12,
        )
        _, md = wire.recv()
        t = md.topics[0]
        if t.error_code == 0 and t.partitions and t.partitions[0].leader_id >= 0:
            break
    leader = t.partitions[0].leader_id
    other = next(b for b in md.brokers if b.node_id != leader)
    wire.close()
    # The follower learns the new topic from the controller a moment later; until then it answers
    # UNKNOWN_TOPIC_OR_PARTITION instead of NOT_LEADER_OR_FOLLOWER with the leader's endpoint.
    follower = KafkaWire(f"{other.host}:{other.port}")
    for _ in range(50):
        follower.send(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)],
                allow_auto_topic_creation=False,
            ),
            12,
        )
        if follower.recv()[1].topics[0].error_code == 0:
            break
        time.sleep(0.1)
    follower.close()
    return topic, t.topic_id, leader, f"{other.host}:{other.port}"


def test_kip951_node_endpoints_in_produce_and_fetch(proxy, via_proxy):
    topic, topic_id, leader, follower_addr = _topic_on_one_broker(proxy)
    wire = KafkaWire(follower_addr)

    pv = min(via_proxy[0][1], 12)
    assert pv >= 10, "the cluster speaks Produce v10+ (KIP-951)"
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    builder.append(0, None, b"v", [])
    builder.close()
    T = ProduceRequest.TopicProduceData
    wire.send(
        ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=5000,
            topic_data=[
                T(
                    name=topic,
                    topic_id=topic_id,
                    partition_data=[T.PartitionProduceData(index=0, records=builder.buffer())],
                )
            ],
        ),
        pv,
    )
    _, resp = wire.recv()
    assert resp.responses[0].partition_responses[0].error_code == 6  # NOT_LEADER_OR_FOLLOWER
    assert [e.node_id for e in resp.node_endpoints] == [leader]
    for e in resp.node_endpoints:
        _assert_proxy_address(proxy, e.host, e.port)

    fv = via_proxy[1][1]
    assert fv >= 16, "the cluster speaks Fetch v16+ (KIP-951)"
    wire.send(
        fetch_request((topic, topic_id), max_wait_ms=100),
        fv,
    )
    _, resp = wire.recv()
    assert resp.responses[0].partitions[0].error_code == 6
    assert [e.node_id for e in resp.node_endpoints] == [leader]
    for e in resp.node_endpoints:
        _assert_proxy_address(proxy, e.host, e.port)


def test_kip951_node_endpoints_at_the_end_of_a_streamed_fetch(cluster, fresh_proxy, via_proxy):
    """A multi-megabyte Fetch v16+ response streams through (it is not assembled first), and its
    closing node_endpoints still names only the proxy: one partition with 3 MiB of records led by
    the broker asked, one led by another broker (NOT_LEADER_OR_FOLLOWER + that broker's endpoint)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    proxy = fresh_proxy(log_level="DEBUG")
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    ids = sorted(b.node_id for b in cluster.brokers)
    big, other = f"big-{uuid.uuid4().hex[:6]}", f"elsewhere-{uuid.uuid4().hex[:6]}"
    futures = admin.create_topics(
        [
            NewTopic(big, num_partitions=1, replica_assignment=[[ids[0]]]),
            NewTopic(other, num_partitions=1, replica_assignment=[[ids[1]]]),
        ]
    )
    for f in futures.values():
        f.result(30)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 20})
    for _ in range(3 * 1024):
        producer.produce(big, b"r" * 1024)
    assert producer.flush(30) == 0
    wire = KafkaWire(proxy.bootstrap)
    for _ in range(50):  # both topics known, with leaders, to the broker we ask (metadata propagates)
        wire.send(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=t, topic_id=None) for t in (big, other)],
                allow_auto_topic_creation=False,
            ),
            12,
        )
        _, md = wire.recv()
        if all(t.error_code == 0 and t.partitions and t.partitions[0].leader_id >= 0 for t in md.topics):
            break
        time.sleep(0.1)
    wire.close()
    topic_ids = {t.name: t.topic_id for t in md.topics}
    leader = next(b for b in md.brokers if b.node_id == ids[0])
    fv = via_proxy[1][1]
    assert fv >= 16
    wire = KafkaWire(f"{leader.host}:{leader.port}")
    for _ in range(50):
        wire.send(
            fetch_request(
                *((t, topic_ids[t]) for t in (big, other)),
                max_wait_ms=100,
                max_bytes=16 << 20,
                partition_max_bytes=8 << 20,
            ),
            fv,
        )
        _, resp = wire.recv()
        errors = {r.topic_id: r.partitions[0].error_code for r in resp.responses}
        if errors[topic_ids[other]] == 6:  # the broker knows the other topic's leader by now
            break
        time.sleep(0.1)
    wire.close()
    assert errors == {topic_ids[big]: 0, topic_ids[other]: 6}
    records = next(r for r in resp.responses if r.topic_id == topic_ids[big]).partitions[0].records
    assert len(records) > 2 << 20
    assert [e.node_id for e in resp.node_endpoints] == [ids[1]]
    for e in resp.node_endpoints:
        _assert_proxy_address(proxy, e.host, e.port)
    deadline = time.monotonic() + 10
    while f"Fetch v{fv} streamed" not in proxy.log() and time.monotonic() < deadline:
        time.sleep(0.1)  # the connection's summary is logged when it closes
    assert f"Fetch v{fv} streamed" in proxy.log()
