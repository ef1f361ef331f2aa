"""Clients that attack the proxy's memory and time: it must hold, and keep serving everybody else.

Each test runs one attack against a proxy of its own in front of the real cluster, while a normal client keeps
working, and checks the proxy's memory (RSS of the real process) and log. Bounds are generous against machine
noise but far below what each attack cost before the memory model (per-connection 512 KiB receive buffers,
frames allocated at their announced size, no timeouts).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import struct
import threading
import time
import uuid

import psutil
import pytest
from confluent_kafka import KafkaError, Message, Producer
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslHandshakeRequest

from tests.harness.measure import percentile
from tests.support import KafkaWire, wait_until

pytestmark = pytest.mark.cluster

MiB = 1 << 20


@pytest.fixture(autouse=True, scope="module")
def _many_fds():
    """The attacks open thousands of sockets from this process; the proxy (a child) inherits the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _rss(proxy) -> int:
    return psutil.Process(proxy.proc.pid).memory_info().rss


def _upstream_connections(proxy, cluster) -> int:
    ports = {b.port for b in cluster.brokers} | {b.sasl_port for b in cluster.brokers}
    return sum(1 for c in psutil.Process(proxy.proc.pid).net_connections("tcp") if c.raddr and c.raddr.port in ports)


class _NormalProducer:
    """A well-behaved client producing one record at a time, measuring each round trip."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "enable.idempotence": True}
        )
        self.topic = topic
        self.latencies: list[float] = []
        self.errors: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def once(self) -> float:
        t0 = time.monotonic()
        self.producer.produce(self.topic, b"normal", on_delivery=self._delivered)
        assert self.producer.flush(30) == 0
        return time.monotonic() - t0

    def _delivered(self, err: KafkaError | None, _m: Message) -> None:
        if err:
            self.errors.append(err)

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.latencies.append(self.once())
            self._stop.wait(0.05)

    def __enter__(self) -> _NormalProducer:
        self.once()  # topic created, connections up
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)

    def p99(self) -> float:
        return percentile(self.latencies, 99, empty=0.0)


def test_idle_connections_cost_little_and_reach_no_broker(cluster, fresh_proxy):
    n = 3000
    proxy = fresh_proxy()
    topic = f"idle-{uuid.uuid4().hex[:6]}"
    with _NormalProducer(proxy.bootstrap, topic) as normal:
        time.sleep(0.5)
        rss0, up0 = _rss(proxy), _upstream_connections(proxy, cluster)
        socks = []
        try:
            for _ in range(n):
                socks.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
            wait_until(
                lambda: len(psutil.Process(proxy.proc.pid).net_connections("tcp")) >= n,
                30,
                what="the proxy to accept every connection",
            )
            grown = _rss(proxy) - rss0
            # Before: a 512 KiB receive buffer per connection (1.5 GB here) and one broker connection each.
            assert grown < n * 40 * 1024, f"{n} idle connections took {grown / MiB:.0f} MiB"
            assert _upstream_connections(proxy, cluster) <= up0 + 3
            normal.once()
        finally:
            for s in socks:
                s.close()
    assert not normal.errors


def test_slow_partial_frames_time_out_and_hold_no_memory(cluster, fresh_proxy):
    proxy = fresh_proxy(request_read_timeout_ms=3000)
    topic = f"dribble-{uuid.uuid4().hex[:6]}"
    with _NormalProducer(proxy.bootstrap, topic) as normal:
        rss0 = _rss(proxy)
        socks = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(400)]
        t0 = time.monotonic()
        for s in socks:
            s.sendall(struct.pack(">i", MiB))  # announce 1 MiB, then a byte a second
        for _ in range(2):
            for s in socks:
                s.sendall(b"\x00")
            time.sleep(1)
        grown = _rss(proxy) - rss0
        assert grown < 60 * MiB, f"400 dribbling connections took {grown / MiB:.0f} MiB (before: 1 MiB each)"

        def closed(s: socket.socket) -> bool:
            s.settimeout(15)
            try:
                while True:
                    if s.recv(1) == b"":
                        return True
            except OSError:
                return True

        assert all(closed(s) for s in socks)
        assert time.monotonic() - t0 >= 3.0  # not before the timeout
        for s in socks:
            s.close()
    assert not normal.errors
    lines = [ln for ln in proxy.log().splitlines() if "request timeout" in ln]
    assert len(lines) == 400 and all("WARNING" in ln for ln in lines)
    assert "Traceback" not in proxy.log()


def test_huge_announced_frames_wait_for_the_pool_and_others_keep_working(cluster, fresh_proxy):
    budget = 64 * MiB
    proxy = fresh_proxy(queued_max_request_bytes=budget, request_read_timeout_ms=8000)
    topic = f"huge-{uuid.uuid4().hex[:6]}"
    with _NormalProducer(proxy.bootstrap, topic) as normal:
        rss0 = _rss(proxy)
        socks = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(40)]
        chunk = b"\x00" * MiB
        stop = time.monotonic() + 6
        peak = 0

        def attack(s: socket.socket) -> None:
            s.settimeout(0.2)
            try:
                s.sendall(struct.pack(">i", 90 * MiB))
                sent = 0
                while time.monotonic() < stop and sent < 30 * MiB:
                    try:
                        sent += s.send(chunk)
                    except TimeoutError:
                        continue  # not read: the pool is spent, the proxy applies back-pressure
            except OSError:
                pass

        threads = [threading.Thread(target=attack, args=(s,), daemon=True) for s in socks]
        for t in threads:
            t.start()
        while time.monotonic() < stop:
            peak = max(peak, _rss(proxy))
            time.sleep(0.1)
        for t in threads:
            t.join(30)
        # Before: every connection took 90 MiB at its size prefix (3.6 GB here).
        assert peak - rss0 < budget + 120 * MiB, f"peak {(peak - rss0) / MiB:.0f} MiB over the start"
        for s in socks:
            s.close()
    assert not normal.errors
    assert normal.p99() < 1.0, f"normal produce p99 {normal.p99():.3f} s during the attack"
    assert "Traceback" not in proxy.log()


def test_request_pipelined_behind_a_v0_handshake_is_still_rewritten(cluster, fresh_proxy):
    """SaslHandshake v0 then Metadata, in one write, to a PLAINTEXT upstream: the broker refuses the handshake,
    so the Metadata is a request, not a raw token, and its broker addresses must be the proxy's."""
    proxy = fresh_proxy()
    wire = KafkaWire(proxy.bootstrap)
    hs = SaslHandshakeRequest(mechanism="PLAIN")
    hs.API_VERSION = 0
    hs.with_header(correlation_id=1, client_id="v0")
    md = MetadataRequest(topics=[])
    md.API_VERSION = 1
    md.with_header(correlation_id=2, client_id="v0")
    wire.send_raw(hs.encode(header=True, framed=True) + md.encode(header=True, framed=True))
    wire._pending[1] = hs.header.get_response_class()
    wire._pending[2] = md.header.get_response_class()
    _, handshake = wire.recv()
    assert handshake.error_code != 0  # PLAINTEXT listener: no SASL
    _, metadata = wire.recv()
    broker_ports = {b.port for b in cluster.brokers} | {b.sasl_port for b in cluster.brokers}
    assert metadata.brokers and not {b.port for b in metadata.brokers} & broker_ports
    wire.close()


def test_hung_broker_closes_its_pairs_with_one_line(cluster, fresh_proxy):
    proxy = fresh_proxy(upstream_timeout_margin_ms=3000)
    wire = KafkaWire(proxy.bootstrap)
    wire.send(MetadataRequest(topics=[]), 4)
    _, md = wire.recv()
    node = max(b.node_id for b in md.brokers)
    listener = next(f"{b.host}:{b.port}" for b in md.brokers if b.node_id == node)
    wire.close()
    victim = KafkaWire(listener)
    victim.send(ApiVersionsRequest(), 0)
    victim.recv()  # the broker connection is up
    broker = next(b for b in cluster.brokers if b.node_id == node)
    os.kill(broker.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        victim.send(ApiVersionsRequest(), 0)
        assert victim.closed_by_peer(timeout=20), "the proxy must give up on a hung broker"
        waited = time.monotonic() - t0
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    assert waited >= 3.0
    lines = [ln for ln in proxy.log().splitlines() if "broker timeout" in ln]
    assert len(lines) == 1 and "did not answer ApiVersions" in lines[0] and "WARNING" in lines[0], lines


def test_idle_connections_close_after_connections_max_idle_ms(cluster, fresh_proxy):
    proxy = fresh_proxy(connections_max_idle_ms=2000)
    quiet, busy = KafkaWire(proxy.bootstrap), KafkaWire(proxy.bootstrap)
    for wire in (quiet, busy):
        wire.send(ApiVersionsRequest(), 0)
        wire.recv()
    t0 = time.monotonic()
    deadline = t0 + 6
    while time.monotonic() < deadline:  # busy keeps talking, quiet says nothing
        busy.send(ApiVersionsRequest(), 0)
        busy.recv()
        time.sleep(0.5)
    assert quiet.closed_by_peer(timeout=1)
    busy.send(MetadataRequest(topics=[]), 4)
    assert len(busy.recv()[1].brokers) == 3
    assert "Traceback" not in proxy.log()


ALL_QUOTAS_NONE_BINDING = {
    "quotas.entities": [
        {
            "entity": {"user": "<default>"},
            "quotas": {
                "producer_byte_rate": 10 * 1024 * MiB,
                "consumer_byte_rate": 10 * 1024 * MiB,
                "request_percentage": 10_000,
                "controller_mutation_rate": 100_000,
                "producer_ids_rate": 1_000_000,
            },
        }
    ]
}


def test_fuzzed_frames_with_every_quota_on_close_quietly_and_lose_nothing(cluster, fresh_proxy):
    """Requests of every API and version cut at every offset (tests/harness/fuzz_frames.py: the unit fuzz's cases,
    SASL steps included), one case a connection so that the proxy reads each, through the whole proxy with every
    quota kind configured, while an idempotent producer works: one WARNING per bad connection, no traceback, no
    record lost or reordered, memory back where it was. (Issue #35: a JoinGroup cut in its group id was a
    traceback.)"""
    import random

    from tests.harness.fuzz_frames import truncations, valid_cases

    proxy = fresh_proxy(**ALL_QUOTAS_NONE_BINDING)
    topic = f"fuzz-{uuid.uuid4().hex[:6]}"
    cases = [b"".join(t.frames) for case in valid_cases(large=False, warm=False) for t in truncations(case)]
    random.Random(11).shuffle(cases)
    with _NormalProducer(proxy.bootstrap, topic) as normal:
        rss0 = _rss(proxy)
        frames = 0
        deadline = time.monotonic() + 40
        for case in cases:
            if frames >= 5000 or time.monotonic() > deadline:
                break
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            try:
                s.sendall(case)
                frames += 1
                s.settimeout(0.05)
                with contextlib.suppress(OSError):
                    s.recv(65536)
            except OSError:
                pass
            finally:
                s.close()
        assert frames >= 1000, f"only {frames} fuzzed cases sent in 40 s"
        time.sleep(1)
        grown = _rss(proxy) - rss0
    assert not normal.errors
    log = proxy.log()
    for bad in ("Traceback", "ERROR", "Task was destroyed", "never awaited"):
        assert bad not in log, [ln for ln in log.splitlines() if bad in ln][:3]
    assert grown < 50 * MiB, f"{frames} fuzzed frames left {grown / MiB:.0f} MiB behind"
    c = _consume_all(proxy.bootstrap, topic, normal)
    assert c == [b"normal"] * len(c) and len(c) == len(normal.latencies) + 1


def _consume_all(bootstrap: str, topic: str, normal: _NormalProducer) -> list[bytes | None]:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fuzz-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got: list[bytes | None] = []
    want = len(normal.latencies) + 1
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    return got


def test_connection_limits_refuse_with_a_line_and_a_metric_and_serve_the_others(cluster, fresh_proxy):
    import urllib.request

    from tests.harness import free_port

    port = free_port()
    proxy = fresh_proxy(**{"metrics.port": port, "limits.max_connections_per_ip": 30})
    topic = f"limits-{uuid.uuid4().hex[:6]}"
    with _NormalProducer(proxy.bootstrap, topic) as normal:  # holds a few connections of 127.0.0.1 already
        socks = []
        try:
            for _ in range(60):
                socks.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
            closed = 0
            time.sleep(1)
            for s in socks:
                s.settimeout(0.3)
                try:
                    closed += s.recv(1) == b""
                except TimeoutError:
                    pass
                except OSError:
                    closed += 1
            assert 25 <= closed <= 60 - 20, closed  # the ones past 30 from this ip were refused
            normal.once()  # the connections already open keep being served
        finally:
            for s in socks:
                s.close()
    assert not normal.errors
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'ktp_connections_refused_total{reason="max_connections_per_ip"}' in text
    lines = [ln for ln in proxy.log().splitlines() if "refused a connection" in ln]
    assert 1 <= len(lines) <= 2 and "max_connections_per_ip" in lines[0]  # rate-limited: not one per refusal


def test_ip_connection_creation_rate_closes_a_burst_after_the_throttle(cluster, fresh_proxy):
    # 5/s over Kafka's 11 samples of 1 s: a burst of about 50 passes, the rest of 80 are over the rate
    proxy = fresh_proxy(**{"limits.ip_connection_creation_rate": {"<default>": 5}})
    t0 = time.monotonic()
    socks = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(80)]
    for s in socks:
        s.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")  # ApiVersions v0
    served = refused = 0
    for s in socks:
        s.settimeout(30)
        try:
            data = s.recv(4)
        except OSError:
            data = b""
        served += bool(data)
        refused += not data
        s.close()
    assert 30 <= served <= 65 and refused >= 15, (served, refused)
    assert time.monotonic() - t0 >= 0.5  # refused ones were held for their throttle, not closed at once
