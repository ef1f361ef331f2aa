"""``kafka-throttle-proxy calibrate`` against the real cluster: it prints a ``quotas.request_costs`` section the proxy
accepts, and leaves no topic or client quota behind, whether it succeeds, is refused or is interrupted (issue 50).

The probes here are short (a 2-s warm-up, 6 s counted): these tests check what the command does to the cluster and
what it prints, not how accurate the figures are (that takes many quota windows: docs/quotas.md and BENCHMARKS.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from config.model import ProxyConfig

REPO = Path(__file__).resolve().parents[2]


def _cmd(cluster, *args: str) -> list[str]:
    direct = cluster.bootstrap.split(",")[0]
    return [sys.executable, "-m", "proxy.cli", "calibrate", "--bootstrap-server", direct, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _left_behind(cluster) -> list[str]:
    """Probe topics and probe client quotas still on the cluster."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topics = [t for t in admin.list_topics(timeout=20).topics if t.startswith("__ktp_calibrate_")]
    direct = cluster.bootstrap.split(",")[0]
    shown = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "quotas", "describe", "--bootstrap-server", direct],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert shown.returncode == 0, shown.stderr
    quotas = [line for line in shown.stdout.splitlines() if "ktp-calibrate-" in line]
    return topics + quotas


def test_calibrate_prints_costs_the_proxy_accepts_and_leaves_nothing(cluster):
    done = subprocess.run(
        _cmd(cluster, "--percent", "0.5", "--broker-warmup", "1", "--warmup", "2", "--seconds", "6"),
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "probe 10/10" in done.stderr and "removed the probe topics and quotas" in done.stderr, done.stderr
    # Each pipelined probe's request, unthrottled first; the one-at-a-time probes send the same requests.
    assert done.stderr.count("warming the brokers") == 6, done.stderr
    probe_lines = [line for line in done.stdout.splitlines() if line.startswith("#   ")]
    # Produce acks 1, -1; Fetch empty, of records; ListOffsets; Metadata; then four of them one at a time.
    assert len(probe_lines) == 10, done.stdout
    rf = done.stdout.split("(default replication factor ")[1].split(")")[0]  # the cluster's, read back
    assert any(f"Produce acks=-1 RF {rf}:" in line for line in probe_lines), done.stdout
    doc = yaml.safe_load(done.stdout)
    cfg = ProxyConfig.model_validate({"upstream": {"bootstrap_servers": [cluster.bootstrap]}, **doc})
    costs = cfg.quotas.request_costs
    assert costs is not None and costs.source.startswith("calibrate ")
    assert set(costs.apis) == {"Produce", "Fetch", "ListOffsets", "Metadata"}
    assert costs.fetch_head_ms_per_kib is not None  # from the Fetch of records, past the empty one
    for row in costs.apis.values():
        assert 0 < row.base_ms < 10  # a broker's thread time a request: microseconds to milliseconds
        assert row.alone_base_ms is not None and 0 < row.alone_base_ms < 10  # from its one-at-a-time probe
    assert _left_behind(cluster) == []


def test_a_probe_the_brokers_never_hold_is_refused_and_nothing_is_left(cluster):
    """At 100 % of a thread one connection is never throttled: its rate would be the client's, not the quota's.
    One line says so, exit 1, and the topics and quotas are gone."""
    done = subprocess.run(
        _cmd(cluster, "--percent", "100", "--broker-warmup", "0", "--warmup", "0", "--seconds", "1"),
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    refusal = [line for line in done.stderr.splitlines() if "never throttled" in line]
    assert len(refusal) == 1 and "lower --percent" in refusal[0], done.stderr
    assert "Traceback" not in done.stderr
    assert _left_behind(cluster) == []


def test_interrupted_it_still_removes_what_it_made(cluster):
    proc = subprocess.Popen(
        _cmd(cluster, "--percent", "0.5", "--broker-warmup", "0", "--warmup", "30", "--seconds", "30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if "probe 1/10" in line:
            break
    else:
        proc.kill()
        raise AssertionError("".join(seen))
    time.sleep(1.0)  # inside the first probe: topics and quotas exist now
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert out == "" and "interrupted" in err and "Traceback" not in err, err
    assert _left_behind(cluster) == []
