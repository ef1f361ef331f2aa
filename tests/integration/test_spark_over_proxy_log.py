"""The whole loop: a proxy in front of the real cluster enforces quotas and writes its decision log; the PySpark
job over that log names the throttled entity with totals that match the proxy's own metrics, and replaying the
config that was live reproduces the proxy's throttle decisions."""

from __future__ import annotations

import re
import urllib.request
import uuid

import pytest
import yaml
from confluent_kafka import Producer

from tests.harness import free_port
from tests.support import wait_until

QUOTAS = {
    "window_num": 11,
    "window_size_seconds": 0.2,
    "entities": [
        {"entity": {"client-id": "noisy"}, "quotas": {"producer_byte_rate": 300_000}},
        {"entity": {"client-id": "calm"}, "quotas": {"producer_byte_rate": 50_000_000}},
    ],
}


def _metric(port: int, name: str, client_id: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1)) for m in re.finditer(rf'^{name}{{[^}}]*client_id="{client_id}"[^}}]*}} (\S+)$', text, re.M)
    )


def _produce(bootstrap: str, topic: str, client_id: str, n: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=(f"{i:08d}".encode() * (size // 8 + 1))[:size])
        p.poll(0)
    assert p.flush(120) == 0


@pytest.fixture(scope="module")
def spark():
    from spark_analysis.job import build_spark

    s = build_spark("local[2]", "1g", shuffle_partitions=4)
    yield s
    s.stop()


def test_spark_job_over_the_proxys_own_log(cluster, fresh_proxy, tmp_path, spark):
    from spark_analysis.job import JobOptions, run
    from spark_analysis.quota_config import load_quota_config

    port = free_port()
    logdir = tmp_path / "decisions"
    proxy = fresh_proxy(
        **{
            "metrics.port": port,
            "decision_log.directory": str(logdir),
            "decision_log.rotate_seconds": 1,
            **{f"quotas.{k}": v for k, v in QUOTAS.items()},
        }
    )
    topic = f"spark-{uuid.uuid4().hex[:6]}"
    _produce(proxy.bootstrap, topic, "calm", 200, 1000)
    _produce(proxy.bootstrap, topic, "noisy", 3000, 1000)  # 3 MB against 300 kB/s: throttled for seconds
    noisy_throttle = _metric(port, "ktp_produce_throttle_time_total", "noisy")
    assert noisy_throttle > 0
    assert _metric(port, "ktp_produce_throttle_time_total", "calm") == 0
    proxy.terminate()  # closes the log: every event is in a renamed file

    quotas_file = tmp_path / "live.yaml"
    quotas_file.write_text(yaml.safe_dump({"quotas": QUOTAS}))
    files = wait_until(
        lambda: [p for p in logdir.rglob("*.parquet") if not p.name.startswith(".")], 10, what="decision-log files"
    )
    assert files
    result = run(
        spark,
        JobOptions(
            input=str(logdir),
            out=str(tmp_path / "out"),
            quotas=load_quota_config(quotas_file),
            quotas_path=str(quotas_file),
        ),
    )
    top = result.throttle_totals_top
    first = top.iloc[0]
    assert first["client_id"] == "noisy" and first["throttle_ms"] > 0
    calm = top[top["client_id"] == "calm"]
    assert calm.empty or int(calm.iloc[0]["throttle_ms"]) == 0
    # the same totals as the proxy's own counters (scraped before it stopped; no traffic came after)
    assert int(first["throttle_ms"]) == int(first["produce_throttle_ms"]) == noisy_throttle
    assert int(first["decisions"]) > 0 and int(first["throttled"]) > 0
    agreement = result.replay_agreement.set_index("kind")
    assert agreement.loc["produce", "logged"] > 0
    assert agreement.loc["produce", "identical"] == agreement.loc["produce", "logged"], agreement
    assert agreement.loc["produce", "throttle_decision_differs"] == 0
    assert result.report_path is not None
