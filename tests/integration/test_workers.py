"""``workers: 3``: three proxy processes sharing every listener port (SO_REUSEPORT), against the real cluster.

Issue 16, item 1: each worker accepts its share of connections; clients see one proxy (nothing lost,
nothing duplicated, no connection to a broker port); a quota altered through one worker is in force in the
others (through ``quotas.state_file``); a killed worker is restarted; SIGTERM stops them all.
"""

from __future__ import annotations

import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import psutil
from kafka import KafkaConsumer, KafkaProducer

from tests.integration.conftest import broker_ports
from tests.support import ProxyProcess, wait_until

WORKERS = 3


def _free_block(size: int) -> int:
    """A first port with ``size`` consecutive free ports (bootstrap, brokers, metrics)."""
    for _ in range(200):
        first = random.randrange(20000, 60000)
        try:
            socks = [socket.create_server(("127.0.0.1", first + i)) for i in range(size)]
        except OSError:
            continue
        for s in socks:
            s.close()
        return first
    raise RuntimeError(f"no {size} consecutive free ports")


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def _value(text: str, name: str) -> float:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _workers(proxy: ProxyProcess) -> list[psutil.Process]:
    return psutil.Process(proxy.process.pid).children()


def test_three_workers_share_the_ports_the_quotas_and_survive_a_crash(cluster, tmp_path):
    own_ports = broker_ports(cluster)
    first = _free_block(20)
    bootstrap_port, metrics_port = first, first + 16
    proxy = ProxyProcess(
        tmp_path,
        cluster.bootstrap,
        extra={
            "workers": WORKERS,
            "listen.bootstrap_port": bootstrap_port,
            "listen.broker_ports": f"{first + 1}-{first + 15}",
            "metrics.port": metrics_port,
            "quotas.admins": ["ANONYMOUS"],
            "quotas.state_file": str(tmp_path / "quota-state.json"),
            "quotas.entities": [{"entity": {"client-id": "<default>"}, "quotas": {"producer_byte_rate": 1e9}}],
        },
    ).start(timeout=60)
    try:
        assert proxy.bootstrap == f"127.0.0.1:{bootstrap_port}"
        wait_until(
            lambda: all(_scrape(metrics_port + i) for i in range(WORKERS)), 30, what="every worker's metrics endpoint"
        )
        assert len(_workers(proxy)) == WORKERS

        # many clients, each its own connections: every worker gets a share, every record arrives once
        topic = f"workers-{uuid.uuid4().hex[:6]}"
        sent = []
        for p in range(12):
            producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", client_id=f"w-{p}")
            for i in range(50):
                value = f"{p}-{i}".encode()
                producer.send(topic, value, key=str(p).encode())
                sent.append(value)
            producer.flush(30)
            producer.close(5)
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=proxy.bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=10_000,
            group_id=f"g-{uuid.uuid4().hex[:6]}",
        )
        got = [m.value for m in consumer]
        seen = {(b.host, b.port) for b in consumer._client.cluster.brokers()}
        consumer.close()
        # every worker advertises the same broker ports: first + node id, never a broker's own
        assert seen and all(h == "127.0.0.1" and first < p <= first + 15 and p not in own_ports for h, p in seen)
        assert sorted(got) == sorted(sent)
        by_key: dict[str, list[int]] = {}
        for v in got:
            p, i = v.decode().split("-")
            by_key.setdefault(p, []).append(int(i))
        assert all(seq == sorted(seq) for seq in by_key.values())  # per key (one partition) in order
        accepted = [_value(_scrape(metrics_port + i) or "", "ktp_connections_accepted_total") for i in range(WORKERS)]
        assert all(a > 0 for a in accepted), f"connections per worker: {accepted}"

        # a quota altered through whichever worker answers is taken in by the other two
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy.cli",
                "quotas",
                "--bootstrap-server",
                proxy.bootstrap,
                "alter",
                "--user",
                "alice",
                "--add-config",
                "producer_byte_rate=1048576",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        t0 = time.monotonic()
        wait_until(
            lambda: proxy.log().count("altered through another worker") >= WORKERS - 1,
            10,
            what="the other workers taking in the altered quota",
        )
        assert time.monotonic() - t0 < 2.0 + 1.0  # upkeep runs every second

        # a crashed worker is restarted and serves again
        victim = _workers(proxy)[1]
        victim.send_signal(signal.SIGKILL)
        wait_until(lambda: "restarting it" in proxy.log(), 10, what="the supervisor noticing the crash")
        wait_until(
            lambda: len(_workers(proxy)) == WORKERS and all(_scrape(metrics_port + i) for i in range(WORKERS)),
            30,
            what="the restarted worker serving again",
        )
        assert victim.pid not in {w.pid for w in _workers(proxy)}
        children = _workers(proxy)
    finally:
        code = proxy.terminate(timeout=60)
    assert code == 0, proxy.log()[-3000:]
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)


def test_workers_need_fixed_ports(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("upstream: {bootstrap_servers: ['127.0.0.1:9']}\nworkers: 2\nlisten: {bootstrap_port: 0}\n")
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "-c", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "workers: 2 needs a fixed listen.bootstrap_port" in done.stderr


def test_workers_with_admins_need_a_state_file(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("upstream: {bootstrap_servers: ['127.0.0.1:9']}\nworkers: 2\nquotas: {admins: [ANONYMOUS]}\n")
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "-c", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "needs quotas.state_file" in done.stderr
