"""KIP-13 byte-rate quotas through the proxy, held against what the real cluster received or served.

The rate is never the client's own report: produce is the growth of the partition's segment files on the
leader's disk, consume is the group's committed offset read straight from the cluster, mapped to batch bytes
(helpers in ``tests.harness.measure``, whose docstring explains the method). Each run measures ~20 s of steady
rate; the start is excluded up to the moment the 1 s rate is first within [0.9, 1.3] × quota, plus 1 s (a cold
JVM client may start below the quota; a fast one starts above it): a fresh
client's rate window is padded to (samples − 1) × 1 s = 10 s, so Kafka — and the proxy, which reproduces it —
lets it send ~10 s worth of quota at full speed first. That burst is by design; a quota promises a sustained rate.

Sample windows of 0.2 s (``quotas.window_size_seconds``; 11 samples, Kafka's count) instead of Kafka's 1 s: the
rate math is the same, scaled. Why: a client that can go much faster than its quota (all of these) is not held
to a smooth rate by Kafka's algorithm but to a cycle — burst until the window's sum reaches quota × window, then
throttled until the burst's sample is purged, (samples) × window later, then burst again. With 1 s samples that
cycle is ~11 s long (measured: 9-13 MiB jumps every ~11 s at 2 MiB/s, through the proxy and likewise on a
broker, see bench/QUOTA_FIDELITY.md), so a 20 s measurement would see fewer than two cycles and its error would
be set by where the cycle happens to be cut, not by the proxy. With 0.2 s samples a 20 s run spans ~9 cycles.

Tolerance ±5 % of the quota. Protocol overhead: Produce is charged its request size, i.e. the record batch plus
~70 B per one-partition request, which is added back before comparing (0.4 % for the Java producer's 16 KiB
batches, less for librdkafka's larger ones); Fetch is charged its response size, the batches plus ~90 B per
response, < 0.1 % with the 512 KiB partition fetches used here, left in the tolerance.
"""

from __future__ import annotations

import uuid

import pytest

from tests.harness.measure import (
    MIB,
    Sampler,
    batch_index,
    committed_sampler,
    create_topic,
    end_offsets,
    log_bytes,
    offset_to_bytes,
    produce_rate,
    steady_rate,
    topic_dirs,
)
from tests.harness.traffic import (
    RECORD,
    check_sequence,
    fill_topic,
    java_consume,
    java_produce,
    rdkafka_consume,
    rdkafka_produce,
)

pytestmark = pytest.mark.cluster

QUOTA = 2 * MIB
STEADY_S = 20
TOLERANCE = 0.05
WINDOW_S = 0.2
# Records for one run: the padded-window burst (10 windows of quota), ~3 s to settle, the steady part, a margin.
N_RUN = int((10 * WINDOW_S + 3 + STEADY_S + 1) * QUOTA / (RECORD + 10))
# Consumers get 8 s more: librdkafka's initial fetch burst runs well past the padded window's allowance.
N_CONSUME = N_RUN + int(8 * QUOTA / (RECORD + 10))


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _quota(entity: dict, **quotas) -> dict:
    return {"quotas.entities": [{"entity": entity, "quotas": quotas}], "quotas.window_size_seconds": WINDOW_S}


def _check_rate(rate, quota: float, charged: bool, tolerance: float = TOLERANCE) -> None:
    summary = (
        f"achieved {rate.rate / MIB:.3f} MiB/s (charged-equivalent {rate.charged / MIB:.3f}) vs quota "
        f"{quota / MIB:.3f} over {rate.seconds:.1f} s after a {rate.burst_bytes / MIB:.1f} MiB burst; "
        f"5 s slices {[round(w / MIB, 3) for w in rate.windows]}"
    )
    print(summary)
    assert rate.seconds >= 0.75 * STEADY_S, summary
    assert abs(rate.error(quota, charged=charged)) <= tolerance, summary


@pytest.fixture(scope="module")
def filled(cluster):
    """A 1-partition topic on broker 1 holding enough 1 KiB records (16 KiB batches) for one consumer run."""
    topic = _name("fetchq")
    create_topic(cluster, topic, [1])
    fill_topic(cluster.bootstrap, topic, N_CONSUME + 2000)
    return topic, batch_index(topic_dirs(cluster, topic)[0])


# ------------------------------------------------------------------------------------------------- produce
def test_producer_byte_rate_java_producer_perf(cluster, fresh_proxy):
    """<default user> producer_byte_rate; Java honours throttle_time_ms, so muting costs it nothing."""
    proxy = fresh_proxy(**_quota({"user": "<default>"}, producer_byte_rate=QUOTA))
    topic = _name("prodq-java")
    create_topic(cluster, topic, [2])
    dirs = topic_dirs(cluster, topic)
    with Sampler(lambda: log_bytes(dirs)) as s:
        res = java_produce(cluster, proxy.bootstrap, topic, N_RUN, "java-perf")
    m = res["metrics"]
    assert res["sent"] == N_RUN and not res["errors"], (res["errors"][:5], res["stdout"][-1500:])
    assert m["producer-metrics:record-error-total"] == 0
    assert m["producer-metrics:record-retry-total"] == 0, "a request timed out or failed and was retried"
    assert m["producer-metrics:produce-throttle-time-max"] > 0, "the client was never told to back off"
    assert end_offsets(cluster, topic, 1) == [N_RUN]
    _check_rate(produce_rate(s.samples, QUOTA, dirs[0]), QUOTA, charged=True)


@pytest.mark.parametrize(
    "in_flight",
    [
        # librdkafka's defaults: many requests in flight and throttle_time_ms ignored. The proxy reads nothing behind a
        # throttled Produce until its throttle is served (as a broker reads one request at a time), so it holds.
        pytest.param(None, id="default-pipelining"),
        # One request in flight and 64 KiB batches: librdkafka's default 1 MB requests are 2.5 × what 11 samples of
        # 0.2 s at 2 MiB/s hold (0.4 MiB each), and that granularity alone overshoots (+7 % measured).
        pytest.param(1, id="one-in-flight"),
    ],
)
def test_producer_byte_rate_librdkafka_no_loss_no_reorder(cluster, fresh_proxy, in_flight):
    """A client-id entity; librdkafka is held to the rate by muting, and every record arrives once, in order."""
    proxy = fresh_proxy(**_quota({"client-id": "rdk-producer"}, producer_byte_rate=QUOTA))
    topic = _name("prodq-rdk")
    create_topic(cluster, topic, [3])
    dirs = topic_dirs(cluster, topic)
    extra = {} if in_flight is None else {"max.in.flight.requests.per.connection": in_flight, "batch.size": 65536}
    with Sampler(lambda: log_bytes(dirs)) as s:
        res = rdkafka_produce(proxy.bootstrap, topic, "rdk-producer", 5 + STEADY_S, **extra)
    assert not res["errors"] and res["undelivered"] == 0 and res["delivered"] == res["produced"], res
    assert end_offsets(cluster, topic, 1) == [res["produced"]]
    assert check_sequence(cluster.bootstrap, topic, 0, res["produced"]) == []
    # librdkafka's default 1 MB requests are 2.5 × what one 0.2 s sample holds at this quota; that granularity
    # alone overshoots: +7-8 % measured, and +10.6 % in one CI run (2026-11-23; its 5 s slices averaged +2 %,
    # the least-squares slope over a staircase of 1 MB steps is that much noisier). So the default case gets
    # ±15 %, which still catches what it guards against: before the proxy held reads behind a throttled
    # Produce, the pipelined requests went through and it measured +30-60 %. The ±5 % fidelity is the
    # one-in-flight case's (and bench.quota_fidelity's, at Kafka's default 1 s samples, for this client too).
    _check_rate(
        produce_rate(s.samples, QUOTA, dirs[0]), QUOTA, charged=True, tolerance=TOLERANCE if in_flight else 0.15
    )


# ------------------------------------------------------------------------------------------------- fetch
def test_consumer_byte_rate_java_consumer_perf(cluster, fresh_proxy, filled):
    topic, index = filled
    proxy = fresh_proxy(**_quota({"user": "<default>"}, consumer_byte_rate=QUOTA))
    group = _name("java-cons")
    with committed_sampler(cluster, group, topic, index) as s:
        res = java_consume(cluster, proxy.bootstrap, topic, N_CONSUME, group, "java-cons")
    m = res["metrics"]
    assert res["consumed"] >= N_CONSUME and not res["errors"], (res["errors"][:5], res["stdout"][-1500:])
    assert m["consumer-fetch-manager-metrics:fetch-throttle-time-max"] > 0, "the client was never told to back off"
    _check_rate(steady_rate(s.samples, QUOTA), QUOTA, charged=False)


def test_consumer_byte_rate_librdkafka(cluster, fresh_proxy, filled):
    topic, index = filled
    proxy = fresh_proxy(**_quota({"client-id": "rdk-consumer"}, consumer_byte_rate=QUOTA))
    group = _name("rdk-cons")
    with committed_sampler(cluster, group, topic, index) as s:
        res = rdkafka_consume(proxy.bootstrap, topic, group, "rdk-consumer", N_CONSUME)
    assert res["consumed"] >= N_CONSUME and not res["errors"], res["errors"][:5]
    arrived = steady_rate([(t, offset_to_bytes(index, o)) for t, o in res["arrivals"]], QUOTA)
    print(f"cross-check, batches as they arrived at the client: {arrived.rate / MIB:.3f} MiB/s")
    _check_rate(steady_rate(s.samples, QUOTA), QUOTA, charged=False)


# ------------------------------------------------------------------------------------------------- scope
@pytest.mark.parametrize("scope, factor", [("broker", 3), ("cluster", 1)])
def test_scope_three_partitions_on_three_brokers(cluster, fresh_proxy, scope, factor):
    """Kafka enforces a quota per broker: 3 leaders → ~3 × the quota in aggregate; ``scope: cluster`` → ~1 ×.
    The Java producer (it honours throttle_time_ms; librdkafka would hit the pipelining bug above), ±10 %.
    ~25 s of produce: with ~13 s, one CI run (2026-11-23) found only 3.8 s steady (the 1 s rate entered the
    [0.9, 1.3] × quota band late), short of the 8 s this test needs to say anything."""
    quota = MIB
    proxy = fresh_proxy(**{**_quota({"user": "<default>"}, producer_byte_rate=quota), "quotas.scope": scope})
    topic = _name(f"scope-{scope}")
    create_topic(cluster, topic, [1, 2, 3])
    dirs = topic_dirs(cluster, topic)
    assert len(dirs) == 3
    n = int((10 * WINDOW_S + 2 + 25) * factor * quota / (RECORD + 10))
    with Sampler(lambda: log_bytes(dirs)) as s:
        res = java_produce(cluster, proxy.bootstrap, topic, n, f"scope-{scope}")
    assert res["sent"] == n and not res["errors"], res["errors"][:5]
    rate = steady_rate(s.samples, factor * quota)
    print(
        f"scope {scope}: {rate.rate / MIB:.3f} MiB/s over {rate.seconds:.1f} s, slices "
        f"{[round(w / MIB, 3) for w in rate.windows]}; per partition "
        f"{[round(log_bytes([d]) / MIB, 1) for d in dirs]} MiB"
    )
    assert rate.seconds >= 8
    assert abs(rate.rate / (factor * quota) - 1) <= 0.10
