"""spark_analysis: config loading, recommendations maths, and the job over a small log written by DecisionLog.

The decisions in the log are made by the proxy's own quota code (``ProxySimulator`` drives QuotaManager the way
proxy/rules/policy.py does), so the checks are: the job names the throttled entity with exactly those totals, and the
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


# ------------------------------------------------------------------------------------------------- fair share

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _request(ms, user, client, *, api=0, action="pass", throttle=0, scope="broker 1", values=None, fair=None):
    """A request event exactly as the proxy builds it (quotas.decision_events.request_event)."""
    from quotas.decision_events import request_event

    return request_event(
        ts_ms=T0 + ms,
        req_ts_ms=T0 + ms,
        conn=f"c-{client}",
        user=user,
        client_id=client,
        api_key=api,
        api_version=9,
        bytes_in=1000,
        bytes_out=100 if api == 0 else 5000,
        mutations=0,
        new_pids=0,
        upstream_ms=2.0,
        action=action,
        throttle_ms=throttle,
        shadow=False,
        rejected_topics=0,
        scope=scope,
        topic_partitions=None,
        values=values or {},
        fair=fair,
    )


def _held(ms, user, client, broker, wait, limit, level, *, api=0, values=None):
    """A request fair share held ``wait`` ms on ``broker`` (the columns proxy/rules/decision_recording.py fills)."""
    fair = {"fair_broker": broker, "fair_limit": limit, "fair_level": level, "fair_delay_ms": 3.0}
    return _request(
        ms, user, client, api=api, action="fair_share", throttle=wait, scope=broker, values=values, fair=fair
    )


def _fair(ms, broker, action, limit=0.0, level=0.0, delay=0.0):
    from quotas.decision_events import fair_share_event

    return fair_share_event(
        ts_ms=T0 + ms,
        broker=broker,
        action=action,
        limit=limit,
        level=level,
        delay_ms=delay,
        baseline_ms=2.0,
        target_ms=1.0,
        tenants=3,
        shadow=False,
    )


def fair_share_log() -> list[dict]:
    """Three brokers: broker 1 saturates for 30 s and holds two of the noisy tenant's clients; broker 2 saturates
    for 5 s, then again until the log ends, and holds tenant-1; broker 3 is released 5 s in (saturated before the
    log began) after holding tenant-3 once. tenant-2 is throttled by its quota only. In the proxy's emit order."""
    events = [
        _held(3_000, "tenant-3", "tenant-3-app", "broker 3", 50, 1e6, 2e5),
        _fair(5_000, "broker 3", "released"),
        _fair(10_000, "broker 1", "saturated", 5e6, 1e6, 3.5),
        _held(12_000, NOISY_USER, "noisy-batch-0", "broker 1", 100, 5e6, 1.0e6),
        _held(15_000, NOISY_USER, "noisy-batch-0", "broker 1", 200, 4e6, 0.8e6),
        _fair(20_000, "broker 2", "saturated", 3e6, 5e5, 2.0),
        _held(20_000, NOISY_USER, "noisy-batch-0", "broker 1", 300, 4.5e6, 0.9e6),
        _fair(25_000, "broker 2", "released"),
        _held(25_000, NOISY_USER, "noisy-batch-1", "broker 1", 250, 4.2e6, 0.85e6, api=1),
        # fair share held it longer than its quota throttled it: logged as fair share's, with the quota's own column
        _held(
            30_000,
            NOISY_USER,
            "noisy-batch-0",
            "broker 1",
            400,
            6e6,
            1.2e6,
            values={"producer_byte_rate": (1e3, 5e2, 150)},
        ),
        _held(38_000, NOISY_USER, "noisy-batch-0", "broker 1", 500, 5.5e6, 1.1e6),
        _fair(40_000, "broker 1", "released"),
        _fair(60_000, "broker 2", "saturated", 2e6, 4e5, 4.0),
        _held(62_000, "tenant-1", "tenant-1-app", "broker 2", 700, 2e6, 4e5),
    ]
    for i in range(3):
        quota = {"producer_byte_rate": (1e3, 5e2, 200)}
        events.append(_request(45_000 + i, "tenant-2", "tenant-2-app", action="throttle", throttle=200, values=quota))
    for s in range(0, 80, 2):
        events.append(_request(s * 1000 + 1, "tenant-1", "tenant-1-app", api=1, scope="broker 2"))
        events.append(_request(s * 1000 + 2, NOISY_USER, "noisy-batch-0"))
    events.sort(key=lambda e: e["ts_ms"])  # stable: the order above within a millisecond
    return events


def _write_log(directory, events, fmt="parquet"):
    log = DecisionLog(directory, "p1", fmt=fmt, flush_interval=0.01)
    for e in events:
        assert log.emit(e)
    log.close()
    assert log.written == len(events)


def test_fair_share_episodes_and_held_tenants(spark, tmp_path):
    from spark_analysis.job import JobOptions, run

    events = fair_share_log()
    _write_log(tmp_path / "log", events)
    result = run(spark, JobOptions(input=str(tmp_path / "log"), out=str(tmp_path / "out"), top=50))

    ep = result.fair_episodes
    got = {
        (r.broker, r.saturated_ts_ms, r.released_ts_ms): r
        for r in ep.astype(object).where(ep.notna(), None).itertuples()
    }
    assert set(got) == {
        ("broker 1", T0 + 10_000, T0 + 40_000),
        ("broker 2", T0 + 20_000, T0 + 25_000),
        ("broker 2", T0 + 60_000, None),  # still saturated when the log ends
        ("broker 3", None, T0 + 5_000),  # saturated before the log begins
    }, ep
    b1 = got[("broker 1", T0 + 10_000, T0 + 40_000)]
    assert b1.proxy == "p1" and b1.duration_s == 30.0 and b1.delay_ms == 3.5 and b1.tenants == 3
    assert (b1.limit_first, b1.limit_min, b1.limit_max) == (5e6, 4e6, 6e6)
    assert (b1.level_first, b1.level_min, b1.level_max) == (1e6, 0.8e6, 1.2e6)
    assert (b1.held, b1.held_ms, b1.held_tenants) == (6, 1750, 2)
    b2 = got[("broker 2", T0 + 20_000, T0 + 25_000)]
    assert (b2.duration_s, b2.limit_first, b2.limit_min, b2.limit_max, b2.held) == (5.0, 3e6, 3e6, 3e6, 0)
    b2_open = got[("broker 2", T0 + 60_000, None)]
    assert b2_open.duration_s is None and "end of the log" in b2_open.ending
    assert (b2_open.limit_first, b2_open.level_first, b2_open.held, b2_open.held_ms) == (2e6, 4e5, 1, 700)
    b3 = got[("broker 3", None, T0 + 5_000)]
    assert b3.duration_s is None and "before the log" in b3.ending and (b3.held, b3.held_ms) == (1, 50)

    brokers = result.fair_brokers.set_index("broker")
    assert brokers.loc["broker 1", "episodes"] == 1 and brokers.loc["broker 2", "episodes"] == 2
    assert brokers.loc["broker 1", "saturated_s"] == 30.0 and brokers.loc["broker 2", "saturated_s"] == 5.0

    held = result.fair_held
    rows = [(r.user, r.client_id, r.broker, r.held, r.wait_ms, r.max_wait_ms, r.fetches) for r in held.itertuples()]
    assert rows == [  # sorted by total wait
        (NOISY_USER, "noisy-batch-0", "broker 1", 4 + 1, 1500, 500, 0),
        ("tenant-1", "tenant-1-app", "broker 2", 1, 700, 700, 0),
        (NOISY_USER, "noisy-batch-1", "broker 1", 1, 250, 250, 1),
        ("tenant-3", "tenant-3-app", "broker 3", 1, 50, 50, 0),
    ]

    # Fair share's state changes count no request and belong to no tenant; its held requests are throttles of
    # their own (fair_share_*), beside the quota kinds'.
    ov = result.overview
    requests = [e for e in events if e["event"] == "request"]
    assert ov["events"] == len(events) and ov["fair_share_events"] == 6
    assert ov["request_events"] == ov["requests"] == len(requests) and ov["fair_share_held"] == 8
    assert ov["users"] == 4 and ov["entities"] == 5
    totals = spark.read.parquet(result.tables["throttle_totals"]).toPandas()
    assert totals["user"].notna().all() and len(totals) == 5
    noisy = totals.set_index("client_id").loc["noisy-batch-0"]
    assert (noisy["decisions"], noisy["requests"]) == (5 + 40, 5 + 40)
    assert (noisy["throttled"], noisy["throttle_ms"], noisy["max_throttle_ms"]) == (5, 1500, 500)
    assert (noisy["fair_share_held"], noisy["fair_share_ms"], noisy["produce_throttle_ms"]) == (5, 1500, 150)
    quota_only = totals.set_index("client_id").loc["tenant-2-app"]
    assert (quota_only["throttle_ms"], quota_only["fair_share_held"], quota_only["fair_share_ms"]) == (600, 0, 0)
    usage = spark.read.parquet(result.tables["usage_1s"])
    assert usage.where("user is null").count() == 0
    assert usage.agg({"requests": "sum"}).first()[0] == len(requests)
    assert not result.recommendations["user"].isna().any()
    for name in ("fair_share_episodes", "fair_share_held"):
        assert spark.read.parquet(result.tables[name]).count() > 0, name

    with open(result.report_path, encoding="utf-8") as f:
        html = f.read()
    assert "Fair share: saturation episodes" in html and "Fair share: who was held back" in html
    assert "noisy-batch-1" in html and "broker 3" in html and "<script" not in html


def test_fair_share_sections_on_logs_without_fair_columns(spark, tmp_path):
    """Logs from before fair share: JSON lines without the fair_* keys at all, Parquet files without the columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quotas.decision_events import arrow_schema
    from spark_analysis.job import JobOptions, fair_share_episodes, fair_share_held, prepare, run
    from spark_analysis.schema import read_events

    decided = list(ProxySimulator(parse_quota_config(yaml.safe_load(LIVE))).run(small_traffic(300, span_s=20)))
    _write_log(tmp_path / "json", decided, fmt="jsonl")
    text = "".join(p.read_text() for p in (tmp_path / "json").rglob("*.jsonl"))
    assert "fair_" not in text
    result = run(spark, JobOptions(input=str(tmp_path / "json"), out=str(tmp_path / "out")))
    assert result.fair_episodes.empty and result.fair_held.empty and result.fair_brokers.empty
    assert result.overview["fair_share_events"] == 0 and result.overview["fair_share_held"] == 0
    assert (result.throttle_totals_top["fair_share_held"] == 0).all()
    assert result.throttle_totals_top["throttle_ms"].sum() > 0
    with open(result.report_path, encoding="utf-8") as f:
        html = f.read()
    assert "no fair-share events" in html

    old = pa.schema([f for f in arrow_schema() if not f.name.startswith("fair_")])
    (tmp_path / "parquet").mkdir()
    rows = {f.name: [e.get(f.name) for e in decided] for f in old}
    pq.write_table(pa.table(rows, schema=old), tmp_path / "parquet" / "old.parquet")
    events = prepare(read_events(spark, str(tmp_path / "parquet")))
    assert events.count() == len(decided)
    assert fair_share_episodes(events).count() == 0 and fair_share_held(events).count() == 0


def test_synthetic_fair_share_makes_complete_episodes_and_holds_only_the_noisy_tenant(spark, tmp_path):
    from pyspark.sql import functions as F

    from spark_analysis.job import fair_share_episodes, fair_share_held, overview, prepare, throttle_totals
    from spark_analysis.schema import read_events
    from spark_analysis.synthetic import generate

    plain = generate(tmp_path / "plain", 5_000, span_s=600, n_users=10, seed=5)
    assert plain["fair_share_events"] == plain["fair_share_held"] == 0  # off by default: the log is as before
    info = generate(tmp_path / "fair", 20_000, span_s=600, n_users=10, seed=5, fair_share=True)
    assert info["fair_share_events"] >= 2 and info["fair_share_held"] > 0
    events = prepare(read_events(spark, str(tmp_path / "fair")))
    ov = overview(events)
    assert ov["events"] == info["events"] == 20_000 + info["fair_share_events"]
    assert ov["fair_share_events"] == info["fair_share_events"] and ov["missing_events"] == 0  # seq has no gap
    episodes = fair_share_episodes(events).toPandas()
    assert len(episodes) == info["fair_share_events"] // 2
    assert (episodes["ending"] == "released").all() and (episodes["duration_s"] > 20).all()
    assert (episodes["limit_min"] <= episodes["limit_first"]).all()
    assert (episodes["limit_first"] <= episodes["limit_max"]).all()
    assert episodes["held"].sum() == info["fair_share_held"]  # every held request inside its episode
    held = fair_share_held(events).toPandas()
    assert set(held["user"]) == {NOISY_USER} and held["held"].sum() == info["fair_share_held"]
    totals = throttle_totals(events).where(F.col("user") == NOISY_USER).toPandas()
    assert totals["fair_share_held"].sum() == info["fair_share_held"]
