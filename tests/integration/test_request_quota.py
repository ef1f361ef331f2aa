"""KIP-124 request quota (``request_percentage``) through the proxy against the real cluster.

What the proxy charges (proxy/rules/policy.py, quotas.kinds.thread_ms): an estimate of the broker thread time each
request costs, from its API and sizes, never a wait the client asked for (Fetch max_wait, JoinGroup/SyncGroup,
Produce acks=all), and Produce and Fetch as much as any other API (issue #36). Raw requests on bare sockets
(KafkaWire) where the test must control exactly what is in flight and read every throttle_time_ms; librdkafka where
the flooder is a real producer.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid

import pytest
from kafka.protocol.metadata import MetadataRequest

from tests.harness.request_bodies import fetch_request
from tests.support import KafkaWire

pytestmark = pytest.mark.cluster

METADATA_V = 12  # throttle_time_ms since v3


def _metadata(wire: KafkaWire, client_id: str) -> tuple[float, int]:
    """One Metadata round trip (all topics' worth of nothing: topics=[]): (seconds, throttle_time_ms)."""
    t0 = time.perf_counter()
    wire.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), METADATA_V, client_id=client_id)
    _, resp = wire.recv()
    return time.perf_counter() - t0, resp.throttle_time_ms


def _hammer(wire: KafkaWire, client_id: str, seconds: float) -> list[tuple[float, float, int]]:
    """Metadata back to back (ignoring throttle_time_ms, as librdkafka may): (start, latency, throttle)."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        lat, throttle = _metadata(wire, client_id)
        out.append((start, lat, throttle))
    return out


def test_tight_request_percentage_throttles_the_hammer_not_the_neighbour(fresh_proxy):
    """P = 0.05 %: 0.5 ms of broker thread a second, about 20 Metadata/s at the estimate's ~0.025 ms. (It was 1 %,
    written when the proxy charged wall time: at the thread-time estimate that allows ~400/s, more than this
    machine's hammer sends, and its 11-s padded window let the whole 8 s through unthrottled.)"""
    from quotas.kinds import METADATA, thread_ms

    p = 0.05
    allowed = p * 10 / thread_ms(METADATA, 40, 200)
    proxy = fresh_proxy(
        **{
            "quotas.window_num": 2,  # the padded window's allowance is spent within the first second
            "quotas.entities": [{"entity": {"client-id": "hammer"}, "quotas": {"request_percentage": p}}],
        }
    )
    calm, hammer = KafkaWire(proxy.bootstrap), KafkaWire(proxy.bootstrap)
    try:
        # Baselines, each client alone: the unthrottled request rate and the neighbour's latency.
        base = [_metadata(calm, "calm")[0] for _ in range(300)]
        base_rate = len(base) / sum(base)
        base_p50 = statistics.median(base)

        # The hammer goes flat out for 8 s; meanwhile the neighbour asks every 20 ms on its own connection.
        result: list = []
        t = threading.Thread(target=lambda: result.extend(_hammer(hammer, "hammer", 8.0)))
        t0 = time.monotonic()
        t.start()
        during: list[tuple[float, int]] = []
        while t.is_alive():
            during.append(_metadata(calm, "calm"))
            time.sleep(0.02)
        t.join()

        throttles = [th for _, _, th in result]
        late = [r for r in result if r[0] >= t0 + 4]  # the padded window's allowance is long spent by then
        late_rate = len(late) / 4
        print(
            f"unthrottled {base_rate:.0f} req/s (p50 {1000 * base_p50:.2f} ms); hammer {len(result)} requests, "
            f"{late_rate:.1f} req/s in its last 4 s, throttle max {max(throttles)} ms; neighbour p50 "
            f"{1000 * statistics.median(x for x, _ in during):.2f} ms, max {1000 * max(x for x, _ in during):.1f} ms"
        )
        assert max(throttles) > 0, "the hammer was never told to back off"
        assert max(throttles) <= 1000, "request throttles are capped at one window"
        assert late_rate < 0.3 * base_rate, "the hammer's request rate did not drop"
        assert late_rate < 1.5 * allowed, f"held above what the estimate allows ({allowed:.0f}/s)"
        # Muted while it ignored throttle_time_ms: its round trips grew to the throttle.
        assert max(lat for _, lat, _ in result) >= 0.5
        # The neighbour: never throttled, latency still low (a generous bound: this machine is shared and small).
        assert all(th == 0 for _, th in during)
        assert statistics.median(x for x, _ in during) < max(5 * base_p50, 0.02)
        assert len(during) >= 8.0 / 0.05 * 0.5, "the neighbour was slowed down"
    finally:
        calm.close()
        hammer.close()


def test_fetch_long_poll_is_not_charged(cluster, fresh_proxy):
    """A Fetch that waits max_wait_ms = 500 on an empty partition under request_percentage 1 (10 ms/s): if the
    wait were charged, every poll would be 50 × over quota and throttled to the 1 s cap."""
    proxy = fresh_proxy(
        **{"quotas.entities": [{"entity": {"client-id": "poller"}, "quotas": {"request_percentage": 1}}]}
    )
    topic = f"longpoll-{uuid.uuid4().hex[:8]}"
    from tests.harness.measure import create_topic

    create_topic(cluster, topic, [2])
    wire = KafkaWire(proxy.bootstrap)
    deadline = time.monotonic() + 30
    while True:  # the new topic reaches every broker's metadata cache a moment after creation
        wire.send(
            MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False),
            METADATA_V,
            client_id="poller",
        )
        _, md = wire.recv()
        if md.topics and md.topics[0].partitions and md.topics[0].partitions[0].leader_id >= 0:
            break
        assert time.monotonic() < deadline, "the topic never showed up in metadata"
        time.sleep(0.2)
    leader = md.topics[0].partitions[0].leader_id
    broker = next(b for b in md.brokers if b.node_id == leader)
    wire.close()
    fetch = KafkaWire(f"{broker.host}:{broker.port}")  # the proxy's listener for the leader
    rtts, throttles = [], []
    try:
        for _ in range(8):
            req = fetch_request(topic, max_wait_ms=500)
            t0 = time.perf_counter()
            fetch.send(req, 12, client_id="poller")
            _, resp = fetch.recv()
            rtts.append(time.perf_counter() - t0)
            throttles.append(resp.throttle_time_ms)
            assert resp.responses[0].partitions[0].error_code == 0
    finally:
        fetch.close()
    print(f"long polls: {[round(x, 3) for x in rtts]} s, throttle {throttles}")
    assert throttles == [0] * 8
    assert all(0.4 <= x < 0.9 for x in rtts), "a long poll was cut short or muted after its wait"


def test_linger_0_producer_under_binding_request_percentage_is_throttled(cluster, proxy, fresh_proxy):
    """Issue #36: a producer flooding a broker with tiny requests (linger 0, acks 1, 16-B records) is what
    request_percentage exists for. Before the thread-time estimate the proxy charged Produce nothing and this
    producer ran at its unthrottled rate under any P. P is chosen so that the proxy's estimate allows a sixth of
    the unthrottled rate through the proxy. This producer pipelines thousands of requests: since the quota is
    decided as each request arrives (and the connection is not read past the first one over quota, as a broker
    does), it is held near what the estimate allows, where charging at the response let it through at 1.1-2.7 x."""
    from quotas.kinds import PRODUCE, thread_ms
    from tests.harness.measure import create_topic
    from tests.harness.traffic import rdkafka_request_flood

    topic = f"lin0-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, [1])
    free = rdkafka_request_flood(proxy.bootstrap, topic, "lin0-free", warm=2, seconds=6)
    per_ms = thread_ms(PRODUCE, 120, 0)  # a 16-B record's Produce v9+ is about 100-130 bytes
    p = max(round(free["rate"] / 6 * per_ms / 10, 2), 0.05)
    allowed = p * 10 / per_ms
    held_proxy = fresh_proxy(
        **{
            "quotas.window_num": 3,  # a 3-s padded window: the first burst is spent within the warm-up
            "quotas.enforcement": "kafka",  # a broker's throttle_time_ms (smooth paces instead: no throttle told)
            "quotas.entities": [{"entity": {"client-id": "lin0"}, "quotas": {"request_percentage": p}}],
        }
    )
    held = rdkafka_request_flood(held_proxy.bootstrap, topic, "lin0", warm=5, seconds=10)
    print(f"unthrottled {free['rate']:.0f} Produce/s; under {p} % (the estimate allows {allowed:.0f}/s): {held}")
    assert held["throttled"] > 0, "the producer was never told to back off"
    assert held["rate"] < 0.6 * free["rate"], "the producer's request rate did not drop"
    assert 0.5 * allowed < held["rate"] < 1.4 * allowed, "not held near what its estimate allows"
