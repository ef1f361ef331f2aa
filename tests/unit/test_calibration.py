"""quotas.calibration: from the rates the brokers allowed under request_percentage to the costs the proxy charges."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from config.model import ProxyConfig
from quotas.calibration import (
    CalibrationError,
    Probe,
    cost_ms,
    proposal,
    render,
)
from quotas.kinds import BUILTIN_COSTS, FETCH, LIST_OFFSETS, METADATA, PRODUCE, RequestCosts

P = 1.0  # % of one thread


def test_cost_is_the_quota_over_the_rate_it_allowed():
    """1 % of a thread is 10 ms a second: held at 400 requests a second, each cost 0.025 ms."""
    assert cost_ms(1.0, 400) == pytest.approx(0.025)
    assert cost_ms(8.6, 3_576) == pytest.approx(0.024, rel=0.01)  # issue 50's librdkafka producer, run 1
    assert math.isinf(cost_ms(1.0, 0))
    with pytest.raises(ValueError, match="request_percentage 0"):
        cost_ms(0, 100)


def _cluster(scale: float, replicated_ms: float) -> RequestCosts:
    """Brokers that charge the built-in table times ``scale``, and ``replicated_ms`` for an acks=-1 Produce."""
    rows = {k: (b * scale, i * scale, o * scale) for k, (b, i, o) in BUILTIN_COSTS.by_api.items()}
    d = BUILTIN_COSTS.default
    return RequestCosts(
        rows,
        (d[0] * scale, d[1] * scale, d[2] * scale),
        BUILTIN_COSTS.fetch_head_ms_per_kib * scale,
        replicated_ms,
        "x",
    )


def _probes(cluster: RequestCosts, rf: int = 3, tail: bool = True) -> list[Probe]:
    """What the probes would measure against ``cluster``: each held at P × 10 / its cost, in four slices."""
    shapes = [
        ("Produce acks=1 RF 1", PRODUCE, 180, 60, 1, 1),
        (f"Produce acks=-1 RF {rf}", PRODUCE, 180, 60, -1, rf),
        ("Fetch empty", FETCH, 90, 99, 1, 1),
        ("ListOffsets", LIST_OFFSETS, 70, 50, 1, 1),
        ("Metadata", METADATA, 40, 300, 1, 1),
    ]
    if tail:
        shapes.append(("Fetch records", FETCH, 90, 1_100, 1, 1))
    out = []
    for name, key, req, resp, acks, factor in shapes:
        ms = cluster.request_percent(key, req, resp, acks, factor) * 10
        rate = P * 10 / ms
        out.append(
            Probe(name, key, P, req, resp, (rate * 0.9, rate * 1.1, rate, rate), acks, factor, throttled=50,
                  records=name == "Fetch records")
        )  # fmt: skip
    return out


@pytest.mark.parametrize("scale", [0.5, 1.0, 1.7])
def test_the_proposed_table_charges_what_the_brokers_charged(scale):
    """Brokers charging the table times ``scale``: the proposal charges every probed request what they did, and
    scales the APIs it did not probe by the same factor."""
    cluster = _cluster(scale, 0.2)
    probes = _probes(cluster)
    prop = proposal(probes)
    assert prop.scale == pytest.approx(scale, rel=0.05)
    costs = prop.costs("test")
    for p in probes:
        charged = costs.request_percent(p.api_key, p.request_bytes, p.response_bytes, p.acks, p.replication_factor) * 10
        assert charged == pytest.approx(p.cost_ms, rel=0.02), p.name
    assert prop.replicated_ms == pytest.approx(0.2, rel=0.02)
    assert costs.thread_ms(9, 100, 100) == pytest.approx(_cluster(scale, 0).thread_ms(9, 100, 100), rel=0.05)


def test_the_tailing_fetch_gives_the_head_term_and_the_empty_one_the_base():
    """Brokers whose Fetch head is 3 x the built-in one's (scaled): the tailing probe recovers it, the empty probe
    the base, and a consumer's Fetch after a one-partition empty answer (68 bytes, librdkafka's v16) is charged
    what the 99-byte v7 probe's was (issue 50, run 11: 30 % apart when every answer byte was head)."""
    rows = {k: (b * 0.5, i * 0.5, o * 0.5) for k, (b, i, o) in BUILTIN_COSTS.by_api.items()}
    d = BUILTIN_COSTS.default
    head = BUILTIN_COSTS.fetch_head_ms_per_kib * 1.5
    cluster = RequestCosts(rows, (d[0] * 0.5, d[1] * 0.5, d[2] * 0.5), head, 0.2, "x")
    prop = proposal(_probes(cluster))
    assert prop.fetch_head_ms_per_kib == pytest.approx(head, rel=0.02)
    costs = prop.costs("t")
    assert costs.thread_ms(FETCH, 90, 68) == pytest.approx(cluster.thread_ms(FETCH, 90, 99), rel=0.02)
    assert costs.thread_ms(FETCH, 90, 700) == pytest.approx(cluster.thread_ms(FETCH, 90, 700), rel=0.02)
    assert "fetch_head_ms_per_kib: " in render(prop, "s", [])
    assert proposal(_probes(cluster, tail=False)).fetch_head_ms_per_kib is None


def test_a_tailing_fetch_that_read_no_records_is_refused():
    probes = _probes(_cluster(0.5, 0.2))
    probes[-1] = Probe("Fetch records", FETCH, P, 90, 99, (500.0,), throttled=5, records=True)
    with pytest.raises(CalibrationError, match="probe Fetch records: its answers \\(99 bytes\\).*no records"):
        proposal(probes)


def test_acks_all_to_an_unreplicated_cluster_adds_nothing():
    """Where the default replication factor is 1, acks=-1 waits for nobody: the term is 0, not noise."""
    probes = _probes(_cluster(0.5, 0.0), rf=1)
    assert proposal(probes).replicated_ms == 0.0


def test_a_probe_the_brokers_never_held_is_refused_by_name():
    probes = _probes(_cluster(0.5, 0.2))
    probes[3] = Probe("ListOffsets", LIST_OFFSETS, P, 70, 50, (900.0,), throttled=0)
    with pytest.raises(CalibrationError, match="probe ListOffsets: the brokers never throttled it.*lower --percent"):
        proposal(probes)


def test_the_printed_section_is_a_configuration_the_proxy_accepts_and_charges_by():
    """What ``calibrate`` prints merges into the proxy's configuration as it stands and gives the same table."""
    prop = proposal(_probes(_cluster(0.5, 0.2)))
    text = render(prop, 'calibrate 2026-12-06 against "k:9092"', ["kafka-throttle-proxy calibrate", "P 1 %"])
    assert text.startswith("# kafka-throttle-proxy calibrate\n# P 1 %\n")
    doc = yaml.safe_load(text)
    cfg = ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["k:9092"]}, **doc})
    loaded = cfg.quotas.request_costs.costs()
    assert loaded.source == 'calibrate 2026-12-06 against "k:9092"'
    want = prop.costs("x")
    for key in (PRODUCE, FETCH, LIST_OFFSETS, METADATA, 9, 500):
        for size in (0, 100, 10_000):
            assert loaded.thread_ms(key, size, size) == pytest.approx(
                want.thread_ms(key, size, size), rel=1e-3, abs=1e-5
            )
    assert loaded.replicated_ms == pytest.approx(0.2, rel=1e-3)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.1, 10), st.floats(0, 2))
def test_any_cluster_scale_is_recovered(scale, replicated):
    cluster = _cluster(scale, replicated)
    prop = proposal(_probes(cluster))
    costs = prop.costs("h")
    for p in _probes(cluster):
        assert costs.request_percent(
            p.api_key, p.request_bytes, p.response_bytes, p.acks, p.replication_factor
        ) * 10 == pytest.approx(p.cost_ms, rel=0.02, abs=1e-6)


def _alone_probes(cluster: RequestCosts) -> list[Probe]:
    """The probes one request at a time, as ``calibrate`` runs them after the pipelined ones."""
    shapes = [
        ("Produce acks=1 RF 1, one at a time", PRODUCE, 180, 60, 1),
        ("Fetch empty, one at a time", FETCH, 90, 99, 1),
        ("ListOffsets, one at a time", LIST_OFFSETS, 70, 50, 1),
        ("Metadata, one at a time", METADATA, 40, 300, 1),
    ]
    out = []
    for name, key, req, resp, acks in shapes:
        ms = cluster.request_percent(key, req, resp, acks, 1, alone=True) * 10
        rate = P * 10 / ms
        out.append(Probe(name, key, P, req, resp, (rate, rate * 1.1, rate * 0.9), acks, 1, 40, alone=True))
    return out


def _alone_cluster(scale: float, alone_factor: float) -> RequestCosts:
    """Brokers as :func:`_cluster`, charging a request sent alone ``alone_factor`` x a pipelined one's base."""
    c = _cluster(scale, 0.2)
    alone = {k: c.cost(k)[0] * alone_factor for k in (PRODUCE, FETCH, LIST_OFFSETS, METADATA)}
    return RequestCosts(c.by_api, c.default, c.fetch_head_ms_per_kib, c.replicated_ms, "x", alone)


@pytest.mark.parametrize("alone_factor", [1.0, 2.0, 0.8])
def test_the_probes_one_at_a_time_give_the_alone_bases_and_leave_the_rest(alone_factor):
    """Brokers charging a request sent alone ``alone_factor`` x a pipelined one (2 x on 2026-12-07's cluster): the
    one-at-a-time probes give each API's alone base, charged back exactly; the pipelined bases, the scale of the
    APIs not probed and the replicated term are what the pipelined probes alone give."""
    cluster = _alone_cluster(0.5, alone_factor)
    pipelined = _probes(cluster)
    prop = proposal(pipelined + _alone_probes(cluster))
    without = proposal(pipelined)
    assert prop.scale == without.scale and prop.bases == without.bases
    assert prop.replicated_ms == without.replicated_ms
    assert set(prop.alone) == {PRODUCE, FETCH, LIST_OFFSETS, METADATA}
    costs = prop.costs("t")
    for p in _alone_probes(cluster):
        alone = costs.request_percent(p.api_key, p.request_bytes, p.response_bytes, p.acks, 1, alone=True) * 10
        assert alone == pytest.approx(p.cost_ms, rel=0.02), p.name
    for p in pipelined:
        charged = costs.request_percent(p.api_key, p.request_bytes, p.response_bytes, p.acks, p.replication_factor)
        assert charged * 10 == pytest.approx(p.cost_ms, rel=0.02), p.name
    assert costs.request_percent(9, 100, 100, alone=True) == costs.request_percent(9, 100, 100)  # not probed: one
    assert costs.request_percent(PRODUCE, 180, 0, 0, 1, alone=True) == 0.0  # acks=0: nothing, alone or not


def test_the_alone_bases_are_printed_and_read_back_by_the_configuration():
    prop = proposal(_probes(_alone_cluster(0.5, 2.0)) + _alone_probes(_alone_cluster(0.5, 2.0)))
    doc = yaml.safe_load(render(prop, "s", []))
    assert doc["quotas"]["request_costs"]["apis"]["Fetch"]["alone_base_ms"] == pytest.approx(prop.alone[FETCH], 1e-3)
    cfg = ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["k:9092"]}, **doc})
    loaded = cfg.quotas.request_costs.costs()
    want = prop.costs("x")
    for key in (PRODUCE, FETCH, LIST_OFFSETS, METADATA, 9):
        for alone in (False, True):
            assert loaded.request_percent(key, 100, 90, alone=alone) == pytest.approx(
                want.request_percent(key, 100, 90, alone=alone), rel=1e-3
            )
    assert loaded.request_percent(FETCH, 90, 90, alone=True) > 1.9 * loaded.request_percent(FETCH, 90, 90)


def test_a_table_without_alone_bases_charges_a_request_alone_as_any_other():
    """The built-in table (fitted to pipelining clients) and a configuration from before the alone probes."""
    for key in (PRODUCE, FETCH, LIST_OFFSETS, METADATA, 9, 500):
        assert BUILTIN_COSTS.request_percent(key, 200, 300, alone=True) == BUILTIN_COSTS.request_percent(key, 200, 300)
