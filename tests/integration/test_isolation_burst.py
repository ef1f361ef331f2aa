"""Issue 37: one connection's burst of large Produce requests must not stall another connection of the same proxy.

The scenario, kept small enough to run in CI on two cores: a flooder connection pipelines bursts of 20 Produce
requests of 1 MB each (acks=1, a single-replica topic), back to back; beside it, on its own connection to the same
broker listener, a victim sends small Produce requests one at a time (acks=1, another single-replica topic on the
same broker) and times each round trip. The same pair runs twice: straight to the broker (what the broker itself
costs the victim while it appends 20 MB: its network and request threads, the disk, the loopback), then through one
proxy. The proxy may add a slice of work per turn of its loop, never a burst's worth.

Why acks=1 and single replicas: the replication wait of acks=all belongs to the brokers (bench/isolation measures
it, with the brokers' own quotas as the reference); here only the proxy's share is under test, and the direct run
of the same burst says what is left of the broker's.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid

import pytest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import QuotaConfig
from tests.harness.measure import percentile
from tests.support import KafkaWire

pytestmark = pytest.mark.cluster

PRODUCE_VERSION = 9
BURST = 20
BIG_RECORD = 64 * 1024
BIG_BATCH_RECORDS = 15  # 15 × 64 KiB = 0.98 MB: under the brokers' message.max.bytes
SECONDS = 10.0
SETTLE = 1.0
SLICE_S = 0.025
"""What one connection's turns may cost the victim beyond the broker's own cost: a turn of the flooder is at most one
read (256,000 bytes, uvloop's) or BYTES_PER_TURN of requests held back (protocol.session), about a millisecond of
the loop's work; a victim round trip may find a few such turns ahead of it on each way (the flooder's client and
broker sides) and pays two more process wake-ups than straight to the broker, each a few milliseconds on a
shared 2-core machine. The bound is twice the direct p99, or the direct p99 plus this, whichever is larger."""


def _batch(n: int, size: int) -> bytes:
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=2 * n * size + 1024)
    value = b"x" * size
    for i in range(n):
        b.append(1_700_000_000_000 + i, None, value, [])
    b.close()
    return bytes(b.buffer())


def _produce_frame(topic: str, records: bytes, corr: int, client_id: str, acks: int = 1) -> bytes:
    T = ProduceRequest.TopicProduceData
    req = ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout_ms=30_000,
        topic_data=[T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])],
    )
    req.API_VERSION = PRODUCE_VERSION
    req.with_header(correlation_id=corr, client_id=client_id)
    return req.encode(header=True, framed=True)


def _read_frame(sock: socket.socket) -> bytes:
    def read(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    (size,) = struct.unpack(">i", read(4))
    return read(size)


def _topic_on(cluster, broker_id: int, replicated: bool = False) -> str:
    """A one-partition topic led by ``broker_id``: on it alone, or (``replicated``) on every broker."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"burst-{uuid.uuid4().hex[:8]}"
    others = [b.node_id for b in cluster.brokers if b.node_id != broker_id] if replicated else []
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[broker_id, *others]])])[topic].result(
        30
    )
    return topic


def _leader_address(bootstrap: str, topic: str, broker_id: int) -> str:
    """The address the cluster (or the proxy, rewriting) gives for ``broker_id``, once it leads ``topic``."""
    wire = KafkaWire(bootstrap.split(",")[0])
    try:
        for _ in range(100):
            wire.send(
                MetadataRequest(
                    topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)],
                    allow_auto_topic_creation=False,
                ),
                12,
            )
            _, md = wire.recv()
            t = md.topics[0]
            if t.error_code == 0 and t.partitions and t.partitions[0].leader_id == broker_id:
                host, port = next((b.host, b.port) for b in md.brokers if b.node_id == broker_id)
                return f"{host}:{port}"
            time.sleep(0.1)
    finally:
        wire.close()
    raise AssertionError(f"{topic} has no leader {broker_id}")


def _run(
    address: str, victim_topic: str, flood_topic: str, flood: bool = True, settle: float = SETTLE, acks: int = 1
) -> tuple[list[float], int]:
    """Flood bursts and victim round trips side by side on two connections to ``address`` for SECONDS (``flood``
    False: the victim alone); the victim's round trips (s) after ``settle`` and the number of bursts sent."""
    host, port = address.rsplit(":", 1)
    big = _batch(BIG_BATCH_RECORDS, BIG_RECORD)
    small = _batch(1, 1024)
    stop = time.monotonic() + SECONDS
    bursts = [0]
    errors: list[BaseException] = []

    def send_bursts() -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=60) as s:
                burst = b"".join(_produce_frame(flood_topic, big, c, "burst-flooder", acks) for c in range(BURST))
                s.settimeout(90)  # a flooder held to its quota waits, unread, for its turn
                while time.monotonic() < stop:
                    s.sendall(burst)  # answered in order, so the same correlation ids serve every burst
                    for _ in range(BURST):
                        _read_frame(s)
                    bursts[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    flooder = threading.Thread(target=send_bursts, daemon=True)
    rtts: list[tuple[float, float]] = []
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for corr in range(1, 21):  # warm the path before the flood starts
            s.sendall(_produce_frame(victim_topic, small, corr, "burst-victim", acks))
            _read_frame(s)
        t0 = time.monotonic()
        if flood:
            flooder.start()
        corr = 100
        while time.monotonic() < stop:
            corr += 1
            frame = _produce_frame(victim_topic, small, corr, "burst-victim", acks)
            sent = time.monotonic()
            s.sendall(frame)
            resp = _read_frame(s)
            rtts.append((sent - t0, time.monotonic() - sent))
            assert struct.unpack_from(">i", resp)[0] == corr
            time.sleep(0.005)
    if flood:
        flooder.join(90)
    assert not errors, errors
    return [rtt for at, rtt in rtts if at >= settle], bursts[0]


NO_FAIR_SHARE = {"quotas.fair_share.enabled": False}
"""These tests measure what the proxy's own loop and a static quota cost the victim; fair share (issue 48, on by
default) would hold the unquoted flooder to a share beside the victim and hide both (tests/integration/
test_fair_share.py tests it)."""


def test_a_burst_of_large_produces_does_not_stall_another_connection(cluster, fresh_proxy):
    proxy = fresh_proxy(**NO_FAIR_SHARE)
    broker_id = cluster.brokers[0].node_id
    victim_topic = _topic_on(cluster, broker_id)
    flood_topic = _topic_on(cluster, broker_id)
    direct_addr = _leader_address(cluster.bootstrap, victim_topic, broker_id)
    _leader_address(cluster.bootstrap, flood_topic, broker_id)
    proxy_addr = _leader_address(proxy.bootstrap, victim_topic, broker_id)

    direct, direct_bursts = _run(direct_addr, victim_topic, flood_topic)
    proxied, proxied_bursts = _run(proxy_addr, victim_topic, flood_topic)
    d99, p99 = percentile(direct, 99), percentile(proxied, 99)
    summary = (
        f"victim round trips: direct p50 {percentile(direct, 50) * 1000:.1f} p99 {d99 * 1000:.1f} ms max "
        f"{max(direct) * 1000:.1f} ms ({direct_bursts} bursts); proxy p50 {percentile(proxied, 50) * 1000:.1f} "
        f"p99 {p99 * 1000:.1f} ms max {max(proxied) * 1000:.1f} ms ({proxied_bursts} bursts)"
    )
    print(summary)
    assert proxied_bursts >= 3, summary  # the flood really ran through the proxy
    # The bound: what the broker costs the victim under the same burst, plus a slice (SLICE_S). It held on 6959566
    # too (p99 direct 42 / proxy 59 ms at load 7.7, 57 / 108 ms at load 12): the proxy's loop was not where the
    # issue's victim waited (docs/performance.md); this keeps it so.
    assert p99 <= max(2 * d99, d99 + SLICE_S), summary


FLOOD_QUOTA = 2 * 1024 * 1024
VICTIM_RATE = 200  # small Produce requests a second, on a schedule that does not wait for their answers
ALONE_S = 6.0
FLOOD_S = 12.0
QUOTA_SLACK_S = 0.05
"""What the quota-held flood may add to the victim's p99 beyond twice its p99 alone: the broker's append of one
paced 1 MB request (a few ms on loopback, tens when the machine is busy) and one BYTES_PER_TURN slice of the
loop, with the wake-up noise of a shared 2-core machine. Measured: 26.3 ms beside the flood vs 10.6 alone (load
4.4), 24.7 vs 44.5 (load 6.2). The flood let through a window at a time is caught by its landing times, not by
this bound (see the test)."""


def _victim_on_schedule(address: str, topic: str, seconds: float) -> list[float]:
    """Latencies (s) of small Produce requests sent every 1/VICTIM_RATE s whatever the answers do, each measured
    from the moment it was due, not sent: a victim that waited for each answer before the next would send one
    request into a stall and miss the rest of it (coordinated omission)."""
    host, port = address.rsplit(":", 1)
    small = _batch(1, 1024)
    due: dict[int, float] = {}
    latencies: list[float] = []
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for corr in range(1, 21):  # warm the path first
            s.sendall(_produce_frame(topic, small, corr, "quota-victim"))
            _read_frame(s)
        n = int(seconds * VICTIM_RATE)
        frames = [_produce_frame(topic, small, 1000 + k, "quota-victim") for k in range(n)]

        def read() -> None:
            for _ in range(n):
                resp = _read_frame(s)
                corr = struct.unpack_from(">i", resp)[0]
                latencies.append(time.monotonic() - due[corr])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        t0 = time.monotonic()
        for k, frame in enumerate(frames):
            at = t0 + k / VICTIM_RATE
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            due[1000 + k] = at
            s.sendall(frame)
        reader.join(60)
        assert not reader.is_alive(), "the victim's answers stopped"
    return latencies


def _quota_flood(
    address: str, topic: str, stop: threading.Event, landed: list[float], errors: list[BaseException]
) -> None:
    """Bursts of BURST × 1 MB Produce requests, pipelined, back to back, until ``stop``; ``landed`` gets the
    time each was acknowledged (acks=1: appended by the leader). The answers are read on a thread of their own:
    the burst's ``sendall`` blocks while a proxy holding the tenant to its quota leaves the rest unread, and an
    answer read only after it would be timed late."""
    host, port = address.rsplit(":", 1)
    big = _batch(BIG_BATCH_RECORDS, BIG_RECORD)
    done = threading.Semaphore(0)

    def read(s: socket.socket) -> None:
        try:
            while True:
                _read_frame(s)
                landed.append(time.monotonic())
                if len(landed) % BURST == 0:
                    done.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            if not stop.is_set():
                errors.append(exc)
            done.release()

    try:
        with socket.create_connection((host, int(port)), timeout=60) as s:
            burst = b"".join(_produce_frame(topic, big, c, "quota-flooder") for c in range(BURST))
            s.settimeout(90)  # held to its quota, it waits unread for its turn
            threading.Thread(target=read, args=(s,), daemon=True).start()
            while not stop.is_set() and not errors:
                s.sendall(burst)
                while not done.acquire(timeout=0.1):
                    if stop.is_set():
                        return
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        if not stop.is_set():
            errors.append(exc)


def test_a_flooder_held_to_its_quota_does_not_stall_its_neighbour(cluster, fresh_proxy):
    """Issue 37, the stall the issue measured: a tenant held to its byte-rate quota by the proxy's default
    enforcement, pipelining bursts of 20 × 1 MB, beside a small producer on the same broker.

    The cause is asserted, the effect bounded. Under `kafka` enforcement (the default before issue 37) the proxy,
    as a broker would, lets an idle tenant's first window of quota through at once: 24 of its 1 MB requests
    landed within 0.3 s (run on b926fde's enforcement, 04:45 UTC), and this test fails on that. With three
    replicas and acks=all, the issue's scenario, such a burst is what the neighbour waited up to 2 s behind
    (docs/performance.md); on one replica with acks=1, as here, the broker appends it in a few tens of ms, too
    little to fail a latency bound on a noisy machine, so the neighbour's p99 is the guard that pacing adds
    no stall of its own (one request every half second, p99 24.7 ms beside the flood vs 44.5 alone)."""
    proxy = fresh_proxy(
        **{
            # The shipped default, not the harness's (tests.support pins `kafka` for the tests written against it).
            "quotas.enforcement": QuotaConfig.model_fields["enforcement"].default,
            "quotas.entities": [
                {"entity": {"client-id": "quota-flooder"}, "quotas": {"producer_byte_rate": FLOOD_QUOTA}}
            ],
            **NO_FAIR_SHARE,
        }
    )
    broker_id = cluster.brokers[1].node_id
    victim_topic = _topic_on(cluster, broker_id)
    flood_topic = _topic_on(cluster, broker_id)
    address = _leader_address(proxy.bootstrap, victim_topic, broker_id)
    _leader_address(proxy.bootstrap, flood_topic, broker_id)

    alone = _victim_on_schedule(address, victim_topic, ALONE_S)
    stop = threading.Event()
    landed: list[float] = []
    errors: list[BaseException] = []
    flooder = threading.Thread(target=_quota_flood, args=(address, flood_topic, stop, landed, errors), daemon=True)
    flooder.start()
    try:
        flooded = _victim_on_schedule(address, victim_topic, FLOOD_S)
    finally:
        stop.set()
    a99, f99 = percentile(alone, 99), percentile(flooded, 99)
    batch = BIG_BATCH_RECORDS * BIG_RECORD
    most = max(sum(1 for t in landed if at <= t < at + 1.0) for at in landed) if landed else 0
    summary = (
        f"flood: {len(landed)} × {batch / 1e6:.2f} MB landed in {FLOOD_S:.0f} s, at most {most} in one second; "
        f"victim on schedule: alone p50 {percentile(alone, 50) * 1000:.1f} p99 {a99 * 1000:.1f} ms; beside the "
        f"flood p50 {percentile(flooded, 50) * 1000:.1f} p99 {f99 * 1000:.1f} max {max(flooded) * 1000:.1f} ms"
    )
    print(summary)
    assert not errors, errors
    # The cause: the tenant's bytes reach the broker paced, about its quota a second (a request a half second),
    # never a window's credit at once (kafka enforcement: all 20 of the first burst within a second).
    assert len(landed) >= FLOOD_S * FLOOD_QUOTA / batch / 2, summary  # it ran, at about its quota
    assert most * batch <= 3 * FLOOD_QUOTA, summary
    # The effect: the neighbour's p99 stays within a slice of its p99 alone.
    assert f99 <= max(2 * a99, a99 + QUOTA_SLACK_S), summary
