"""quotas.kinds.request_percent: the broker thread time the proxy charges ``request_percentage`` per API.

The figures each test pins are the brokers' own implied charges the coefficients were calibrated against
(BENCHMARKS.md, "KIP-124 request quota: brokers vs proxy"); the estimate reads no clock, so none is injected:
the policy-level tests (tests/unit/test_policy.py) run it under an injected clock and show the upstream time
never enters it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from protocol.headers import parse_request_header
from protocol.inflight import produce_acks
from quotas.kinds import (
    FETCH,
    FETCH_BARE_BYTES,
    FETCH_HEAD_BYTES,
    LIST_OFFSETS,
    PRODUCE,
    PRODUCE_ACKS_ALL_MS,
    THREAD_COST_MS,
    request_percent,
    thread_ms,
)
from tests.harness.request_bodies import fetch_request


def _frame(req, client_id: str = "app"):
    req.with_header(correlation_id=1, client_id=client_id)
    frame = bytes(req.encode(header=True, framed=True))
    return parse_request_header(frame, 4), frame


def _produce(acks: int, version: int = 7, transactional_id: str | None = None, value: bytes = b"v" * 16):
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=-1, producer_epoch=-1, base_sequence=-1)
    b.append(0, b"k", value)
    b.close()
    TD = ProduceRequest.TopicProduceData
    return _frame(
        ProduceRequest(
            transactional_id=transactional_id,
            acks=acks,
            timeout_ms=1000,
            version=version,
            topic_data=[TD(name="t", partition_data=[TD.PartitionProduceData(index=0, records=b.buffer())])],
        )
    )


def _ms(header, frame, last_response: int = 0) -> float:
    """The charge as the policy makes it: acks read by the protocol layer, the estimate from quotas/."""
    acks = produce_acks(frame, header, 4) if header.api_key == PRODUCE else 1
    a = request_percent(header.api_key, len(frame) - 4, last_response, acks)
    return a * 10  # percent-seconds of a thread -> ms


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11])
@pytest.mark.parametrize("transactional_id", [None, "", "tx", "t" * 200])
@pytest.mark.parametrize("acks", [-1, 0, 1])
def test_acks_all_is_charged_whatever_the_transactional_id(version, transactional_id, acks):
    """Legacy and compact transactional ids alike (a 200-byte id takes a two-byte varint): only acks=-1 adds
    the term, and acks=0 is charged nothing (a broker records it exempt from the request quota)."""
    header, frame = _produce(acks, version, transactional_id)
    plain = thread_ms(PRODUCE, len(frame) - 4, 0)
    want = 0.0 if acks == 0 else plain + (PRODUCE_ACKS_ALL_MS if acks == -1 else 0)
    assert _ms(header, frame) == pytest.approx(want)


def test_produce_small_flood_is_charged_what_the_brokers_did():
    """A 16-B-record linger-0 Produce, acks 1: ~0.048 ms, between what the brokers charged the librdkafka
    producer's (~0.040 ms in the proxy's units) and the Java producer's (~0.058 ms) in BENCHMARKS.md run 8 (48-s
    phases): within a factor 1.3 of both."""
    header, frame = _produce(1)
    assert 0.058 / 1.3 < _ms(header, frame) < 0.040 * 1.3
    assert _ms(header, frame) == pytest.approx(thread_ms(PRODUCE, len(frame) - 4, 0))


@pytest.mark.parametrize("version", [7, 9, 11])
def test_produce_acks_all_adds_the_followers_delayed_fetch(version):
    """acks=-1 adds PRODUCE_ACKS_ALL_MS (the completion of each follower's delayed Fetch runs on the producer's
    request thread): ~0.4 ms in all, within a factor 1.3 of the brokers' ~0.45 ms an RF-2 acks=all Produce in
    run 8 (load 2-3); acks 1 does not get it, and acks 0 is charged nothing at all (``KafkaApis`` answers it with
    ``sendNoOpResponseExemptThrottle``: recorded exempt, never against the quota). The replication wait itself is
    never charged: no term depends on time."""
    h1, f1 = _produce(1, version)
    hall, fall = _produce(-1, version)
    h0, f0 = _produce(0, version)
    assert _ms(hall, fall) - _ms(h1, f1) == pytest.approx(PRODUCE_ACKS_ALL_MS)
    assert _ms(h0, f0) == 0.0
    assert 0.45 / 1.3 < _ms(hall, fall) < 0.45 * 1.3


def test_produce_grows_with_its_bytes_and_not_with_its_response():
    small_h, small_f = _produce(1)
    big_h, big_f = _produce(1, value=b"v" * 100_000)
    per_kib = THREAD_COST_MS[PRODUCE][1]
    extra = (len(big_f) - len(small_f)) / 1024 * per_kib
    assert _ms(big_h, big_f) == pytest.approx(_ms(small_h, small_f) + extra)
    assert _ms(small_h, small_f, 10_000) == _ms(small_h, small_f, 0)


def test_fetch_empty_and_tailing_are_charged_what_the_brokers_did():
    """An empty Fetch (a ~90-byte answer before it) ~0.05 ms, within a factor 1.3 of the brokers' ~0.049 ms for
    two no-wait consumers in run 8; one after an answer carrying a few record batches (~700 bytes) ~0.15 ms, three
    times the empty one (the brokers' own request log: a data-bearing Fetch's handler time several times an
    empty one's)."""
    header, frame = _frame(fetch_request("t", max_wait_ms=0, version=12))
    empty = _ms(header, frame, 90)
    tailing = _ms(header, frame, 700)
    assert 0.049 / 1.3 < empty < 0.049 * 1.3
    assert 2.5 * empty < tailing < 4 * empty


def test_fetch_response_term_is_steep_over_its_head_then_shallow():
    """A broker's extra cost for a Fetch that returns data at all is in its first KiB (finding and reading the
    batches, sending them); beyond it record bytes go out by sendfile, cheap: a 1 MiB answer ~0.6 ms, not 100."""
    header, frame = _frame(fetch_request("t", version=12))
    bare = FETCH_BARE_BYTES
    at = [_ms(header, frame, bare + n) for n in (0, FETCH_HEAD_BYTES // 2, FETCH_HEAD_BYTES, 2 * FETCH_HEAD_BYTES)]
    head_slope = (at[2] - at[1]) / (FETCH_HEAD_BYTES / 2)
    tail_slope = (at[3] - at[2]) / FETCH_HEAD_BYTES
    assert at[1] - at[0] == pytest.approx(at[2] - at[1])  # linear over the head
    assert head_slope > 50 * tail_slope > 0
    assert 0.3 < _ms(header, frame, 1 << 20) < 1.0


def test_an_empty_fetch_answer_is_charged_its_base_whatever_its_version():
    """The bytes of an answer without records are headers, not data a broker read: librdkafka's v16 answer for one
    partition (68 bytes) and calibrate's v7 probe's (99) are charged alike, so the cost calibrated on the probe is
    the one a consumer's Fetch is charged (issue 50, run 11: 30 % apart when the head term counted from byte 0)."""
    header, frame = _frame(fetch_request("t", max_wait_ms=0, version=12))
    per_out = THREAD_COST_MS[FETCH][2] / 1024  # the shallow term every answer byte pays, head or not
    bare = _ms(header, frame, FETCH_BARE_BYTES)
    assert _ms(header, frame, 68) == pytest.approx(bare - (FETCH_BARE_BYTES - 68) * per_out)
    assert _ms(header, frame, 99) == pytest.approx(bare - (FETCH_BARE_BYTES - 99) * per_out)
    assert _ms(header, frame, FETCH_BARE_BYTES + 100) > bare + 50 * 100 * per_out  # past the bare bytes, the head


def test_list_offsets_is_charged_what_the_brokers_did():
    """ListOffsets (latest, one partition): ~0.046 ms, within a factor 1.3 of the brokers' ~0.046 ms in run 8."""
    T = ListOffsetsRequest.ListOffsetsTopic
    req = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            T(name="t", partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])
        ],
    )
    req.API_VERSION = 7
    header, frame = _frame(req)
    assert header.api_key == LIST_OFFSETS
    assert 0.046 / 1.3 < _ms(header, frame) < 0.046 * 1.3


@settings(max_examples=300, deadline=None)
@given(st.integers(-1, 100), st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.sampled_from([-1, 0, 1]))
def test_any_request_is_charged_a_positive_bounded_amount(api_key, size, last, acks):
    """Any API key a client sends (unknown ones too) and any sizes: the size-based estimate, plus the acks=all
    term for a Produce asking it, positive; only a Produce with acks=0 is free."""
    a = request_percent(api_key, size, last, acks)
    if api_key == PRODUCE and acks == 0:
        assert a == 0.0
        return
    base = thread_ms(api_key, size, last) / 10
    assert a == pytest.approx(base + (PRODUCE_ACKS_ALL_MS / 10 if api_key == PRODUCE and acks == -1 else 0)) and a > 0
    if api_key == FETCH:
        assert a >= thread_ms(FETCH, 0, 0) / 10


# ------------------------------------------------------------------------------------------ the cluster's own costs


def _config(costs: dict):
    from config.model import ProxyConfig

    return ProxyConfig.model_validate(
        {"upstream": {"bootstrap_servers": ["k:9092"]}, "quotas": {"request_costs": costs}}
    )


def test_configured_costs_replace_the_rows_they_name_and_scale_the_others():
    """What ``calibrate`` prints is what is charged: a named API's row as given, every other API's built-in row (and
    the acks=all and Fetch-head terms) times ``other_apis_scale``."""
    cfg = _config({"source": "calibrated", "apis": {"Produce": {"base_ms": 0.024, "request_ms_per_kib": 0.001}},
                   "other_apis_scale": 0.5})  # fmt: skip
    costs = cfg.quotas.request_costs.costs()
    assert costs.source == "calibrated"
    assert costs.thread_ms(PRODUCE, 2048, 0) == pytest.approx(0.024 + 0.002)
    assert costs.request_percent(PRODUCE, 2048, 0, -1) * 10 == pytest.approx(0.026 + PRODUCE_ACKS_ALL_MS * 0.5)
    assert costs.request_percent(PRODUCE, 2048, 0, 0) == 0.0
    assert costs.thread_ms(FETCH, 0, 0) == pytest.approx(thread_ms(FETCH, 0, 0) * 0.5)
    assert costs.thread_ms(LIST_OFFSETS, 100, 100) == pytest.approx(thread_ms(LIST_OFFSETS, 100, 100) * 0.5)
    assert costs.thread_ms(9999, 10, 10) == pytest.approx(thread_ms(9999, 10, 10) * 0.5)  # an API nobody names


def test_costs_that_name_no_api_or_a_negative_figure_are_refused_naming_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="'Produse' is not an API name"):
        _config({"apis": {"Produse": {"base_ms": 0.02}}})
    with pytest.raises(ValidationError, match=r"request_costs\.apis\.Fetch\.base_ms"):
        _config({"apis": {"Fetch": {"base_ms": -1}}})


def test_the_policy_charges_by_the_configured_costs_and_a_reload_moves_them():
    """``quotas.request_costs`` is reloadable: the policy's table follows the configuration."""
    from config.model import ProxyConfig
    from proxy.rules.policy import Policy
    from proxy.stats import Stats
    from quotas.kinds import BUILTIN_COSTS

    plain = ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["k:9092"]}})
    policy = Policy(plain, Stats())
    assert policy.costs is BUILTIN_COSTS
    policy.reload(_config({"source": "lab", "apis": {"Metadata": {"base_ms": 1.0}}}))
    assert policy.costs.source == "lab" and policy.costs.thread_ms(3, 0, 0) == 1.0


@pytest.mark.parametrize(
    ("acks", "replication", "term"),
    [(1, 3, True), (-1, 3, True), (-1, 1, False), (1, 1, False), (-1, -1, True), (1, -1, False), (0, 3, False)],
)
def test_the_replicated_term_follows_the_topics_replication_factor_where_known(acks, replication, term):
    """A broker completes the followers' fetches an append unblocked on the producer's thread, whatever its acks:
    a Produce to a replicated topic costs that, one to an unreplicated topic does not; where the factor is not known
    the acks say (acks=-1: followers); acks=0 is free whatever the topic."""
    plain = thread_ms(PRODUCE, 200, 0)
    charged = request_percent(PRODUCE, 200, 0, acks, replication) * 10
    if acks == 0:
        assert charged == 0.0
    else:
        assert charged == pytest.approx(plain + (PRODUCE_ACKS_ALL_MS if term else 0.0))
