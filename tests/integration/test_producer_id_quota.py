"""KIP-936 end to end: new producer ids per user, against the real cluster's SASL listener.

User alice runs the KIP's misbehaving pattern (a new idempotent producer per batch, librdkafka); user bob runs
one long-lived idempotent producer. Both fall under the same ``<default user>`` quota, each in its own bucket.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid

import psutil
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
    conf = {
        **cluster.client_config(user, "SCRAM-SHA-512"),
        "bootstrap.servers": proxy.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        **extra,
    }
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
        r = cluster.tool(
            "producer_perf",
            "--bootstrap-server",
            proxy.bootstrap,
            "--topic",
            topic,
            "--num-records",
            "1",
            "--record-size",
            "100",
            "--throughput",
            "-1",
            "--command-config",
            str(props),
            "--command-property",
            "acks=all",
            "enable.idempotence=true",
            timeout=180,
        )
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
        took.append(time.monotonic() - t0)
    assert _metric(port, "ktp_producerids_recorded_total", "alice") == 5  # one new id per JVM
    assert _metric(port, "ktp_producerids_throttle_time_total", "alice") > 0
    # Once over quota the next JVM's InitProducerId/Produce waits out the throttle on its fresh connections.
    assert max(took[2:]) > min(took[:2]) + 3.0, [round(t, 1) for t in took]


STORM_WINDOW_S = 5
STORM_QUOTA = 5  # new producer ids per 5 s window: 1 per second
STORM_THREADS = 3
STORM_PER_THREAD = 8


def test_storm_of_new_producers_is_held_never_disconnected(cluster, fresh_proxy):
    """A storm of short-lived idempotent producers (the KIP's pattern, several at once) over producer_ids_rate:
    the proxy holds each new producer's requests until the user's throttle is over and then serves them. No
    connection is closed by the proxy, every record is delivered, memory stays flat, nothing is logged as an
    error. Timing is checked from points that do not move with load: a producer's request is answered no
    sooner than the throttle its predecessor was told, counted from before that predecessor even started."""
    port = free_port()
    proxy = fresh_proxy(
        sasl=True,
        **{
            "metrics.port": port,
            "quotas.producer_id_window_num": 2,
            "quotas.producer_id_window_size_seconds": STORM_WINDOW_S,
            "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"producer_ids_rate": STORM_QUOTA}}],
        },
    )
    topic = f"pids-storm-{uuid.uuid4().hex[:6]}"
    warm = _producer(cluster, proxy, "bob")
    _one_batch(warm, topic, b"create the topic")
    rss_before = psutil.Process(proxy.proc.pid).memory_info().rss
    hold_max_s = 20.0  # producer_id_hold_max_ms's default

    runs: dict[int, list[tuple[float, float, float]]] = {t: [] for t in range(STORM_THREADS)}
    failures: list[str] = []

    def storm(thread: int) -> None:
        for i in range(STORM_PER_THREAD):
            told: list[float] = []
            started = time.monotonic()
            p = _producer(cluster, proxy, "alice", throttle_cb=lambda ev, told=told: told.append(ev.throttle_time))
            p.produce(topic, value=f"alice-{thread}-{i}".encode())
            left = p.flush(90)
            if left:
                failures.append(f"thread {thread} producer {i}: {left} record(s) not delivered")
            runs[thread].append((started, time.monotonic(), max(told, default=0.0)))

    threads = [threading.Thread(target=storm, args=(t,)) for t in range(STORM_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not failures, failures

    log = proxy.log()
    assert "closing the connection" not in log, [ln for ln in log.splitlines() if "closing the connection" in ln][:5]
    for bad in ("ERROR", "Traceback", "never awaited"):
        assert bad not in log, [ln for ln in log.splitlines() if bad in ln][:5]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert not re.search(r"^ktp_connection_errors_total\{.*\} [1-9]", text, re.M), "connections closed in error"
    total = STORM_THREADS * STORM_PER_THREAD
    assert _metric(port, "ktp_producerids_recorded_total", "alice") == total  # every producer served, once
    assert _metric(port, "ktp_producerids_throttle_time_total", "alice") > 0
    # Held, not served early: the producer after one that was told a throttle T finished no sooner than T after
    # that one started (its Produce was charged after it started; the hold runs from that charge).
    held = 0
    for seq in runs.values():
        for (started, _done, throttle), (_s, done, _t) in zip(seq, seq[1:], strict=False):
            if throttle > 0:
                held += 1
                assert done - started >= min(throttle, hold_max_s) - 0.01, (started, done, throttle)
    assert held >= total // 4, f"only {held} producers followed a throttled one: the quota hardly bit"
    # The rate held: from the first producer's start to the last one's end, at most B + R·T new ids.
    first = min(seq[0][0] for seq in runs.values())
    last = max(seq[-1][1] for seq in runs.values())
    assert total <= STORM_QUOTA * 2 + (last - first) * STORM_QUOTA / STORM_WINDOW_S + STORM_THREADS
    rss_after = psutil.Process(proxy.proc.pid).memory_info().rss
    assert rss_after - rss_before < 40 * 2**20, (rss_before, rss_after)
