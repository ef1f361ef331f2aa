"""KIP-936 end to end: new producer ids per user, against the real cluster's SASL listener.

User alice runs the KIP's misbehaving pattern (a new idempotent producer per batch, librdkafka); user bob runs
one long-lived idempotent producer. Both fall under the same ``<default user>`` quota, each in its own bucket.
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid

from confluent_kafka import Producer

from tests.harness import free_port

QUOTA = {
    "quotas.producer_id_window_num": 2,
    "quotas.producer_id_window_size_seconds": 10,
    # 5 new ids per 10 s window, for every user separately
    "quotas.entities": [{"entity": {"user": "<default>"}, "quotas": {"producer_ids_rate": 5}}],
}


def _metric(port: int, name: str, user: str, over=sum) -> float:
    """A per-user quota metric, combined over brokers (per-broker scope, as Kafka) with ``over``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = [float(m.group(1)) for m in re.finditer(rf'^{name}{{[^}}]*user="{user}"[^}}]*}} (\S+)$', text, re.M)]
    return over(values) if values else 0.0


def _producer(cluster, proxy, user: str, **extra) -> Producer:
    conf = {**cluster.client_config(user, "SCRAM-SHA-512"), "bootstrap.servers": proxy.bootstrap,
            "enable.idempotence": True, "acks": "all", **extra}
    return Producer(conf)


def _one_batch(producer: Producer, topic: str, value: bytes) -> None:
    producer.produce(topic, value=value)
    assert producer.flush(60) == 0


def test_new_producer_per_batch_is_throttled_long_lived_producer_is_not(cluster, fresh_proxy):
    port = free_port()
    proxy = fresh_proxy(sasl=True, **{"metrics.port": port, **QUOTA})
    topic = f"pids-{uuid.uuid4().hex[:6]}"
    # bob: one long-lived idempotent producer keeps its pace (one id, charged once per broker it produces to).
    # Kept inside half a window: KIP-936 forgets ids a half to one window later, then they count as new again.
    warm = _producer(cluster, proxy, "bob")
    _one_batch(warm, topic, b"create the topic")
    t0 = time.monotonic()
    for i in range(200):
        warm.produce(topic, value=f"bob-{i}".encode())
        if i % 20 == 19:
            assert warm.flush(60) == 0
    assert warm.flush(60) == 0
    bob_s = time.monotonic() - t0
    assert _metric(port, "ktp_producerids_throttle_time", "bob") == 0
    assert _metric(port, "ktp_producerids_recorded_total", "bob", over=max) == 1

    # alice: the KIP's misbehaving pattern, a new idempotent producer per batch
    took = []
    for i in range(12):
        t0 = time.monotonic()
        p = _producer(cluster, proxy, "alice")
        _one_batch(p, topic, f"alice-{i}".encode())
        took.append(time.monotonic() - t0)
    assert _metric(port, "ktp_producerids_throttle_time", "alice") > 0
    assert _metric(port, "ktp_producerids_recorded_total", "alice") == 12  # one new id per producer
    # Each new producer comes on new connections, which no mute holds; the proxy holds the user's next
    # Produce/InitProducerId on any connection instead, so once over quota each iteration waits out a throttle.
    first, later = sorted(took[:3])[1], max(took[6:])
    assert later > first + 1.0, f"alice's new producers were not held back: {[round(t, 2) for t in took]}"
    assert sum(took) > bob_s


def test_transactional_producer_restarting_with_the_same_id_is_not_charged_twice(cluster, fresh_proxy):
    port = free_port()
    proxy = fresh_proxy(sasl=True, **{"metrics.port": port, **QUOTA})
    topic = f"pids-tx-{uuid.uuid4().hex[:6]}"
    Producer({**cluster.client_config("bob", "SCRAM-SHA-512"), "bootstrap.servers": proxy.bootstrap}).flush(1)
    tx_id = f"tx-{uuid.uuid4().hex[:6]}"
    for session in range(3):
        p = _producer(cluster, proxy, "alice", **{"transactional.id": tx_id})
        p.init_transactions(60)
        p.begin_transaction()
        p.produce(topic, value=f"session-{session}".encode())
        p.commit_transaction(60)
    # The same transactional id keeps its producer id (only the epoch moves): one new id in all.
    assert _metric(port, "ktp_producerids_recorded_total", "alice", over=max) == 1


def test_java_new_producer_per_batch_is_throttled(cluster, fresh_proxy):
    """The same pattern with Kafka's Java producer: one producer-perf-test JVM (one idempotent producer, one
    record) per batch, as alice. A JVM takes seconds to start, so the quota is 1 new id per 10 s window."""
    port = free_port()
    quota = {**QUOTA, "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"producer_ids_rate": 1}}]}
    proxy = fresh_proxy(sasl=True, **{"metrics.port": port, **quota})
    topic = f"pids-java-{uuid.uuid4().hex[:6]}"
    props = cluster.java_client_props("alice")
    took = []
    for _ in range(5):
        t0 = time.monotonic()
        r = cluster.tool("producer_perf", "--bootstrap-server", proxy.bootstrap, "--topic", topic,
                         "--num-records", "1", "--record-size", "100", "--throughput", "-1",
                         "--command-config", str(props), "--command-property", "acks=all", "enable.idempotence=true",
                         timeout=180)
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
        took.append(time.monotonic() - t0)
    assert _metric(port, "ktp_producerids_recorded_total", "alice") == 5  # one new id per JVM
    assert _metric(port, "ktp_producerids_throttle_time_total", "alice") > 0
    # Once over quota the next JVM's InitProducerId/Produce waits out the throttle on its fresh connections.
    assert max(took[2:]) > min(took[:2]) + 3.0, [round(t, 1) for t in took]
