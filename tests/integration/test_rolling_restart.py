"""A rolling restart loses nothing (issue 38, item 5): two proxies of one fleet behind one bootstrap list, each
restarted in turn (SIGTERM, back on the same ports, ready), twice over, while unmodified clients work.

Kafka's own VerifiableProducer (Java, idempotent, acks=all) and VerifiableConsumer (a group), both given both
proxies in ``bootstrap.servers``, and a librdkafka producer at full speed under a fleet-wide byte-rate quota. Then:
every record the producer sent was acknowledged and is in the topic once, in order (read straight from the
cluster); the group consumed every record (a group is at-least-once across a member leaving: a poll's worth may
come twice); the quota'd producer landed at most 10 % over its quota over the whole rolling restart, and at least
75 % of it (measured where the bytes land, the partition's log on disk). Each proxy drains on SIGTERM (exit 0) and
is ready again before the next one goes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from tests.harness.cluster import free_port
from tests.harness.measure import MIB, Sampler, create_topic, log_bytes, topic_dirs
from tests.harness.traffic import rdkafka_produce
from tests.integration.test_fleet_failover import (
    MAX_POLL_RECORDS,
    _consumed_values,
    _events,
    _values_in_topic,
    verifiable_clients,
)
from tests.support import http_get, wait_until

pytestmark = pytest.mark.cluster

MEMBERS = 2
ROUNDS = 2
RATE = 200  # the Java producer's records/s
QUOTA = MIB // 2
SETTLE_S = 8  # between restarts: clients back on the restarted member, the fleet synced
os.environ.setdefault("KTP_TEST_FLEET_SECRET", "fleet-test-secret-" + uuid.uuid4().hex)


def test_two_rolling_restarts_lose_duplicate_and_reorder_nothing_and_hold_the_quota(cluster, fresh_proxy, tmp_path):
    fleet = f"rr{uuid.uuid4().hex[:8]}"
    metrics = [free_port() for _ in range(MEMBERS)]
    bootstraps = [free_port() for _ in range(MEMBERS)]
    quota_client = f"q-{fleet}"
    members = []
    for i in range(MEMBERS):
        first = free_port()
        for _ in range(9):
            free_port()  # broker N at first + N: ten ports of this member's own
        members.append(
            fresh_proxy(
                **{
                    "listen.bootstrap_port": bootstraps[i],
                    "listen.broker_ports": [first, first + 9],
                    # The static quota's fidelity across the fleet is what is measured: fair share (on by default) saw
                    # these brokers saturate under the suite's load and held the quota'd producer to its share, 0.3-0.4
                    # MiB/s of work among 2 tenants (CI 2026-12-07: 0.889 x quota).
                    # tests/integration/test_fair_share_fleet.py tests fair share in a fleet.
                    "quotas.fair_share.enabled": False,
                    "quotas.scope": "fleet",
                    "quotas.enforcement": "smooth",
                    "fleet.name": fleet,
                    "fleet.member": f"m{i}",
                    "fleet.secret_env": "KTP_TEST_FLEET_SECRET",
                    "metrics.port": metrics[i],
                    "shutdown_unready_ms": 500,
                    "quotas.entities": [
                        {"entity": {"client-id": quota_client}, "quotas": {"producer_byte_rate": QUOTA}}
                    ],
                }
            )
        )
    wait_until(lambda: all(http_get(p, "/readyz", 2)[0] == 200 for p in metrics), 60, what="both members ready")
    bootstrap = ",".join(m.bootstrap for m in members)
    topic, quota_topic = f"rr-{fleet}", f"rrq-{fleet}"
    create_topic(cluster, topic, [1])
    create_topic(cluster, quota_topic, [2])
    dirs = topic_dirs(cluster, quota_topic)
    restarts_s = 10 + MEMBERS * ROUNDS * (SETTLE_S + 6)
    records = RATE * (restarts_s + 10)
    common = {"metadata.recovery.strategy": "rebootstrap"}
    producer, produced, consumer, consumed = verifiable_clients(
        cluster, tmp_path, topic, bootstrap, records, RATE, fleet
    )
    quota_result: dict = {}
    quota_thread = threading.Thread(
        target=lambda: quota_result.update(
            rdkafka_produce(
                bootstrap,
                quota_topic,
                quota_client,
                restarts_s + 15,
                outstanding=2_000,
                **{"enable.idempotence": True, "batch.size": 65536, "message.timeout.ms": 180_000, **common},
            )
        )
    )
    exits: list[int] = []
    try:
        with Sampler(lambda: log_bytes(dirs)) as sampler:
            quota_thread.start()
            time.sleep(10)  # everyone connected and running; the quota'd producer paced
            began = time.monotonic()
            for _ in range(ROUNDS):
                for i, member in enumerate(members):
                    exits.append(member.terminate(timeout=60))  # SIGTERM: unready, then drained
                    member.start()
                    wait_until(lambda i=i: http_get(metrics[i], "/readyz", 2)[0] == 200, 30, what=f"m{i} ready again")
                    time.sleep(SETTLE_S)
            ended = time.monotonic()
            quota_thread.join(restarts_s + 200)
            assert producer.wait(300) == 0, (tmp_path / "producer.err").read_text()[-2000:]
            wait_until(lambda: len(_consumed_values(consumed)) >= records, 240, what="the group to consume all")
            os.killpg(consumer.pid, signal.SIGTERM)
            consumer.wait(60)
    finally:
        for p in (producer, consumer):
            if p.poll() is None:
                os.killpg(p.pid, 9)
    assert exits == [0] * (MEMBERS * ROUNDS), exits

    # The idempotent producer: every record acknowledged, each once, in order.
    sent = [e for e in _events(produced) if e.get("name") == "producer_send_success"]
    errors = [e for e in _events(produced) if e.get("name") == "producer_send_error"]
    assert len(sent) == records and not errors, (len(sent), errors[:3])
    assert _values_in_topic(cluster.bootstrap, topic, records) == [str(i) for i in range(records)]

    # The group: every record; what a member leaving makes it read again is at most a poll's worth a restart.
    values = [e["value"] for e in _events(consumed) if e.get("name") == "record_data"]
    assert set(values) == {str(i) for i in range(records)}, f"{len(values)} records, {len(set(values))} distinct"
    print(f"rolling restart: {len(values) - records} records redelivered to the group over {len(exits)} restarts")
    assert len(values) - records <= MAX_POLL_RECORDS * len(exits)

    # The quota, over the rolling restart as a whole.
    assert not quota_result.get("errors"), quota_result.get("errors", [])[:3]
    samples = sampler.samples

    def at(t: float) -> float:
        return next(v for ts, v in samples if ts >= t)

    rate = (at(ended) - at(began)) / (ended - began)
    print(f"quota'd producer over the restarts: {rate / QUOTA:.3f} x quota over {ended - began:.0f} s")
    # Never over by more than Kafka's own bar allows a broker (5 %) plus the fleet's sync; under, by what the
    # restarts cost the producer (each takes its connections for a moment: it reconnects, and its paced bucket
    # starts empty on the member it lands on).
    assert 0.75 <= rate / QUOTA <= 1.10
