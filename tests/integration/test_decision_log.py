"""The decision log, written by a proxy in front of the real cluster, read back as Spark reads it (Parquet
files renamed into place), with totals that match the proxy's own metrics."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import pyarrow.dataset as ds

from tests.harness import free_port
from tests.integration.test_mutation_quota import _create
from tests.support import KafkaWire, wait_until


def _metric_sum(port: int, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for m in re.finditer(rf"^{name}{{([^}}]*)}} (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _events(logdir) -> list[dict]:
    files = [p for p in logdir.rglob("*.parquet") if not p.name.startswith(".")]
    if not files:
        return []
    return ds.dataset([str(p) for p in files], format="parquet").to_table().to_pylist()


def test_decisions_and_summaries_are_logged_and_match_metrics(fresh_proxy, tmp_path):
    port = free_port()
    logdir = tmp_path / "decisions"
    proxy = fresh_proxy(
        **{
            "metrics.port": port,
            "decision_log.directory": str(logdir),
            "decision_log.rotate_seconds": 1,
            "decision_log.summary_seconds": 1,
            "quotas.controller_window_num": 2,
            # KafkaWire's client id; B = 20 partitions
            "quotas.entities": [{"entity": {"client-id": "kafka-wire"}, "quotas": {"controller_mutation_rate": 10}}],
        }
    )
    wire = KafkaWire(proxy.bootstrap)
    names = [f"dl-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    resp = _create(wire, 7, [(n, 15) for n in names])
    assert [t.error_code for t in resp.topics] == [0, 0, 89]

    def logged():
        evs = _events(logdir)
        return evs if any(e["event"] == "summary" for e in evs) and any(e["api_key"] == 19 for e in evs) else None

    events = wait_until(logged, 30, what="decision and summary events in renamed files")
    wire.close()
    create = next(e for e in events if e["event"] == "request" and e["api_key"] == 19)
    assert create["action"] == "reject" and create["rejected_topics"] == 1
    assert create["mutations"] == 30 and create["mutation_limit"] == 10 and create["client_id"] == "kafka-wire"
    assert create["user"] == "ANONYMOUS" and create["shadow"] is False and create["throttle_ms"] > 0
    logged_mutations = sum(e["mutations"] for e in events if e["event"] == "request")
    assert logged_mutations == _metric_sum(port, "ktp_controllermutation_recorded_total", client_id="kafka-wire")
    summaries = [e for e in events if e["event"] == "summary"]
    assert summaries and all(e["api_key"] == -1 for e in summaries)
    # summaries hold only what met no decision: every request counted once over all events (here, only the
    # CreateTopics, which has its own event)
    assert sum(e["requests"] for e in events) == 1, [(e["event"], e["requests"], e["bytes_in"]) for e in events]


def _topic_events(bootstrap: str, topic: str) -> list[dict]:
    """Every event the decision log's topic holds, read from the cluster itself as the Spark job would."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dl-read-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        events: list[dict] = []
        idle = 0
        while idle < 3:
            msgs = consumer.consume(500, timeout=1.0)
            idle = 0 if msgs else idle + 1
            events += [json.loads(v) for m in msgs if m.error() is None and (v := m.value()) is not None]
        return events
    finally:
        consumer.close()


def test_the_first_decision_after_the_topic_opens_reaches_the_topic(cluster, fresh_proxy):
    """The topic sink opened its producer and sent at once: before the producer knew the new topic's partitions,
    every send of the first batch raised, and that batch, the proxy's first decisions, was lost whole."""
    topic = f"ktp-decisions-first-{uuid.uuid4().hex[:6]}"
    proxy = fresh_proxy(
        **{
            "decision_log.topic": topic,
            "decision_log.summary_seconds": 1,
            "quotas.controller_window_num": 2,
            "quotas.entities": [{"entity": {"client-id": "kafka-wire"}, "quotas": {"controller_mutation_rate": 10}}],
        }
    )
    wire = KafkaWire(proxy.bootstrap)
    resp = _create(wire, 7, [(f"dl-first-{uuid.uuid4().hex[:6]}-{i}", 15) for i in range(3)])
    wire.close()
    assert [t.error_code for t in resp.topics] == [0, 0, 89]
    wait_until(lambda: "also writing to topic" in proxy.log(), 60, what="the decision log to open its topic")

    def create_logged() -> list[dict] | None:
        events = _topic_events(cluster.bootstrap, topic)
        return events if any(e.get("api_key") == 19 for e in events) else None

    events = wait_until(create_logged, 60, what="the CreateTopics decision on the decision log's topic")
    create = next(e for e in events if e.get("api_key") == 19)
    assert create["action"] == "reject" and create["client_id"] == "kafka-wire"
    assert f"decision log: topic {topic} took" not in proxy.log(), proxy.log()[-2000:]
