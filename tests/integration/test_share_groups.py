"""Share groups (KIP-932) through the proxy, with Kafka's own ``KafkaShareConsumer`` against the real cluster.

ShareFetch and ShareAcknowledge responses carry broker addresses (``node_endpoints``), so the proxy used to
withdraw both APIs from ApiVersions and share consumers could not work at all. Now it decodes them with its own
schemas (``protocol/share_messages.py``): these tests show two members sharing a topic get every record, have
every one acknowledged, and never open a connection to a broker's own port; and that ``consumer_byte_rate``
holds a share consumer to its rate, as Kafka's broker does (it charges ShareFetch to the Fetch quota).

Share groups need the ``share.version`` feature. A 4.4 cluster formatted at the latest metadata version has it
finalized already (``share.version=2``); on an older one it is upgraded here, which only enables the share-group
APIs and changes nothing for the other tests.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.harness.share_probe import share_probe, share_probe_popen, share_probe_result
from tests.integration.conftest import broker_ports
from tests.support import ConnectionWatcher, KafkaWire, wait_until

pytestmark = pytest.mark.cluster

SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _api_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    from kafka.protocol.metadata import ApiVersionsRequest

    wire = KafkaWire(bootstrap)
    try:
        wire.send(ApiVersionsRequest(client_software_name="ktp-tests", client_software_version="0"), 3)
        _, resp = wire.recv()
    finally:
        wire.close()
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


@pytest.fixture(scope="module")
def share_cluster(cluster):
    """The session cluster, with share groups enabled if its metadata version left them off."""
    if SHARE_FETCH not in _api_versions(cluster.brokers[0].bootstrap):
        cluster.tool(
            "org.apache.kafka.tools.FeatureCommand",
            "--bootstrap-server",
            cluster.bootstrap,
            "upgrade",
            "--feature",
            "share.version=1",
            check=True,
        )
        wait_until(
            lambda: all(SHARE_FETCH in _api_versions(b.bootstrap) for b in cluster.brokers),
            60,
            what="every broker to offer ShareFetch",
        )
    return cluster


def _topic(cluster, partitions: int = 3) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = _name("share")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def _produce(cluster, topic: str, n: int, size: int, per_second: float | None = None, partitions: int = 3) -> None:
    """``n`` records of ``size`` bytes straight to the cluster, round robin over the partitions, in batches of
    10 (a share fetch acquires whole batches: small ones keep each response near ``max.poll.records``)."""
    from confluent_kafka import Producer

    # Idempotent: a retry across a leader change must not write a record twice (the tests count offsets).
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "batch.num.messages": 10, "enable.idempotence": True}
    )
    start = time.monotonic()
    for i in range(n):
        producer.produce(topic, value=b"%06d" % i + bytes(max(size - 6, 0)), partition=i % partitions)
        if per_second is not None:
            producer.poll(0)
            ahead = start + i / per_second - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    assert producer.flush(30) == 0


def test_proxy_offers_share_apis_capped_at_its_schemas(share_cluster, proxy):
    direct = _api_versions(share_cluster.brokers[0].bootstrap)
    via = _api_versions(proxy.bootstrap)
    for key in (SHARE_FETCH, SHARE_ACKNOWLEDGE, 76, 77):
        assert key in via, f"api {key} withdrawn by the proxy"
    for key in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
        assert via[key][0] == direct[key][0] and via[key][1] == min(direct[key][1], 2)


def test_two_share_consumers_get_and_acknowledge_every_record_never_a_broker_port(share_cluster, proxy):
    topic = _topic(share_cluster)
    n = 600
    started = time.monotonic()
    proc = share_probe_popen(
        proxy.bootstrap,
        topic=topic,
        group=_name("share-g"),
        members=2,
        expect=n,
        timeout_ms=90_000,
        client_id="share-two",
        ack="explicit",
        props={"max.poll.records": 50},
        dist=share_cluster.dist,
    )
    with ConnectionWatcher([proc.pid], children=True) as watcher:
        # Produced while the members join, so both are in the group before the records run out.
        producer = threading.Thread(target=_produce, args=(share_cluster, topic, n, 200, 200.0))
        producer.start()
        res = share_probe_result(proc, started, timeout=150)
        producer.join()
    summary = (
        f"{len(res.records)} records in {res.wall_s:.1f} s, per member "
        f"{ {m: sum(r['member'] == m for r in res.records) for m in (0, 1)} }, offsets {res.offsets}, "
        f"failures {res.failures()}"
    )
    print(summary)
    assert not res.failures(), res.stderr[-4000:]
    got = {(r["partition"], r["offset"]) for r in res.records}
    assert got == {(p, o) for p in range(3) for o in range(n // 3)}, summary
    assert len(res.records) == n, f"records delivered twice: {summary}"
    assert all(r["member"] in (0, 1) for r in res.records)
    assert {r["member"] for r in res.records} == {0, 1}, f"one member got nothing: {summary}"
    assert res.acks and all(a["error"] is None for a in res.acks), [a for a in res.acks if a["error"]][:5]
    assert res.offsets and all(v["lag"] == 0 for v in res.offsets.values()), f"unacknowledged records: {summary}"
    leaked = watcher.remote_ports & broker_ports(share_cluster)
    assert not leaked, f"the share consumer connected straight to broker ports {leaked}"
    assert watcher.remote_ports & proxy.listening_ports(), "the share consumer never connected to the proxy"


QUOTA = 200 * 1024
WINDOW_S = 0.2


def test_consumer_byte_rate_holds_a_share_consumer(share_cluster, fresh_proxy):
    """A share consumer under ``consumer_byte_rate``: ShareFetch responses are charged like Fetch's, the client
    is told (``throttle_time_ms``) and muted, and apart from the padded window's burst its rate is the quota's.

    1200 records of 2000 B (2.4 MB) at 200 KiB/s. A fresh client's rate window is padded to (samples − 1) ×
    window = 10 × 0.2 s, so it may first take 2 s worth of quota at full speed (see test_byte_rate_quota); the
    rest, ~2 MB, is held to the quota: ~10 s, where unthrottled the same consumer takes it in about a second.
    The rate is measured at the client over the whole run with that burst taken off: (bytes − 2 s × quota) /
    (last record − first record); ±25 %: the quota lets whole responses through (~100 KB at 50 records per
    poll, half a second of quota), a run spans only ~4 throttle cycles of 2.2 s, and this 2-core machine is
    shared. One partition, so one broker: quotas are per broker (``quotas.scope: broker``, Kafka's own), and a
    topic led by three brokers would be served at three times the quota.
    """
    topic = _topic(share_cluster, partitions=1)
    n, size = 1200, 2000
    _produce(share_cluster, topic, n, size, partitions=1)
    proxy = fresh_proxy(
        **{
            "quotas.entities": [{"entity": {"client-id": "share-quota-0"}, "quotas": {"consumer_byte_rate": QUOTA}}],
            "quotas.window_size_seconds": WINDOW_S,
        }
    )
    res = share_probe(
        proxy.bootstrap,
        topic=topic,
        group=_name("share-q"),
        members=1,
        expect=n,
        timeout_ms=120_000,
        client_id="share-quota",
        ack="implicit",
        props={"max.poll.records": 50},
        dist=share_cluster.dist,
        timeout=180,
    )
    assert not res.failures(), res.stderr[-4000:]
    records = sorted(res.records, key=lambda r: r["t_ms"])
    assert len({(r["partition"], r["offset"]) for r in records}) == n
    assert all(v["lag"] == 0 for v in res.offsets.values()), f"implicitly acknowledged records left: {res.offsets}"
    seconds = (records[-1]["t_ms"] - records[0]["t_ms"]) / 1000
    burst = 10 * WINDOW_S * QUOTA
    rate = (sum(r["bytes"] for r in records) - burst) / seconds
    summary = (
        f"{len(records)} records over {seconds:.1f} s: {rate / 1024:.0f} KiB/s after a "
        f"{burst / 1024:.0f} KiB burst vs quota {QUOTA / 1024:.0f} KiB/s; client throttle metrics {res.metrics}"
    )
    print(summary)
    assert 0.75 * QUOTA <= rate <= 1.25 * QUOTA, summary
    throttle_max = res.metrics.get("consumer-share-fetch-manager-metrics/fetch-throttle-time-max")
    assert throttle_max and throttle_max > 0, f"no ShareFetch response told the client to back off: {summary}"


def _leader_and_replicas(cluster, topic: str) -> tuple[int, list[int]]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    deadline = time.monotonic() + 30
    while True:  # just created: a broker may list the topic before its partition metadata (seen in a full run)
        part = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        if part is not None and part.leader >= 0:
            return part.leader, list(part.replicas)
        assert time.monotonic() < deadline, f"no leader for {topic}-0 within 30 s"
        time.sleep(0.2)


def _share_coordinator(cluster, group: str) -> int:
    """The broker that coordinates share group ``group``: the group coordinator (FindCoordinator v6, key type 0;
    key type 2 is the share coordinator, which keys share-partition state, not groups)."""
    from protocol.apis import request_class

    find_coordinator = request_class(10)
    assert find_coordinator is not None

    def ask() -> int | None:  # COORDINATOR_NOT_AVAILABLE until __consumer_offsets exists (the first group)
        wire = KafkaWire(cluster.brokers[0].bootstrap)
        try:
            wire.send(find_coordinator(key_type=0, coordinator_keys=[group]), 6)
            _, resp = wire.recv()
        finally:
            wire.close()
        found = resp.coordinators[0]
        return found.node_id if found.error_code == 0 and found.node_id >= 0 else None

    deadline = time.monotonic() + 60
    while (node := ask()) is None:
        assert time.monotonic() < deadline, f"no coordinator for {group}"
        time.sleep(0.5)
    return node


def _move_leader(cluster, topic: str, to: int, replicas: list[int], workdir) -> None:
    """Make ``to`` the preferred replica (same replica set, new order: nothing is copied), then elect it."""
    import json

    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient

    order = [to] + [r for r in replicas if r != to]
    plan = workdir / "reassign.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": order}]}))
    cluster.tool(
        "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
        "--bootstrap-server",
        cluster.bootstrap,
        "--reassignment-json-file",
        str(plan),
        "--execute",
        check=True,
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    wait_until(lambda: _leader_and_replicas(cluster, topic)[1] == order, 30, what="the new replica order")
    admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(30)
    wait_until(lambda: _leader_and_replicas(cluster, topic)[0] == order[0], 30, what="the new leader")


def test_share_consumer_follows_a_leader_change_through_the_proxy(share_cluster, proxy, tmp_path):
    """The partition's leader moves while a share consumer reads it: the old leader answers ShareFetch and
    ShareAcknowledge with NOT_LEADER_OR_FOLLOWER and the new leader's address in ``node_endpoints``, which the
    client adopts at once (KIP-951). Rewritten by the proxy, it leads the client to the proxy's listener for
    the new leader; unrewritten, to the broker's own port, which the watcher would see. The new leader is a
    broker the client has no connection to yet (neither the old leader nor the group's coordinator), so the
    address it is told is the one it dials: checked to fail with the share rewrite switched off."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = _name("share-move")
    admin = AdminClient({"bootstrap.servers": share_cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    leader, replicas = _leader_and_replicas(share_cluster, topic)
    group = _name("share-move")
    coordinator = _share_coordinator(share_cluster, group)
    target = next(r for r in replicas if r not in (leader, coordinator))
    n = 400
    started = time.monotonic()
    proc = share_probe_popen(
        proxy.bootstrap,
        topic=topic,
        group=group,
        members=1,
        expect=n,
        timeout_ms=120_000,
        client_id="share-move",
        ack="explicit",
        props={"max.poll.records": 20},
        dist=share_cluster.dist,
    )
    with ConnectionWatcher([proc.pid], children=True) as watcher:
        producer = threading.Thread(
            target=_produce, args=(share_cluster, topic, n, 100, 40.0), kwargs={"partitions": 1}
        )
        producer.start()
        time.sleep(4)  # the member has joined and is fetching from the first leader
        _move_leader(share_cluster, topic, target, replicas, tmp_path)
        res = share_probe_result(proc, started, timeout=180)
        producer.join()
    new_leader = _leader_and_replicas(share_cluster, topic)[0]
    summary = (
        f"leader {leader} -> {new_leader} (coordinator {coordinator}); {len(res.records)} records in "
        f"{res.wall_s:.1f} s, offsets {res.offsets}, failures {res.failures()}"
    )
    print(summary)
    assert new_leader == target, summary
    assert not res.failures(), res.stderr[-4000:]
    assert {(r["partition"], r["offset"]) for r in res.records} == {(0, o) for o in range(n)}, summary
    assert res.offsets[0]["lag"] == 0, f"unacknowledged records: {summary}"
    leaked = watcher.remote_ports & broker_ports(share_cluster)
    assert not leaked, f"the share consumer connected straight to broker ports {leaked}"
