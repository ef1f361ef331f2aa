"""Every real, unmodified client produces, consumes in a group and administers topics through the
proxy, and never opens a connection to a broker's own port."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid

import pytest

from tests.integration.conftest import broker_ports
from tests.support import ConnectionWatcher, wait_until

pytestmark = pytest.mark.cluster
N = 50


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _assert_only_proxy(watcher: ConnectionWatcher, cluster, proxy) -> None:
    leaked = watcher.remote_ports & broker_ports(cluster)
    assert not leaked, f"client connected straight to broker ports {leaked}"
    assert watcher.remote_ports & proxy.listening_ports(), "the client never connected to the proxy at all"


def _partitions_on_cluster(cluster, topic: str) -> int | None:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return len(t.partitions)


def _topic_gone(cluster, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    return topic not in AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics


def _consume(consumer, want: int, timeout: float = 60) -> list[bytes]:
    """Values from a confluent-kafka consumer until ``want`` arrived or ``timeout`` passed."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got.extend(m.value() for m in consumer.consume(100, 1.0) if not m.error())
    return got


def test_confluent_kafka_librdkafka(cluster, proxy):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    topic = _topic("ck")
    with ConnectionWatcher([os.getpid()]) as w:
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 3)])[topic].result(30)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(N):
            producer.produce(topic, value=f"m{i}".encode(), key=str(i % 4).encode())
        assert producer.flush(30) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": _topic("g"),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic])
        got = _consume(consumer, N)
        consumer.commit(asynchronous=False)
        consumer.close()
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(N))
        admin.create_partitions([NewPartitions(topic, 5)])[topic].result(30)
    _assert_only_proxy(w, cluster, proxy)
    assert _partitions_on_cluster(cluster, topic) == 5
    with ConnectionWatcher([os.getpid()]) as w:
        admin.delete_topics([topic])[topic].result(30)
    _assert_only_proxy(w, cluster, proxy)
    wait_until(lambda: _topic_gone(cluster, topic), 30, what="topic deletion")


def test_kafka_python(cluster, proxy):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewPartitions, NewTopic

    topic = _topic("kp")
    with ConnectionWatcher([os.getpid()]) as w:
        admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
        admin.create_topics([NewTopic(topic, 2, 3)])
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
        for i in range(N):
            producer.send(topic, f"m{i}".encode())
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=proxy.bootstrap,
            group_id=_topic("g"),
            auto_offset_reset="earliest",
            consumer_timeout_ms=30000,
        )
        got = []
        for msg in consumer:
            got.append(msg.value)
            if len(got) >= N:
                break
        consumer.commit()
        consumer.close()
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(N))
        admin.create_partitions({topic: NewPartitions(total_count=4)})
    _assert_only_proxy(w, cluster, proxy)
    assert _partitions_on_cluster(cluster, topic) == 4
    with ConnectionWatcher([os.getpid()]) as w:
        admin.delete_topics([topic])
        admin.close()
    _assert_only_proxy(w, cluster, proxy)
    wait_until(lambda: _topic_gone(cluster, topic), 30, what="topic deletion")


def test_aiokafka(cluster, proxy):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

    topic = _topic("aio")

    async def scenario() -> list[bytes]:
        admin = AIOKafkaAdminClient(bootstrap_servers=proxy.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(topic, 2, 3)])
        producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
        await producer.start()
        for i in range(N):
            await producer.send(topic, f"m{i}".encode())
        await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=proxy.bootstrap, group_id=_topic("g"), auto_offset_reset="earliest"
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(60):
                async for msg in consumer:
                    got.append(msg.value)
                    if len(got) >= N:
                        break
            await consumer.commit()
        finally:
            await consumer.stop()
        await admin.create_partitions({topic: NewPartitions(total_count=3)})
        for _ in range(50):  # brokers learn the new partitions from the controller a moment later
            md = await admin.describe_topics([topic])
            if len(md[0]["partitions"]) == 3:
                break
            await asyncio.sleep(0.2)
        assert len(md[0]["partitions"]) == 3
        await admin.delete_topics([topic])
        await admin.close()
        return got

    with ConnectionWatcher([os.getpid()]) as w:
        got = asyncio.run(scenario())
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(N))
    _assert_only_proxy(w, cluster, proxy)
    wait_until(lambda: _topic_gone(cluster, topic), 30, what="topic deletion")


def test_java_tools(cluster, proxy):
    topic = _topic("java")
    group = _topic("g")
    with ConnectionWatcher([]) as w:

        def run(main, *args, input=None, timeout=120):
            proc = cluster.tool_popen(
                main, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            w.add(proc.pid)
            out, err = proc.communicate(input, timeout=timeout)
            assert proc.returncode == 0, f"{main} {args} failed:\n{out}\n{err}"
            return out

        run(
            "topics",
            "--bootstrap-server",
            proxy.bootstrap,
            "--create",
            "--topic",
            topic,
            "--partitions",
            "2",
            "--replication-factor",
            "3",
        )
        run(
            "console_producer",
            "--bootstrap-server",
            proxy.bootstrap,
            "--topic",
            topic,
            input="".join(f"m{i}\n" for i in range(N)),
        )
        out = run(
            "console_consumer",
            "--bootstrap-server",
            proxy.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--from-beginning",
            "--max-messages",
            str(N),
            "--timeout-ms",
            "60000",
        )
        assert sorted(out.split()) == sorted(f"m{i}" for i in range(N))
        run("topics", "--bootstrap-server", proxy.bootstrap, "--alter", "--topic", topic, "--partitions", "4")
        desc = run("topics", "--bootstrap-server", proxy.bootstrap, "--describe", "--topic", topic)
        assert "PartitionCount: 4" in desc
        run("topics", "--bootstrap-server", proxy.bootstrap, "--delete", "--topic", topic)
    _assert_only_proxy(w, cluster, proxy)
    wait_until(lambda: _topic_gone(cluster, topic), 30, what="topic deletion")


def test_kcat(cluster, proxy):
    """kcat has no admin commands: the topic is auto-created by the produce; group consume via -G."""
    topic = _topic("kcat")
    with ConnectionWatcher([]) as w:
        p = subprocess.Popen(
            ["kcat", "-b", proxy.bootstrap, "-P", "-t", topic, "-X", "acks=all"], stdin=subprocess.PIPE, text=True
        )
        w.add(p.pid)
        p.communicate("".join(f"m{i}\n" for i in range(N)), timeout=60)
        assert p.returncode == 0
        c = subprocess.Popen(
            [
                "kcat",
                "-b",
                proxy.bootstrap,
                "-G",
                _topic("g"),
                "-X",
                "auto.offset.reset=earliest",
                "-c",
                str(N),
                "-q",
                topic,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        w.add(c.pid)
        out, _ = c.communicate(timeout=90)
        assert c.returncode == 0
        assert sorted(out.split()) == sorted(f"m{i}" for i in range(N))
        lst = subprocess.run(
            ["kcat", "-b", proxy.bootstrap, "-L", "-t", topic], capture_output=True, text=True, timeout=30
        )
        # kcat prints the broker addresses it was given: they must be the proxy's.
        assert "broker" in lst.stdout
        for port in broker_ports(cluster):
            assert f":{port}" not in lst.stdout
    _assert_only_proxy(w, cluster, proxy)


def test_sasl_scram_and_plain_pass_through(cluster, sasl_proxy):
    from confluent_kafka import Consumer, Producer

    topic = _topic("sasl")
    for mech, user in (("SCRAM-SHA-512", "alice"), ("PLAIN", "bob")):
        conf = {**cluster.client_config(user, mech), "bootstrap.servers": sasl_proxy.bootstrap}
        with ConnectionWatcher([os.getpid()]) as w:
            producer = Producer({**conf, "acks": "all"})
            producer.produce(topic, value=mech.encode())
            assert producer.flush(30) == 0
            consumer = Consumer({**conf, "group.id": _topic("g"), "auto.offset.reset": "earliest"})
            consumer.subscribe([topic])
            got = _consume(consumer, 1)
            consumer.close()
            assert mech.encode() in got
        _assert_only_proxy(w, cluster, sasl_proxy)
    bad = Producer(
        {
            **cluster.client_config("alice", "SCRAM-SHA-512"),
            "bootstrap.servers": sasl_proxy.bootstrap,
            "sasl.password": "wrong",
            "message.timeout.ms": 5000,
        }
    )
    errors = []
    bad.produce(topic, value=b"x", on_delivery=lambda err, msg: errors.append(err))
    bad.flush(15)
    assert errors and errors[0] is not None, "a wrong password must not get through the proxy"
