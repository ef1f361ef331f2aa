"""A fleet member dies mid-run (issue 32, item 1): its clients move to the others, losing nothing and writing
nothing twice, and the quota still holds across the survivors.

Three members of one fleet; every client is given all three in ``bootstrap.servers`` and is otherwise unmodified:
Kafka's own VerifiableProducer (idempotent, acks=all) and VerifiableConsumer (a group) in Java, and a librdkafka
producer at full speed under a byte-rate quota. The member holding the most connections is SIGKILLed. Then:
every acknowledged record is in the topic once, in order (read straight from the cluster); the group consumed
every record, a poll's worth at most twice (groups are at-least-once across a failure); the quota'd producer's
rate over the 60 s after the kill is within 10 % of its quota (measured where the bytes land, the partition's log
on disk): the dead member's usage ages out of the survivors' windows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.harness.cluster import free_port
from tests.harness.measure import MIB, Sampler, create_topic, log_bytes, topic_dirs
from tests.harness.traffic import rdkafka_produce
from tests.support import wait_until

pytestmark = pytest.mark.cluster

MEMBERS = 3
MAX_POLL_RECORDS = 500
"""The consumer's max.poll.records (Kafka's default): what one poll delivers before it is committed."""
RECORDS = 16_000  # the Java producer's, at 200/s: 80 s
QUOTA = MIB // 2
AFTER_KILL_S = 60
os.environ.setdefault("KTP_TEST_FLEET_SECRET", "fleet-test-secret-" + uuid.uuid4().hex)


def _metric(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return float("nan")
    return float("nan")


def _java(cluster, workdir: Path, name: str, main: str, *args: str, **config: str) -> tuple[subprocess.Popen, Path]:
    props = workdir / f"{name}.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    out = workdir / f"{name}.out"
    cmd = cluster.tool_cmd(main, *args, "--producer.config" if "Producer" in main else "--consumer.config", str(props))
    proc = subprocess.Popen(
        cmd,
        stdout=out.open("w"),
        stderr=(workdir / f"{name}.err").open("w"),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, out


def verifiable_clients(
    cluster, workdir: Path, topic: str, bootstrap: str, records: int, rate: int, tag: str
) -> tuple[subprocess.Popen, Path, subprocess.Popen, Path]:
    """Kafka's own VerifiableProducer (idempotent, acks=all, ``records`` at ``rate``/s) and VerifiableConsumer (group
    ``g-TAG``) on ``topic``, both rebootstrapping: (producer, its output, consumer, its output)."""
    common = {"metadata.recovery.strategy": "rebootstrap"}
    producer, produced = _java(
        cluster,
        workdir,
        "producer",
        "org.apache.kafka.tools.VerifiableProducer",
        "--topic",
        topic,
        "--bootstrap-server",
        bootstrap,
        "--max-messages",
        str(records),
        "--throughput",
        str(rate),
        "--acks",
        "-1",
        **common,
        **{
            "enable.idempotence": "true",
            "delivery.timeout.ms": "180000",
            "retries": "2147483647",  # the tool sets 0; idempotence needs retries
            "client.id": f"vp-{tag}",
        },
    )
    consumer, consumed = _java(
        cluster,
        workdir,
        "consumer",
        "org.apache.kafka.tools.VerifiableConsumer",
        "--topic",
        topic,
        "--group-id",
        f"g-{tag}",
        "--bootstrap-server",
        bootstrap,
        "--reset-policy",
        "earliest",
        "--verbose",
        **common,
        **{"client.id": f"vc-{tag}"},
    )
    return producer, produced, consumer, consumed


def _consumed_values(path: Path) -> set[str]:
    return {e["value"] for e in _events(path) if e.get("name") == "record_data"}


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _values_in_topic(bootstrap: str, topic: str, n: int) -> list[str]:
    """Every value of partition 0, straight from the cluster."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, 0, 0)])
    values: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < n and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                if not m.error():
                    value = m.value()
                    assert value is not None  # the test's records all have one
                    values.append(value.decode())
        for m in c.consume(1000, 2.0):  # anything past n (a duplicate) shows too
            if not m.error():
                value = m.value()
                assert value is not None  # the test's records all have one
                values.append(value.decode())
    finally:
        c.close()
    return values


def test_a_member_dies_and_its_clients_move_on_losing_and_duplicating_nothing(cluster, fresh_proxy, tmp_path):
    fleet = f"fo{uuid.uuid4().hex[:8]}"
    ports = [free_port() for _ in range(MEMBERS)]
    quota_client = f"q-{fleet}"
    members = [
        fresh_proxy(
            **{
                # The static quota's fidelity across the fleet is what is measured: fair share (on by default) saw
                # these brokers saturate under the suite's load and held the quota'd producer to its share, 0.3-0.4
                # MiB/s of work among 2 tenants (CI 2026-12-07: 0.889 x quota).
                # tests/integration/test_fair_share_fleet.py tests fair share in a fleet.
                "quotas.fair_share.enabled": False,
                "quotas.scope": "fleet",
                "fleet.name": fleet,
                "fleet.member": f"m{i}",
                "fleet.secret_env": "KTP_TEST_FLEET_SECRET",
                "metrics.port": ports[i],
                "quotas.entities": [{"entity": {"client-id": quota_client}, "quotas": {"producer_byte_rate": QUOTA}}],
            }
        )
        for i in range(MEMBERS)
    ]
    wait_until(
        lambda: all(
            _metric(p, "ktp_fleet_connected") == 1 and _metric(p, "ktp_fleet_lease_members") == MEMBERS for p in ports
        ),
        60,
        what="every member connected to the fleet's topics, holding a lease among all of them",
    )
    bootstrap = ",".join(m.bootstrap for m in members)
    topic, quota_topic = f"fo-{fleet}", f"foq-{fleet}"
    create_topic(cluster, topic, [1])
    create_topic(cluster, quota_topic, [2])
    dirs = topic_dirs(cluster, quota_topic)
    common = {"metadata.recovery.strategy": "rebootstrap"}
    producer, produced, consumer, consumed = verifiable_clients(
        cluster, tmp_path, topic, bootstrap, RECORDS, 200, fleet
    )
    quota_result: dict = {}
    quota_thread = threading.Thread(
        target=lambda: quota_result.update(
            rdkafka_produce(
                bootstrap,
                quota_topic,
                quota_client,
                25 + AFTER_KILL_S + 5,
                outstanding=2_000,
                **{"enable.idempotence": True, "batch.size": 65536, "message.timeout.ms": 180_000, **common},
            )
        )
    )
    try:
        with Sampler(lambda: log_bytes(dirs)) as sampler:
            quota_thread.start()
            time.sleep(25)  # everyone connected and running; the quota'd producer past its first burst
            busy = [_metric(p, "ktp_connections") for p in ports]
            victim = max(range(MEMBERS), key=lambda i: busy[i])
            members[victim].proc.kill()
            members[victim].proc.wait()
            killed_at = time.monotonic()
            quota_thread.join(AFTER_KILL_S + 200)
            assert producer.wait(240) == 0, (tmp_path / "producer.err").read_text()[-2000:]
            # Not --max-messages: a group is at-least-once across a failure, and a redelivered record would stop it
            # one record short. It runs until every record has arrived, then is stopped as a user would.
            wait_until(
                lambda: len(_consumed_values(consumed)) >= RECORDS, 240, what="the group to consume every record"
            )
            os.killpg(consumer.pid, signal.SIGTERM)
            consumer.wait(60)
    finally:
        for p in (producer, consumer):
            if p.poll() is None:
                os.killpg(p.pid, 9)
    survivors = [i for i in range(MEMBERS) if i != victim]
    print(f"failover: connections per member before the kill {busy}; killed m{victim}")

    # The idempotent producer: every record acknowledged, each once, in order.
    sent = [e for e in _events(produced) if e.get("name") == "producer_send_success"]
    errors = [e for e in _events(produced) if e.get("name") == "producer_send_error"]
    assert len(sent) == RECORDS and not errors, (len(sent), errors[:3])
    assert _values_in_topic(cluster.bootstrap, topic, RECORDS) == [str(i) for i in range(RECORDS)]

    # The group: every record, none lost. Kafka's groups are at-least-once across a failure: the batch delivered and
    # not yet committed when the member died comes again (once in CI: record 4757 twice), at most one poll's worth.
    values = [e["value"] for e in _events(consumed) if e.get("name") == "record_data"]
    assert set(values) == {str(i) for i in range(RECORDS)}, f"{len(values)} records, {len(set(values))} distinct"
    print(f"group: {len(values) - RECORDS} records redelivered after the failover")
    assert len(values) - RECORDS <= MAX_POLL_RECORDS, f"{len(values) - RECORDS} records redelivered"

    # The quota across the survivors, over the minute after the kill.
    assert not quota_result.get("errors"), quota_result.get("errors", [])[:3]
    samples = sampler.samples

    def at(t: float) -> float:
        return next(v for ts, v in samples if ts >= t)

    rate = (at(killed_at + AFTER_KILL_S) - at(killed_at)) / AFTER_KILL_S
    print(f"quota'd producer after the kill: {rate / QUOTA:.3f} x quota over {AFTER_KILL_S} s")
    # where a shortfall (or a burst) comes from: the seconds around the kill, one by one
    steps = [round((at(killed_at + s + 1) - at(killed_at + s)) / QUOTA, 2) for s in range(-5, 12)]
    print(f"each second from 5 s before the kill to 12 s after, x quota: {steps}")
    assert abs(rate / QUOTA - 1) <= 0.10
    assert sum(_metric(ports[i], "ktp_connections_accepted_total") for i in survivors) > 0
