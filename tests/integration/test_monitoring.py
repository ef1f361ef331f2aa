"""The shipped Grafana dashboard and Prometheus alert rules query only metrics a live proxy exports.

A proxy with every quota kind configured serves real traffic (an idempotent producer, a consumer, topic
creations), its decision log on; then one /metrics scrape must hold every metric name any dashboard panel or
alert rule uses. A renamed metric, or a panel written against a name that never existed, fails here.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import free_port

MONITORING = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
_NAME = re.compile(r"\b(ktp_[a-z0-9_]+)")


def _queried_names() -> dict[str, set[str]]:
    """Metric names each file queries (PromQL expressions of the dashboard's targets and of the rules)."""
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    rules = yaml.safe_load((MONITORING / "prometheus-alerts.yaml").read_text())
    exprs = {
        "dashboard": [t["expr"] for p in dash["panels"] for t in p["targets"]],
        "alerts": [r["expr"] for g in rules["groups"] for r in g["rules"]],
    }
    return {where: {m for e in es for m in _NAME.findall(e)} for where, es in exprs.items()}


def _exported(text: str) -> set[str]:
    """Metric names in an exposition: every sample's (a summary's _sum/_count, a counter's _total), and every
    declared family (an error counter with no error yet has a TYPE line and no sample: no data, not a typo)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split(" ")[2])
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split(" ")[0])
    return names


def test_every_metric_the_dashboard_and_alerts_query_is_exported(cluster, fresh_proxy, tmp_path):
    queried = _queried_names()
    assert len(queried["dashboard"]) >= 20 and len(queried["alerts"]) >= 4  # the check reads them at all
    metrics_port = free_port()
    every = {
        "producer_byte_rate": 10**9,
        "consumer_byte_rate": 10**9,
        "request_percentage": 10**4,
        "controller_mutation_rate": 1000,
    }
    proxy = fresh_proxy(
        **{
            "metrics.port": metrics_port,
            "decision_log.directory": str(tmp_path / "decisions"),
            "quotas.entities": [
                {"entity": {"user": "<default>"}, "quotas": {**every, "producer_ids_rate": 10**6}},
            ],
        }
    )
    topic = f"mon-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True})
    for i in range(200):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(60) == 0
    consumer = Consumer(
        {"bootstrap.servers": proxy.bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got, deadline = 0, time.monotonic() + 60
    while got < 200 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.close()
    assert got == 200
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    exported = _exported(text)
    for where, names in queried.items():
        missing = sorted(names - exported)
        assert missing == [], f"{where} queries metrics the proxy does not export: {missing}"
