"""KIP-599 through the proxy with real, unmodified admin clients.

* Java ``Admin`` 4.4 (CreateTopics v7): with its default retry on quota violation it finishes once the throttle
  is honoured; with ``retryOnQuotaViolation(false)`` exactly the topics over quota fail with
  ThrottlingQuotaExceededException.
* Java ``Admin`` 2.6.3 (CreateTopics v5, before KIP-599): admitted, then held back for the throttle.
* confluent-kafka (librdkafka) and kafka-python admin clients: error 89 on the right topics where their
  CreateTopics version is strict, admitted and throttled where it is not.

R = 10 partitions/s over 2 samples of 1 s: B = 20. Three topics of 15 partitions: the first two are admitted
(20 → 5 → -10), the third is met below zero.
"""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.metadata import MetadataRequest

from tests.harness import admin_probe as ap
from tests.support import KafkaWire, wait_until

QUOTA = {
    "quotas.controller_window_num": 2,
    "quotas.entities": [{"entity": {"user": "<default>"}, "quotas": {"controller_mutation_rate": 10}}],
}
THROTTLING_QUOTA_EXCEEDED = 89


def _names(prefix: str, n: int = 3) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{prefix}-{tag}-{i}" for i in range(n)]


def _existing(cluster, names: list[str]) -> set[str]:
    wire = KafkaWire(cluster.bootstrap.split(",")[0])
    try:
        wire.send(
            MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names], allow_auto_topic_creation=False
            ),
            8,
        )
        return {t.name for t in wire.recv()[1].topics if t.error_code == 0}
    finally:
        wire.close()


def test_java_admin_retries_through_the_throttle_by_default(cluster, fresh_proxy):
    proxy = fresh_proxy(**QUOTA)
    names = _names("java-retry")
    res = ap.admin_probe(proxy.bootstrap, ap.create(names, 15, replication_factor=1), api_timeout_ms=60_000)
    assert {r["topic"]: r["outcome"] for r in res} == {n: "ok" for n in names}
    assert max(r["elapsed_ms"] for r in res) >= 900  # the third topic waited out the 1 s throttle
    wait_until(lambda: _existing(cluster, names) == set(names), 30, what="all three topics on the cluster")


def test_java_admin_without_retries_fails_exactly_the_topics_over_quota(cluster, fresh_proxy):
    proxy = fresh_proxy(**QUOTA)
    names = _names("java-strict")
    res = ap.admin_probe(proxy.bootstrap, ap.create(names, 15, replication_factor=1, retry_on_quota=False))
    outcomes = {r["topic"]: r["outcome"] for r in res}
    assert outcomes == {names[0]: "ok", names[1]: "ok", names[2]: "ThrottlingQuotaExceededException"}
    wait_until(lambda: _existing(cluster, names) == set(names[:2]), 30, what="only the admitted topics")


def _decisions(logdir) -> list[dict]:
    files = [p for p in logdir.rglob("*.jsonl") if not p.name.startswith(".")]
    return [json.loads(line) for p in files for line in p.read_text().splitlines() if line.strip()]


def test_old_java_admin_is_admitted_then_held_back(cluster, fresh_proxy, tmp_path):
    logdir = tmp_path / "decisions"
    proxy = fresh_proxy(
        **QUOTA,
        **{"decision_log.directory": str(logdir), "decision_log.format": "jsonl", "decision_log.rotate_seconds": 1},
    )
    names = _names("java-old")
    later = _names("java-old-next", 1)
    res = ap.admin_probe(
        proxy.bootstrap,
        ap.create(names, 15, replication_factor=1),
        ap.create(later, 1, replication_factor=1),
        client="old",
        log_requests=True,
    )
    assert res.versions()["CREATE_TOPICS"] == {5}
    first = [r for r in res if r["topic"] in names]
    assert {r["outcome"] for r in first} == {"ok"}  # permissive: everything admitted
    second = next(r for r in res if r["topic"] == later[0])
    assert second["outcome"] == "ok" and second["done_ms"] >= max(r["done_ms"] for r in first)

    # 20 - 45 = -25 tokens at 10/s: the proxy tells the client 2.5 s and does not read its channel for that long.
    # Measured where the mute is, from the proxy's own clocks (the first response's decision, the next request's
    # arrival), so a loaded machine can only lengthen the gap, never shorten it.
    def both_logged() -> list[dict] | None:
        found = [e for e in _decisions(logdir) if e["event"] == "request" and e["api_key"] == 19]
        return found if len(found) >= 2 else None

    creates = wait_until(both_logged, 30, what="both CreateTopics decisions in the log")
    creates.sort(key=lambda e: e["req_ts_ms"])
    held, after = creates[0], creates[-1]
    assert held["mutations"] == 45 and held["action"] == "throttle", held
    assert 2400 <= held["throttle_ms"] <= 2600, held
    assert after["req_ts_ms"] - held["ts_ms"] >= held["throttle_ms"] - 20, (held, after)
    wait_until(lambda: _existing(cluster, names) == set(names), 30, what="all topics on the cluster")


def test_librdkafka_admin(cluster, fresh_proxy):
    proxy = fresh_proxy(**QUOTA)
    names = _names("rdkafka")
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    futures = admin.create_topics([NewTopic(n, 15, 1) for n in names], operation_timeout=30)
    errors = {}
    for name, fut in futures.items():
        try:
            fut.result(60)
            errors[name] = 0
        except Exception as exc:  # noqa: BLE001 - KafkaException carrying the broker's error
            errors[name] = exc.args[0].code()
    log = proxy.log()
    if any(code == THROTTLING_QUOTA_EXCEEDED for code in errors.values()):
        # librdkafka sent a strict version: exactly the third topic is over quota
        assert errors == {names[0]: 0, names[1]: 0, names[2]: THROTTLING_QUOTA_EXCEEDED}
        wait_until(lambda: _existing(cluster, names) == set(names[:2]), 30, what="only the admitted topics")
    else:
        # an older CreateTopics: everything admitted, and the client is throttled by muting
        assert set(errors.values()) == {0}, errors
        t0 = time.monotonic()
        admin.list_topics(timeout=30)
        assert time.monotonic() - t0 >= 1.5 or "CreateTopics" in log


def test_kafka_python_admin_sees_error_89_on_the_right_topic(cluster, fresh_proxy):
    proxy = fresh_proxy(**QUOTA)
    names = _names("kpy")
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
    try:
        resp = admin.create_topics(
            {n: {"num_partitions": 15, "replication_factor": 1} for n in names}, raise_errors=False
        )
    finally:
        admin.close()
    codes = {
        t[0] if isinstance(t, tuple) else t["name"]: t[1] if isinstance(t, tuple) else t["error_code"]
        for t in resp["topics"]
    }
    assert codes == {names[0]: 0, names[1]: 0, names[2]: THROTTLING_QUOTA_EXCEEDED}
    wait_until(lambda: _existing(cluster, names) == set(names[:2]), 30, what="only the admitted topics")
