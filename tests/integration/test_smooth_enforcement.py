"""Smooth enforcement against the real cluster (issue 30, item 1): a full-speed producer and a full-speed consumer,
each held to its quota in every second, not only on average.

With ``quotas.enforcement: smooth`` the proxy paces byte rates with a bucket of a tenth of a second of quota: a
Produce waits until it is affordable, a Fetch asks for no more than the bucket holds. The producer's rate is
measured where the bytes land (the partition's log on the leader's disk), the consumer's as its records arrive;
each is cut into 1-s slices. Bound (the issue's): after the first seconds, every slice within [0.8, 1.2] × quota
when a request carries at most a tenth of a second's quota, and the total within 5 %.
"""

from __future__ import annotations

import uuid

import pytest

from tests.harness.measure import MIB, Sampler, create_topic, log_bytes, topic_dirs
from tests.harness.traffic import RECORD, fill_topic, rdkafka_consume, rdkafka_produce

pytestmark = pytest.mark.cluster

QUOTA = 1 * MIB
SECONDS = 60
SETTLE_S = 2  # the first seconds: the bucket's burst and the client's start


def slices(points: list[tuple[float, float]], start: float, seconds: int) -> list[float]:
    """Per 1-s slice from ``start``: the increase of a cumulative count, interpolated between its samples."""

    def at(t: float) -> float:
        prev = points[0]
        for p in points:
            if p[0] >= t:
                if p[0] == prev[0]:
                    return p[1]
                return prev[1] + (p[1] - prev[1]) * (t - prev[0]) / (p[0] - prev[0])
            prev = p
        return points[-1][1]

    return [at(start + i + 1) - at(start + i) for i in range(seconds)]


def _smooth_proxy(fresh_proxy, client_id: str):
    return fresh_proxy(
        **{
            "quotas.enforcement": "smooth",
            "quotas.smooth_burst_seconds": 0.1,
            "quotas.entities": [
                {
                    "entity": {"client-id": client_id},
                    "quotas": {"producer_byte_rate": QUOTA, "consumer_byte_rate": QUOTA},
                }
            ],
        }
    )


def _check(per_second: list[float], what: str) -> None:
    settled = per_second[SETTLE_S:]
    shown = ", ".join(f"{s / QUOTA:.2f}" for s in per_second)
    print(f"{what}, 1-s slices / quota: {shown}")
    assert all(0.8 * QUOTA <= s <= 1.2 * QUOTA for s in settled), f"{what}: {shown}"
    total = sum(settled) / (len(settled) * QUOTA)
    assert abs(total - 1) <= 0.05, f"{what}: {total:.3f} of the quota over {len(settled)} s"


def test_a_full_speed_producer_is_held_to_its_quota_in_every_second(cluster, fresh_proxy):
    client_id = f"smooth-p-{uuid.uuid4().hex[:6]}"
    proxy = _smooth_proxy(fresh_proxy, client_id)
    topic = f"smooth-p-{uuid.uuid4().hex[:6]}"
    create_topic(cluster, topic, [1])
    dirs = topic_dirs(cluster, topic)
    with Sampler(lambda: log_bytes(dirs), interval=0.1) as s:
        # batches of 64 KiB: a request carries at most 1/16 s of the quota
        result = rdkafka_produce(
            proxy.bootstrap, topic, client_id, SECONDS + 3, outstanding=2_000, **{"batch.size": 65536, "linger.ms": 5}
        )
    assert not result["errors"] and result["undelivered"] == 0, result["errors"][:3]
    start = next(t for t, v in s.samples if v > s.samples[0][1])  # the first bytes on disk
    _check(slices(s.samples, start, SECONDS), "producer")


def test_a_full_speed_consumer_is_held_to_its_quota_in_every_second(cluster, fresh_proxy):
    client_id = f"smooth-c-{uuid.uuid4().hex[:6]}"
    proxy = _smooth_proxy(fresh_proxy, client_id)
    topic = f"smooth-c-{uuid.uuid4().hex[:6]}"
    create_topic(cluster, topic, [1])
    n = (SECONDS + 10) * QUOTA // RECORD
    fill_topic(cluster.bootstrap, topic, n)
    result = rdkafka_consume(proxy.bootstrap, topic, f"g-{client_id}", client_id, n, timeout=SECONDS + 60)
    assert not result["errors"], result["errors"][:3]
    arrivals = [(t, offset * RECORD) for t, offset in result["arrivals"]]
    _check(slices(arrivals, arrivals[0][0], SECONDS), "consumer")
