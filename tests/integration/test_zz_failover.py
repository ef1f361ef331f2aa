"""Stopping a partition leader's broker moves clients to the new leader, still through the proxy,
with no record lost or reordered. Runs last (it stops and restarts a broker of the shared cluster)."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import broker_ports
from tests.support import ConnectionWatcher, wait_until

pytestmark = pytest.mark.cluster


def _leader(bootstrap: str, topic: str) -> int:
    """The partition's leader, once the broker answering knows the topic (metadata propagates a moment later)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def known():
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        return parts[0].leader if 0 in parts and parts[0].leader >= 0 else None

    return wait_until(known, 30, what=f"a leader for {topic}")


def test_leader_failover_through_the_proxy(cluster, proxy):
    topic = f"failover-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "1"})])[topic].result(30)
    old_leader = _leader(proxy.bootstrap, topic)
    sent: list[int] = []
    errors: list = []
    stop = threading.Event()

    def produce() -> None:
        p = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 60000,
            }
        )
        i = 0
        while not stop.is_set():
            p.produce(topic, str(i).encode(), on_delivery=lambda e, _m: errors.append(e) if e else None)
            sent.append(i)
            i += 1
            p.poll(0)
            time.sleep(0.005)
        assert p.flush(60) == 0

    t = threading.Thread(target=produce)
    try:
        with ConnectionWatcher([os.getpid()]) as w:
            t.start()
            time.sleep(2)
            cluster.stop_broker(old_leader)  # a signal; restarting (which probes brokers) is outside
            deadline = time.monotonic() + 60
            while (new_leader := _leader(proxy.bootstrap, topic)) in (old_leader, -1):
                assert time.monotonic() < deadline, "no new leader elected"
                time.sleep(0.5)
            before = len(sent)
            time.sleep(4)
            stop.set()
            t.join(90)
            assert len(sent) > before, "production went on after the failover"
            c = Consumer(
                {
                    "bootstrap.servers": proxy.bootstrap,
                    "group.id": f"g-{topic}",
                    "auto.offset.reset": "earliest",
                    "enable.partition.eof": True,
                }
            )
            c.subscribe([topic])
            got: list[int] = []
            deadline = time.monotonic() + 60
            while len(got) < len(sent) and time.monotonic() < deadline:
                for m in c.consume(500, 1.0):
                    if not m.error():
                        got.append(int(m.value()))
            c.close()
    finally:
        stop.set()
        t.join(90)
        cluster.start_broker(old_leader)
    assert errors == []
    assert got == sent, "every record arrives exactly once and in order"
    assert new_leader != old_leader
    assert not (w.remote_ports & broker_ports(cluster)), "clients stayed on the proxy"
    assert "closed the connection" in proxy.log(), "the proxy saw the broker go and closed its clients"
