"""Bad input closes one connection with one log line; shutdown drains; the proxy never falls over."""

from __future__ import annotations

import re
import struct
import time
import uuid

import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import MetadataRequest

from tests.harness.request_bodies import fetch_request
from tests.support import KafkaWire, wait_until

pytestmark = pytest.mark.cluster


def _produce_ok(bootstrap: str, topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 20000})
    errors: list = []
    p.produce(topic, b"still-fine", on_delivery=lambda err, _m: errors.append(err))
    assert p.flush(30) == 0
    assert errors == [None]


@pytest.mark.parametrize(
    "payload, reason",
    [
        (struct.pack(">i", 2) + b"\x00\x03", "shorter than a request header"),
        (struct.pack(">i", 200 * 1024 * 1024), "exceeds the maximum"),
        (struct.pack(">i", -7), "negative frame size"),
        (struct.pack(">i", 12) + struct.pack(">hhih", 3, 4, 1, 40) + b"ab", "client_id runs past"),
        (struct.pack(">i", 11) + struct.pack(">hhih", 3, 99, 1, -1) + b"\x00", "beyond what the proxy decodes"),
        (struct.pack(">i", 11) + struct.pack(">hhih", 0, 9, 1, -1) + b"\x00", "malformed request (Produce v9)"),
    ],
    ids=["short-header", "oversized", "negative-size", "bad-client-id", "undecodable-version", "truncated-produce"],
)
def test_bad_frame_closes_only_that_connection(proxy, payload, reason):
    bystander = KafkaWire(proxy.bootstrap)
    bad = KafkaWire(proxy.bootstrap)
    bad.send_raw(payload)
    assert bad.closed_by_peer(), "the proxy must close a connection that sent a bad frame"
    # The proxy and its other connections carry on.
    bystander.send(MetadataRequest(topics=[]), 4)
    _corr, md = bystander.recv()
    assert len(md.brokers) == 3
    _produce_ok(proxy.bootstrap, "faults")
    lines = wait_until(lambda: [ln for ln in proxy.log().splitlines() if reason in ln], 5, what=reason)
    assert len(lines) == 1, lines
    assert re.search(r"127\.0\.0\.1:\d+ via bootstrap", lines[0]), "the log line names the peer"
    assert proxy.alive()


def test_sigterm_finishes_in_flight_requests_then_exits(cluster, fresh_proxy):
    p = fresh_proxy()
    topic = f"drain-{uuid.uuid4().hex[:6]}"
    _produce_ok(p.bootstrap, topic)  # creates the topic (auto-create) and learns its leader
    wire = KafkaWire(p.bootstrap)
    wire.send(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]), 12)
    _, md = wire.recv()
    leader = md.topics[0].partitions[0].leader_id
    broker = next(b for b in md.brokers if b.node_id == leader)
    fetch = KafkaWire(f"{broker.host}:{broker.port}")
    req = fetch_request(topic, fetch_offset=1, max_wait_ms=3000, min_bytes=10_000_000)
    corr = fetch.send(req, 12)
    time.sleep(0.5)  # the broker now holds the fetch (min_bytes not reached) for ~3 s
    started = time.monotonic()
    p.proc.send_signal(15)
    got_corr, resp = fetch.recv()
    waited = time.monotonic() - started
    assert got_corr == corr and resp.responses[0].partitions[0].error_code == 0
    assert waited > 1.5, "the response came from the broker's long poll, delivered after SIGTERM"
    assert fetch.closed_by_peer(), "after the in-flight request, the connection is closed"
    assert p.proc.wait(20) == 0
    with pytest.raises(OSError):
        KafkaWire(p.bootstrap, timeout=2)


def test_broker_listeners_exist_from_startup(cluster, fresh_proxy):
    """A client that cached broker addresses (say, across a proxy restart) reconnects at once: the
    proxy asks the cluster for its brokers at startup instead of waiting for a Metadata response."""
    from kafka.protocol.metadata import ApiVersionsRequest

    from tests.harness import free_port

    first = free_port()
    p = fresh_proxy(**{"listen.broker_ports": f"{first}-{first + 10}"})
    for b in cluster.brokers:
        wire = KafkaWire(f"127.0.0.1:{first + b.node_id}")  # never told about it by the proxy
        wire.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)
        _, resp = wire.recv()
        assert resp.error_code == 0
        wire.close()
    assert p.alive()


def test_ports_in_use_at_start(cluster, fresh_proxy, tmp_path):
    """A busy bootstrap port: one line naming it, exit code 2, no traceback. A busy broker port: the next one."""
    import socket
    import subprocess
    import sys

    from tests.harness import free_port
    from tests.support import REPO

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy.cli",
                "run",
                "--bootstrap-servers",
                cluster.bootstrap,
                "--bootstrap-port",
                str(port),
                "--broker-ports",
                "ephemeral",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, r
        assert f"listen.bootstrap_port {port}" in r.stderr and "Traceback" not in r.stderr, r.stderr
        first = free_port()
        holder.close()
        holder = socket.socket()
        holder.bind(("127.0.0.1", first + 1))  # broker 1's port at first + 1
        holder.listen()
        p = fresh_proxy(**{"listen.broker_ports": f"{first}-{first + 20}"})
        wire = KafkaWire(p.bootstrap)
        wire.send(MetadataRequest(topics=[]), 4)
        ports = {b.node_id: b.port for b in wire.recv()[1].brokers}
        wire.close()
        assert ports[1] != first + 1 and all(first <= q <= first + 20 for q in ports.values()), ports
        assert f"port {first + 1} is not available for broker 1" in p.log()
    finally:
        holder.close()
