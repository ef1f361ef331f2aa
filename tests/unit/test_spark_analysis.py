"""spark_analysis: config loading, recommendations maths, and the job over a small log written by DecisionLog.

The decisions in the log are made by the proxy's own quota code (``ProxySimulator`` drives QuotaManager the way
proxy/policy.py does), so the checks are: the job names the throttled entity with exactly those totals, and the
what-if replay of a config reproduces, charge by charge, the throttles the quota code computes directly.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict

import pytest
import yaml

from proxy.decision_log.writer import DecisionLog
from quotas.entities import DEFAULT, QuotaEntity
from quotas.manager import Window, Windows
from spark_analysis.__main__ import _budgets
from spark_analysis.quota_config import QuotaConfigError, load_quota_config, parse_quota_config
from spark_analysis.synthetic import NOISY_USER, ProxySimulator, small_traffic

pyspark = pytest.importorskip("pyspark")

LIVE = """
quotas:
  - entity: {user: noisy}
    quotas: {producer_byte_rate: 200000}
  - entity: {user: <default>}
    quotas: {producer_byte_rate: 2000000, consumer_byte_rate: 1000000, controller_mutation_rate: 1}
  - entity: {user: tenant-1}
    quotas: {request_percentage: 0.01}
"""

PROPOSED = """
quotas:
  entities:
    - entity: {user: <default>, client-id: <default>}
      quotas: {producer_byte_rate: 150KB}
    - entity: {client-id: tenant-2-app}
      quotas: {consumer_byte_rate: 100000}
  window_num: 6
"""


# ------------------------------------------------------------------------------------------------- no Spark


def test_config_shapes_are_all_accepted():
    short = parse_quota_config(yaml.safe_load(LIVE))
    assert (NOISY_USER, None, "producer_byte_rate", 200000.0) in short.quotas
    assert ("<default>", None, "controller_mutation_rate", 1.0) in short.quotas
    full = parse_quota_config(yaml.safe_load(PROPOSED))
    assert full.windows == Windows(rate=Window(6, 1000))
    assert full.quotas[0] == ("<default>", "<default>", "producer_byte_rate", 150_000.0)
    store = full.store()
    assert store.get(QuotaEntity(DEFAULT, DEFAULT)) == {"producer_byte_rate": 150_000.0}
    bare = parse_quota_config([{"entity": {"client_id": "x"}, "quotas": {"consumer_byte_rate": "1MiB"}}])
    assert bare.quotas == ((None, "x", "consumer_byte_rate", 1048576.0),)
    assert parse_quota_config({"entities": []}).quotas == ()


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"quotas": [{"entity": {"user": "a"}, "quotas": {"producer_byte_rate": -1}}]}, "greater than 0"),
        ({"quotas": [{"entity": {"user": "a"}, "quotas": {"bogus": 1}}]}, "unknown quota key"),
        ({"quotas": [{"entity": {"ip": "1.2.3.4"}, "quotas": {"producer_byte_rate": 1}}]}, "unknown entity type"),
        ({"quotas": [{"entity": {}, "quotas": {"producer_byte_rate": 1}}]}, "empty"),
        ({"quotas": [{"entity": {"client-id": "c"}, "quotas": {"producer_ids_rate": 1}}]}, "KIP-936"),
        ({"quotas": [{"entity": {"user": "a"}, "quotas": {"producer_byte_rate": "fast"}}]}, "cannot read"),
        ({"quotas": [{"entity": {"user": "a"}, "quotas": {"producer_byte_rate": 1}}] * 2}, "listed twice"),
        ({"quotas": {"entities": [], "scope": "galaxy"}}, "scope"),
    ],
)
def test_config_errors_name_the_problem(doc, match):
    with pytest.raises(QuotaConfigError, match=match):
        parse_quota_config(doc)


def test_load_quota_config_file_errors(tmp_path):
    with pytest.raises(QuotaConfigError, match="missing.yaml"):
        load_quota_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("quotas: [")
    with pytest.raises(QuotaConfigError, match="not valid YAML"):
        load_quota_config(bad)


def test_budget_split_is_max_min_fair():
    from spark_analysis.job import _nice_ceil, split_budget

    assert split_budget({"a": 10, "b": 20, "c": 1000}, 100) == {"a": 10, "b": 20, "c": 70}
    fits = split_budget({"a": 10, "b": 30}, 80)  # leftovers pro rata
    assert fits == pytest.approx({"a": 20, "b": 60})
    assert _nice_ceil(1234.5, True) == 1300 and _nice_ceil(0.0123, False) == 0.013
    assert _budgets("produce=10MiB,fetch=1000") == {"produce": 10 * 2**20, "fetch": 1000.0}


# ------------------------------------------------------------------------------------------------- Spark


@pytest.fixture(scope="session")
def spark():
    from spark_analysis.job import build_spark

    s = build_spark("local[2]", "1g", shuffle_partitions=4)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def logged(tmp_path_factory):
    """A small log whose decisions the quota code made, written through DecisionLog into rotated Parquet."""
    config = parse_quota_config(yaml.safe_load(LIVE))
    traffic = small_traffic(6000, span_s=120)
    decided = list(ProxySimulator(config).run(traffic))
    d = tmp_path_factory.mktemp("decision-log")
    log = DecisionLog(d, "p1", rotate_bytes=20_000, row_group_rows=500, flush_interval=0.01)
    for i in range(0, len(decided), 500):
        for e in decided[i : i + 500]:
            assert log.emit(e)
        while log.queued:  # let the writer drain: several row groups and files
            time.sleep(0.005)
    log.close()
    assert log.written == len(decided) and log.files > 1
    return d, config, decided


def _expected_totals(decided):
    tot = defaultdict(lambda: {"throttled": 0, "throttle_ms": 0, "rejected_topics": 0, "requests": 0})
    for e in decided:
        t = tot[(e["user"], e["client_id"])]
        t["requests"] += 1
        t["throttle_ms"] += e["throttle_ms"]
        t["throttled"] += e["throttle_ms"] > 0
        t["rejected_topics"] += e["rejected_topics"]
    return tot


def test_job_names_the_throttled_entity_with_exact_totals_and_replay_matches(spark, logged, tmp_path):
    from spark_analysis.job import JobOptions, run

    d, config, decided = logged
    quotas_file = tmp_path / "live.yaml"
    quotas_file.write_text(LIVE)
    out = str(tmp_path / "out")
    result = run(
        spark,
        JobOptions(
            input=str(d),
            out=out,
            quotas=load_quota_config(quotas_file),
            quotas_path=str(quotas_file),
            budgets={"produce": 1_000_000},
        ),
    )
    expected = _expected_totals(decided)
    top = result.throttle_totals_top
    # the noisy tenant's two clients lead, with exactly the throttle totals the quota code produced
    assert set(top["user"].head(2)) == {NOISY_USER}
    for row in top.itertuples():
        exp = expected[(row.user, row.client_id)]
        assert (row.throttle_ms, row.throttled, row.rejected_topics, row.requests) == (
            exp["throttle_ms"],
            exp["throttled"],
            exp["rejected_topics"],
            exp["requests"],
        ), row
    assert sum(e["rejected_topics"] for e in decided) > 0  # the mutation quota rejected topics
    assert any(e.get("request_throttle_ms") for e in decided)  # and the request quota throttled
    assert result.overview["events"] == len(decided) and result.overview["missing_events"] == 0
    # replaying the live config reproduces every logged decision
    agreement = result.replay_agreement.set_index("kind")
    assert set(agreement.index) >= {"produce", "request", "mutation"}  # fetch: nobody near its quota, skipped
    skipped = result.overview["replay_skipped"]
    assert skipped["buckets"] > 0 and skipped["logged_throttled"] == 0  # skipped buckets were never throttled
    assert (agreement["identical"] == agreement["logged"]).all(), agreement
    assert (agreement["throttle_decision_differs"] == 0).all()
    # recommendations carry their reasoning; the budget split applies to users' produce
    rec = result.recommendations
    noisy = rec[(rec["level"] == "user") & (rec["user"] == NOISY_USER) & (rec["kind"] == "produce")].iloc[0]
    assert "p99 of" in noisy["reasoning"] and "cluster budget" in noisy["reasoning"]
    assert noisy["recommended"] >= noisy["pct_rate"]
    # outputs: Parquet tables and one self-contained HTML report with embedded plots
    for name in (
        "usage_1s",
        "throttle_totals",
        "latency",
        "usage_windows",
        "recommendations",
        "whatif_charges",
        "whatif_summary",
    ):
        assert spark.read.parquet(f"{out}/{name}").count() > 0, name
    with open(result.report_path, encoding="utf-8") as f:
        html = f.read()
    assert len(re.findall(r'src="data:image/png;base64,', html)) >= 4
    assert NOISY_USER in html and "<script" not in html and 'src="http' not in html
    assert os.path.getsize(result.report_path) < 5_000_000


def test_whatif_of_a_proposed_config_matches_direct_quota_code(spark, logged):
    from pyspark.sql import functions as F

    from spark_analysis.job import prepare, whatif
    from spark_analysis.schema import read_events

    d, _, decided = logged
    proposed = parse_quota_config(yaml.safe_load(PROPOSED))
    # the same traffic, decided directly by the quota code under the proposed config
    decision_keys = {
        f"{k}_{f}"
        for k in ("produce", "fetch", "request", "mutation", "pids")
        for f in ("value", "limit", "throttle_ms")
    } | {"throttle_ms", "action"}
    traffic = [{k: v for k, v in e.items() if k not in decision_keys} for e in decided]
    direct = {}
    for e in ProxySimulator(proposed).run(traffic):
        for kind in ("produce", "fetch"):
            if e.get(f"{kind}_throttle_ms") is not None:
                direct[(e["seq"], kind)] = e[f"{kind}_throttle_ms"]
    skipped: dict = {}
    replayed = whatif(spark, prepare(read_events(spark, str(d))), proposed, skipped=skipped)
    rows = replayed.select("seq", "kind", "throttle_ms", "bucket_user", "bucket_client_id", "limit").collect()
    got = {(r.seq, r.kind): r.throttle_ms for r in rows}
    assert got and set(got) <= set(direct)
    assert all(direct[k] == v for k, v in got.items())  # replayed charges: exactly the quota code's throttles
    assert all(v == 0 for k, v in direct.items() if k not in got)  # skipped (never over quota): throttle 0
    assert any(v > 0 for v in got.values())
    assert skipped["buckets"] > 0 and skipped["charges"] == len(direct) - len(got)
    # <default user, default client-id>: one bucket per (user, client-id) pair; client-id quota pools its users
    buckets = {(r.kind, r.bucket_user, r.bucket_client_id) for r in rows}
    assert ("produce", NOISY_USER, f"{NOISY_USER}-batch-0") in buckets
    assert ("fetch", "", "tenant-2-app") in buckets
    assert replayed.where(F.col("kind") == "fetch").select("client_id").distinct().count() == 1


def test_jsonl_logs_are_read_too(spark, tmp_path):
    from spark_analysis.schema import read_events

    log = DecisionLog(tmp_path, "pj", fmt="jsonl", flush_interval=0.01)
    for e in small_traffic(50, span_s=5):
        log.emit(e)
    log.close()
    df = read_events(spark, str(tmp_path))
    assert df.count() == 50
    assert df.where("user = 'noisy' or user like 'tenant-%'").count() == 50
