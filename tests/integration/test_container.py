"""The container image (Containerfile), built by scripts/container-image and run with podman in front of the real
cluster: a client produces and consumes through it, a quota bites (the default enforcement paces it), the probes
answer, SIGTERM drains.

The configuration and the fleet's secret are mounted read-only, as in examples/kubernetes, and the process runs
as the image's non-root user. The image's base is Debian stable built here from Debian's archive (no image
registry is reachable from this machine); ``--base`` takes the official Python image where one is.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.harness import free_port
from tests.support import REPO, http_get, wait_until

pytestmark = pytest.mark.cluster

RECORDS = 300


@pytest.fixture(scope="module")
def image() -> str:
    built = subprocess.run(
        [str(REPO / "scripts" / "container-image")], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return built.stdout.strip().splitlines()[-1]


def _podman(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    conf = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kafka-throttle-proxy" / "containers.conf"
    return subprocess.run(
        ["podman", "--runtime", "runc", *args],
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
        capture_output=True,
        text=True,
        **kw,
    )


def test_the_image_serves_a_client_enforces_a_quota_and_drains(cluster, image, tmp_path):
    from confluent_kafka import Consumer, Producer

    bootstrap_port, metrics_port = free_port(), free_port()
    etc = tmp_path / "etc"
    (etc / "fleet").mkdir(parents=True)
    (etc / "fleet" / "secret").write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    config = {
        "upstream": {"bootstrap_servers": cluster.bootstrap.split(",")},
        "listen": {"host": "127.0.0.1", "bootstrap_port": bootstrap_port, "broker_ports": "ephemeral"},
        "metrics": {"port": metrics_port},
        "shutdown_unready_ms": 1000,
        "quotas": {
            "scope": "fleet",
            "entities": [{"entity": {"client-id": "boxed"}, "quotas": {"producer_byte_rate": 100_000}}],
        },
        "fleet": {"name": f"c{uuid.uuid4().hex[:8]}", "secret_file": "/etc/kafka-throttle-proxy/fleet/secret"},
    }
    (etc / "proxy.yaml").write_text(yaml.safe_dump(config))
    for path in (etc, etc / "fleet"):
        path.chmod(0o755)
    for path in (etc / "proxy.yaml", etc / "fleet" / "secret"):
        path.chmod(0o444)  # the image's user (uid 10001) reads what root mounted, and writes nothing there
    name = f"ktp-test-{uuid.uuid4().hex[:8]}"
    run = _podman("run", "-d", "--name", name, "--network", "host", "-v", f"{etc}:/etc/kafka-throttle-proxy:ro", image)
    assert run.returncode == 0, run.stderr
    try:
        wait_until(lambda: http_get(metrics_port, "/readyz")[0] == 200, 60, what="the container's proxy to be ready")
        assert http_get(metrics_port, "/healthz")[0] == 200
        who = _podman("exec", name, "id", "-u")
        assert who.stdout.strip() == "10001"

        bootstrap = f"127.0.0.1:{bootstrap_port}"
        topic = f"container-{uuid.uuid4().hex[:8]}"
        p = Producer({"bootstrap.servers": bootstrap, "client.id": "boxed"})
        started = time.monotonic()
        for i in range(RECORDS):  # 300 kB at once against 100 kB/s: the default enforcement paces it
            p.produce(topic, i.to_bytes(4, "big") + b"x" * 996)
            p.poll(0)
        assert p.flush(60) == 0
        took = time.monotonic() - started
        assert took >= 0.7 * RECORDS * 1000 / 100_000, f"{RECORDS} kB in {took:.1f} s: the quota did not bite"

        c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < RECORDS and time.monotonic() < deadline:
            m = c.poll(1)
            if m is not None and m.error() is None and (value := m.value()) is not None:
                got.append(int.from_bytes(value[:4], "big"))
        c.close()
        assert got == list(range(RECORDS))  # every record, in order, once

        stop = _podman("stop", "--time", "30", name)
        assert stop.returncode == 0, stop.stderr
        inspect = _podman("inspect", name, "--format", "{{.State.ExitCode}}")
        assert inspect.stdout.strip() == "0"
        logs = _podman("logs", name)
        assert "unready now" in logs.stderr and "shut down" in logs.stderr, logs.stderr[-2000:]
        assert "Traceback" not in logs.stderr
    finally:
        _podman("rm", "-f", name)
