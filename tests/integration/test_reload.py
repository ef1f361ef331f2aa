"""Reloads against the real cluster: what the file changes takes full effect, or keeps its running value with one
"takes effect only after a restart" line (config/reload.py).

The two settings a reload once half-applied: the decision log's topic (the guard moved to the new name while
the log kept writing to the old one, which any tenant could then read) and ``quotas.scope`` into ``fleet`` (a
fleet ledger that no sync fed, and no word of it). And one reloadable setting whose effect only the cluster
shows: ``quotas.enforce`` turning shadow mode into throttling for a real producer. The rest are in
tests/unit/test_reload.py, one test each.
"""

from __future__ import annotations

import os
import time
import urllib.request
import uuid

import pytest
import yaml
from kafka.protocol.metadata import MetadataRequest

from tests.harness import free_port
from tests.harness.request_bodies import fetch_request
from tests.support import KafkaWire, wait_until

pytestmark = pytest.mark.cluster

TOPIC_AUTHORIZATION_FAILED = 29
RESTART = "it takes effect only after a restart"


def _edit(proxy, **settings) -> None:
    """Rewrite the proxy's file with ``settings`` (dotted) changed: the proxy reloads it within a second."""
    doc = yaml.safe_load(proxy.config_path.read_text())
    for dotted, value in settings.items():
        node = doc
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    proxy.config_path.write_text(yaml.safe_dump(doc))


def _reloaded(proxy, times: int = 1) -> None:
    wait_until(lambda: proxy.log().count("configuration reloaded") >= times, 20, what="the proxy to reload its file")


def _records(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` holds, asked of the cluster itself (0 when it does not exist)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reload-test-counter"})
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        ends = (consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in found.partitions)
        return sum(high for _low, high in ends)
    finally:
        consumer.close()


def _producer(bootstrap: str, client_id: str):
    """A librdkafka producer, and the list its statistics append the largest throttle_time_ms it was told to."""
    import json

    from confluent_kafka import Producer

    throttles: list[int] = []

    def stats(raw: str) -> None:
        for b in json.loads(raw).get("brokers", {}).values():
            throttles.append(int(b.get("throttle", {}).get("max", 0)))

    config = {"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 0, "statistics.interval.ms": 200}
    return Producer({**config, "stats_cb": stats}), throttles


def _send(producer, topic: str, records: int, size: int = 1000) -> None:
    for _ in range(records):
        producer.produce(topic, b"x" * size)
        producer.poll(0)
    assert producer.flush(60) == 0
    producer.poll(0.5)  # the last statistics


def _produce(bootstrap: str, topic: str, client_id: str, records: int) -> None:
    producer, _ = _producer(bootstrap, client_id)
    _send(producer, topic, records)


def _fetch_error(proxy, topic: str) -> list[int]:
    """Metadata and Fetch for ``topic`` through the proxy, as a plain client (ANONYMOUS, no admin): the topic's
    error codes."""
    wire = KafkaWire(proxy.bootstrap)
    try:
        T = MetadataRequest.MetadataRequestTopic
        wire.send(
            MetadataRequest(
                topics=[T(name=topic, topic_id=None)],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            12,
        )
        codes = [t.error_code for t in wire.recv()[1].topics]
        wire.send(fetch_request(topic, max_wait_ms=100), 12)
        for r in wire.recv()[1].responses:
            codes += [p.error_code for p in r.partitions]
        return codes
    finally:
        wire.close()


def test_a_reload_that_renames_the_decision_logs_topic_keeps_the_old_one_written_and_protected(cluster, fresh_proxy):
    run = uuid.uuid4().hex[:8]
    t1, t2, traffic = f"ktp-decisions-{run}-a", f"ktp-decisions-{run}-b", f"reload-traffic-{run}"
    proxy = fresh_proxy(
        **{
            "decision_log.topic": t1,
            "decision_log.summary_seconds": 1,
            "quotas.entities": [{"entity": {"client-id": "tenant"}, "quotas": {"producer_byte_rate": 1 << 30}}],
        }
    )
    _produce(proxy.bootstrap, traffic, "tenant", 20)
    wait_until(lambda: _records(cluster.bootstrap, t1) > 0, 30, what="decision records on the first topic")
    assert _fetch_error(proxy, t1) == [TOPIC_AUTHORIZATION_FAILED] * 2

    _edit(proxy, **{"decision_log.topic": t2})
    _reloaded(proxy)
    # What the log writes stays the proxy's: a plain client is refused it, as before the reload.
    assert _fetch_error(proxy, t1) == [TOPIC_AUTHORIZATION_FAILED] * 2
    before = _records(cluster.bootstrap, t1)
    _produce(proxy.bootstrap, traffic, "tenant", 20)
    wait_until(lambda: _records(cluster.bootstrap, t1) > before, 30, what="the log to go on writing the first topic")
    assert _records(cluster.bootstrap, t2) == 0  # the log did not move either
    assert f"config reload: decision_log changed; {RESTART}" in proxy.log()


def test_a_reload_into_fleet_scope_waits_for_a_restart_and_says_so(cluster, fresh_proxy):
    os.environ.setdefault("KTP_TEST_FLEET_SECRET", "fleet-test-secret-" + uuid.uuid4().hex)
    port = free_port()
    fleet = {"fleet.name": f"r{uuid.uuid4().hex[:8]}", "fleet.secret_env": "KTP_TEST_FLEET_SECRET"}
    proxy = fresh_proxy(**fleet, **{"metrics.port": port})
    _edit(proxy, **{"quotas.scope": "fleet"})
    _reloaded(proxy)
    assert f"config reload: quotas.scope (broker → fleet) changed; {RESTART}" in proxy.log()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "ktp_fleet_" not in metrics  # no member, no ledger: the proxy enforces on its own, as its scope says


def test_a_reload_that_ends_shadow_mode_throttles_a_producer_at_once(cluster, fresh_proxy):
    topic = f"reload-enforce-{uuid.uuid4().hex[:8]}"
    quota = {"quotas.entities": [{"entity": {"client-id": "shadowed"}, "quotas": {"producer_byte_rate": 5000}}]}
    proxy = fresh_proxy(**{"quotas.enforce": False}, **quota)

    def burst_then_one() -> tuple[list[int], float]:
        """100 kB at once (twice what 5 kB/s allows over Kafka's 10 s window), then how long one more record on
        the same connection takes: the burst is answered at once with its throttle (KIP-219), and the connection
        is not read until it is served."""
        producer, throttles = _producer(proxy.bootstrap, "shadowed")
        _send(producer, topic, 100)
        started = time.monotonic()
        _send(producer, topic, 1)
        return throttles, time.monotonic() - started

    throttles, shadow_s = burst_then_one()
    assert max(throttles, default=0) == 0 and shadow_s < 2, (throttles, shadow_s)  # charged, not held
    _edit(proxy, **{"quotas.enforce": True})
    _reloaded(proxy)
    throttles, enforced_s = burst_then_one()
    assert max(throttles) > 0, "no throttle_time_ms after the reload turned enforcement on"
    assert enforced_s > 2, enforced_s
    assert RESTART not in proxy.log()
