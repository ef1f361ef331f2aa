"""The analysis job: usage, throttles, latency, recommendations and the what-if replay, as Parquet + one HTML.

Stages (each logs a line; see :class:`spark_analysis.progress.Progress`):

1. overview        - event counts, time span, per-proxy ``seq`` gaps (events the writer dropped).
2. usage_1s        - per (user, client_id, second): amount charged per quota kind, requests, bytes, logged
                     limits and throttles. Written, then read back: every later usage figure comes from this
                     much smaller table instead of rescanning the raw log.
3. throttle_totals - per (user, client_id): decisions, throttled requests and time, rejects, mutes, shadow, and
                     the requests fair share held.
4. fair share      - per (proxy, broker): the episodes in which fair share limited a broker (saturated ..
                     released); per (user, client_id, broker): the requests it held and how long.
5. latency         - per API: upstream latency percentiles.
6. usage_windows   - per (user, client_id, kind, window): rate over ``window_s`` windows (Kafka measures over
                     11 x 1 s samples, so 10 s windows are what a quota sees; producer ids use their own window).
7. recommendations - per user and per (user, client_id) and kind: p-th percentile of windowed rate x headroom,
                     optional max-min fair split of a cluster budget; the reasoning is a column.
8. what-if replay  - (with a proposed config) every charge, grouped by bucket and time-ordered, through the
                     proxy's own quotas/ code in ``applyInPandas``; per-charge results and per-bucket totals.
9. report          - one self-contained HTML file.

Fair share's own events (``event`` "fair_share": a broker saturated or was released) belong to a broker, not to a
tenant: every stage but the overview and the fair-share stage reads :func:`traffic`, which leaves them out.

Nothing raw is collected to the driver: only aggregates bounded by the number of entities / plot bins.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from quotas.kinds import CLUSTER_WIDE_KEYS, FETCH, KINDS, SHARE_FETCH
from spark_analysis.progress import Progress
from spark_analysis.quota_config import KIND_KEYS, ReplayConfig
from spark_analysis.replay import (
    BY_ID_OUTPUT_SCHEMA,
    GROUP_COLUMNS,
    REPLAY_OUTPUT_SCHEMA,
    make_replay_fn,
    resolve_pairs,
)
from spark_analysis.schema import (
    FAIR_RELEASED,
    FAIR_SATURATED,
    FAIR_SHARE,
    QUOTA_KINDS,
    amount_column,
    read_events,
)

log = logging.getLogger("spark_analysis")

UNITS = {kind.name: kind.unit for kind in KINDS}


@dataclass
class JobOptions:
    """Everything the job needs besides the SparkSession; the CLI fills it."""

    input: str
    out: str
    fmt: str = "auto"
    quotas: ReplayConfig | None = None
    quotas_path: str | None = None
    window_s: int = 10
    percentile: float = 0.99
    headroom: float = 1.25
    budgets: dict[str, float] = field(default_factory=dict)
    top: int = 20
    report: bool = True


@dataclass
class JobResult:
    """Small aggregates (driver-side) plus where the tables went."""

    out: str
    overview: dict[str, Any]
    tables: dict[str, str]
    timings: list[tuple[str, float]]
    report_path: str | None
    throttle_totals_top: pd.DataFrame
    recommendations: pd.DataFrame
    whatif_summary: pd.DataFrame | None
    replay_agreement: pd.DataFrame | None
    fair_episodes: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Fair share's saturation episodes (the first :data:`FAIR_EPISODE_ROWS`, by broker and time)."""
    fair_brokers: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per (broker, proxy): its episodes, saturated seconds and held requests."""
    fair_held: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per (user, client_id, broker): the requests fair share held, by total wait (the first :data:`FAIR_HELD_ROWS`)."""


# ------------------------------------------------------------------------------------------------- session


def build_spark(
    master: str | None = "local[*]",
    driver_memory: str = "2g",
    shuffle_partitions: int | None = None,
    ui: bool = False,
    app_name: str = "kafka-throttle-proxy decision log",
    packages: list[str] | None = None,
) -> SparkSession:
    """A SparkSession tuned for this job (AQE on, Arrow for pandas, few shuffle partitions on a small master).

    Under ``spark-submit`` (``master`` None) the master and memory come from spark-submit's flags.
    """
    import sys

    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"  # plain `python -m spark_analysis`; under spark-submit its --master wins
    local = master is not None and master.startswith("local")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    repo = str(Path(__file__).resolve().parent.parent)
    if local:  # the Python workers run here: this interpreter and this checkout
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    # On a cluster the workers' own Python runs the executors (PYSPARK_PYTHON or spark.pyspark.python names
    # it) and ship_code sends the code: nothing may depend on this machine's paths.
    if shuffle_partitions is None:
        shuffle_partitions = max(4, 2 * (os.cpu_count() or 2))
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    if local:
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    if packages:  # fetched by Spark (Ivy) from Maven Central, for the driver and every executor
        builder = builder.config("spark.jars.packages", ",".join(packages))
    spark = (
        builder.appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "true" if ui else "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


EXECUTOR_PACKAGES = ("pandas", "pyarrow")
"""What executors import besides pyspark and the shipped code: the one line to install on Spark workers."""


def ship_code(spark: SparkSession) -> None:
    """Make ``quotas`` and ``spark_analysis`` importable on executors of a real cluster (a zip added with
    ``addPyFile``: nothing else of the repository is imported there), then check on an executor that they and
    :data:`EXECUTOR_PACKAGES` import, so a worker without them fails here with the package named instead of
    deep in the what-if replay. Local masters see the repository through PYTHONPATH already."""
    master = spark.sparkContext.master
    assert master is not None  # a running context has its master
    if master.startswith("local"):
        return
    import tempfile
    import zipfile

    repo = Path(__file__).resolve().parent.parent
    fd, zpath = tempfile.mkstemp(suffix=".zip", prefix="spark_analysis_")
    os.close(fd)
    with zipfile.ZipFile(zpath, "w") as z:
        for pkg in ("quotas", "spark_analysis"):
            for p in (repo / pkg).rglob("*.py"):
                z.write(p, p.relative_to(repo))
        # quotas/rate.py's decorator for the mypyc build (the executors run the .py files): one pure file
        import mypy_extensions

        z.write(mypy_extensions.__file__, "mypy_extensions.py")
    spark.sparkContext.addPyFile(zpath)

    def executor_missing(_: object) -> list[str]:  # nested: pickled by value, so the check imports nothing first
        import importlib

        missing = []
        for name in (*EXECUTOR_PACKAGES, "spark_analysis.replay"):
            try:
                importlib.import_module(name)
            except ImportError as exc:
                missing.append(f"{name} ({exc})")
        return missing

    missing = spark.sparkContext.parallelize([0], 1).map(executor_missing).collect()[0]
    if missing:
        raise RuntimeError(
            f"Spark executors on {master} cannot import {', '.join(missing)}: install "
            f"{' '.join(EXECUTOR_PACKAGES)} in the workers' Python (and pyspark of the cluster's "
            "version); the job ships its own code"
        )


# ------------------------------------------------------------------------------------------------- stages


def _write(df: DataFrame, out: str, name: str, tables: dict[str, str]) -> str:
    path = f"{out.rstrip('/')}/{name}"
    df.write.mode("overwrite").parquet(path)
    tables[name] = path
    return path


def prepare(events: DataFrame) -> DataFrame:
    """Adds ``sec`` and the per-kind ``{kind}_amt`` columns (logged value, else what would be charged)."""
    cols = [F.floor(F.col("ts_ms") / 1000).cast("long").alias("sec")]
    cols += [amount_column(k).alias(f"{k}_amt") for k in QUOTA_KINDS]
    return events.select("*", *cols)


def traffic(events: DataFrame) -> DataFrame:
    """The events that carry requests: all but fair share's state changes.

    Why: a ``fair_share`` event is a broker's (no user, ``requests`` 0, ``api_key`` -1). Left in, every
    per-entity table gains a null tenant, and :func:`spark_analysis.schema.amount_column`, which prices an
    ``api_key`` -1 summary's request time, charges that tenant a request's cost per state change (a null user in
    the usage, the recommendations and the replay). Requests fair share held are kept: they are traffic.
    """
    return events.where(~F.col("event").eqNullSafe(FAIR_SHARE))


def _fair_held() -> Column:
    """A request fair share held (a Produce or mutation waited, a Fetch was throttled) longer than any quota
    throttled it: the proxy logs those with action ``fair_share`` and the wait as ``throttle_ms``."""
    return (F.col("event") == "request") & (F.col("action") == FAIR_SHARE)


def overview(events: DataFrame) -> dict[str, Any]:
    """Counts over every event, fair share's state changes included: the per-proxy ``seq`` gaps need them all
    (the writer numbers them too); they carry no request, so ``requests`` is unchanged."""
    row = events.agg(
        F.count(F.lit(1)).alias("events"),
        F.sum(F.when(F.col("event") == "request", 1).otherwise(0)).alias("request_events"),
        F.sum(F.when(F.col("event") == "summary", 1).otherwise(0)).alias("summary_events"),
        F.sum(F.when(F.col("event") == FAIR_SHARE, 1).otherwise(0)).alias("fair_share_events"),
        F.sum(F.when(_fair_held(), 1).otherwise(0)).alias("fair_share_held"),
        F.sum("requests").alias("requests"),
        F.min("ts_ms").alias("first_ts_ms"),
        F.max("ts_ms").alias("last_ts_ms"),
        F.countDistinct("user").alias("users"),
        F.countDistinct("user", "client_id").alias("entities"),
        F.sum(F.when(F.col("shadow"), 1).otherwise(0)).alias("shadow_events"),
    ).first()
    ov = row.asDict() if row is not None else {}
    # per member of a fleet (or instance): its traffic and throttles, and the events its log is missing
    proxies: pd.DataFrame = (
        events.groupBy("proxy")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.min("seq").alias("min_seq"),
            F.max("seq").alias("max_seq"),
            F.sum("requests").alias("requests"),
            F.sum("bytes_in").alias("bytes_in"),
            F.sum("bytes_out").alias("bytes_out"),
            F.sum(F.when(F.col("throttle_ms") > 0, 1).otherwise(0)).alias("throttled"),
            F.sum(F.coalesce(F.col("throttle_ms"), F.lit(0))).alias("throttle_ms"),
            F.sum(F.when(F.col("action") == "reject", 1).otherwise(0)).alias("rejects"),
        )
        .withColumn("missing", F.greatest(F.lit(0), F.col("max_seq") - F.col("min_seq") + 1 - F.col("events")))
        .orderBy("proxy")
        .limit(1000)
        .toPandas()
    )
    ov["proxies"] = proxies
    ov["missing_events"] = int(proxies["missing"].fillna(0).sum()) if len(proxies) else 0
    return ov


def usage_per_second(events: DataFrame) -> DataFrame:
    events = traffic(events)
    aggs = [
        F.sum("requests").alias("requests"),
        F.count(F.lit(1)).alias("events"),
        F.sum("bytes_in").alias("bytes_in"),
        F.sum("bytes_out").alias("bytes_out"),
        F.sum(F.when(F.col("throttle_ms") > 0, 1).otherwise(0)).alias("throttled"),
        F.sum("throttle_ms").alias("throttle_ms"),
        F.sum("rejected_topics").alias("rejected_topics"),
    ]
    for k in QUOTA_KINDS:
        aggs += [
            F.sum(f"{k}_amt").alias(k),
            F.max(f"{k}_limit").alias(f"{k}_limit"),
            F.sum(f"{k}_throttle_ms").alias(f"{k}_throttle_ms"),
        ]
    return events.groupBy("user", "client_id", "sec").agg(*aggs)


def throttle_totals(events: DataFrame) -> DataFrame:
    """Per (user, client_id). ``throttled`` / ``throttle_ms`` count every request the proxy slowed, whatever the
    reason: a request fair share held is in them with its wait (the log's ``throttle_ms`` is the longest of the
    quotas' throttles and fair share's wait), and ``fair_share_held`` / ``fair_share_ms`` single those out, as the
    per-kind columns single out each quota's. A held request's quota columns keep the quota's own (shorter)
    throttle, so neither reason is lost, and ``throttle_ms`` stays what the client was made to wait."""
    events = traffic(events)
    act = F.col("action")
    held = _fair_held()
    aggs = [
        F.sum("requests").alias("requests"),
        F.sum(F.when(F.col("event") == "request", 1).otherwise(0)).alias("decisions"),
        F.sum(F.when(F.col("throttle_ms") > 0, 1).otherwise(0)).alias("throttled"),
        F.sum(F.coalesce(F.col("throttle_ms"), F.lit(0))).alias("throttle_ms"),
        F.max("throttle_ms").alias("max_throttle_ms"),
        F.sum(F.when(act == "reject", 1).otherwise(0)).alias("rejects"),
        F.sum(F.coalesce(F.col("rejected_topics"), F.lit(0))).alias("rejected_topics"),
        F.sum(F.when(act == "mute", 1).otherwise(0)).alias("mutes"),
        F.sum(F.when(F.col("shadow") & (act != "pass"), 1).otherwise(0)).alias("shadow_not_enforced"),
        F.sum(F.when(held, 1).otherwise(0)).alias("fair_share_held"),
        F.sum(F.when(held, F.coalesce(F.col("throttle_ms"), F.lit(0))).otherwise(0)).alias("fair_share_ms"),
        F.sum("bytes_in").alias("bytes_in"),
        F.sum("bytes_out").alias("bytes_out"),
    ]
    for k in QUOTA_KINDS:
        t = F.col(f"{k}_throttle_ms")
        aggs += [
            F.sum(F.when(t > 0, 1).otherwise(0)).alias(f"{k}_throttled"),
            F.sum(F.coalesce(t, F.lit(0))).alias(f"{k}_throttle_ms"),
        ]
    return events.groupBy("user", "client_id").agg(*aggs)


FAIR_EPISODE_ROWS = 5000
"""Episodes the driver collects for the report's timeline (the Parquet table has them all)."""
FAIR_HELD_ROWS = 200
"""(user, client_id, broker) rows of held requests the driver collects for the report, by total wait."""


def _fair_broker() -> Column:
    """The broker fair share acted on: ``fair_broker``; else the scope, which the proxy sets to the broker on its
    state changes (a held request whose tenant binding was gone by its answer is logged without fair columns)."""
    return F.coalesce(F.col("fair_broker"), F.col("scope"), F.lit("")).alias("broker")


def fair_share_held(events: DataFrame) -> DataFrame:
    """Per (user, client_id, broker): the requests fair share held (``fair_share`` action), their total and
    longest wait (``throttle_ms``), how many were Fetches (throttled at their answer rather than held before the
    broker saw them), how many in shadow mode (not enforced), and the range of the level they were paced at.

    Only requests whose longest reason was fair share are logged as such (the proxy writes one action per
    request); one a quota throttled longer counts in that quota's columns instead."""
    wait = F.coalesce(F.col("throttle_ms"), F.lit(0))
    return (
        events.where(_fair_held())
        .groupBy("user", "client_id", _fair_broker())
        .agg(
            F.count(F.lit(1)).alias("held"),
            F.sum(wait).alias("wait_ms"),
            F.max(wait).alias("max_wait_ms"),
            F.sum(F.when(F.col("api_key").isin(FETCH, SHARE_FETCH), 1).otherwise(0)).alias("fetches"),
            F.sum(F.when(F.col("shadow"), 1).otherwise(0)).alias("shadow"),
            F.min("fair_level").alias("level_min"),
            F.max("fair_level").alias("level_max"),
            F.min("ts_ms").alias("first_ts_ms"),
            F.max("ts_ms").alias("last_ts_ms"),
        )
    )


def fair_share_episodes(events: DataFrame) -> DataFrame:
    """Per (proxy, broker): each episode in which fair share limited the broker, from its ``saturated`` event to
    the ``released`` that follows it, with the limit and level at saturation (``*_first``), their range over the
    episode (the saturation and every request held in it: nothing else logs them), the delay, baseline, target and
    tenants at saturation, and the requests held in it.

    Per proxy because each proxy instance runs its own fair share (a fleet's members may each limit the same
    broker). Events are taken in the order the proxy logged them (``seq``, then time; in one millisecond a
    saturation before what it held, a release after), and a held request belongs to the episode it was logged in:
    one answered just after the release is in none. Incomplete episodes are kept, with a null end or start: a
    saturation not released when the log ends (or followed by another saturation: a restart or a dropped event),
    and a release whose saturation predates the log (requests held before it are counted to it).
    """
    is_fair = (F.col("event") == FAIR_SHARE) & F.col("action").isin(FAIR_SATURATED, FAIR_RELEASED)
    rows = events.where(is_fair | _fair_held()).select(
        F.coalesce(F.col("proxy"), F.lit("")).alias("proxy"),
        _fair_broker(),
        "ts_ms",
        "seq",
        F.when(is_fair, F.col("action")).alias("boundary"),
        _fair_held().alias("is_held"),
        F.when(is_fair & (F.col("action") == FAIR_SATURATED), 0).when(is_fair, 2).otherwise(1).alias("tie"),
        "fair_limit",
        "fair_level",
        "fair_delay_ms",
        "fair_baseline_ms",
        "fair_target_ms",
        "fair_tenants",
        "throttle_ms",
        "user",
        "client_id",
        "shadow",
    )
    order = Window.partitionBy("proxy", "broker").orderBy("seq", "ts_ms", "tie")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    after = order.rowsBetween(1, Window.unboundedFollowing)
    b, held = F.col("boundary"), F.col("is_held")
    sat, rel = b == FAIR_SATURATED, b == FAIR_RELEASED
    marked = (
        rows.withColumn("bid", F.when(b.isNotNull(), F.row_number().over(order)))
        .withColumn("prev", F.last("boundary", ignorenulls=True).over(before))
        .withColumn("prev_bid", F.last("bid", ignorenulls=True).over(before))
        .withColumn("next", F.first("boundary", ignorenulls=True).over(after))
        .withColumn("next_bid", F.first("bid", ignorenulls=True).over(after))
    )
    # An episode is named by its saturation's row number, or by its release's when the saturation is not logged.
    after_sat = F.col("prev") == FAIR_SATURATED
    episode = (
        F.when(sat, F.col("bid"))
        .when(rel & after_sat, F.col("prev_bid"))
        .when(rel, F.col("bid"))
        .when(held & after_sat, F.col("prev_bid"))
        .when(held & (F.col("next") == FAIR_RELEASED), F.col("next_bid"))
    )
    limited = sat | held  # a release logs limit 0: not part of the range

    def at_saturation(col: str) -> Column:
        return F.max(F.when(sat, F.col(col)))

    eps = (
        marked.withColumn("episode", episode)
        .where(F.col("episode").isNotNull())
        .groupBy("proxy", "broker", "episode")
        .agg(
            at_saturation("ts_ms").alias("saturated_ts_ms"),
            F.max(F.when(rel, F.col("ts_ms"))).alias("released_ts_ms"),
            at_saturation("next").alias("next_after_saturation"),
            at_saturation("fair_limit").alias("limit_first"),
            F.min(F.when(limited, F.col("fair_limit"))).alias("limit_min"),
            F.max(F.when(limited, F.col("fair_limit"))).alias("limit_max"),
            at_saturation("fair_level").alias("level_first"),
            F.min(F.when(limited, F.col("fair_level"))).alias("level_min"),
            F.max(F.when(limited, F.col("fair_level"))).alias("level_max"),
            at_saturation("fair_delay_ms").alias("delay_ms"),
            at_saturation("fair_baseline_ms").alias("baseline_ms"),
            at_saturation("fair_target_ms").alias("target_ms"),
            at_saturation("fair_tenants").alias("tenants"),
            F.sum(F.when(held, 1).otherwise(0)).alias("held"),
            F.sum(F.when(held, F.coalesce(F.col("throttle_ms"), F.lit(0))).otherwise(0)).alias("held_ms"),
            # "\x1f": no user or client id is expected to hold it, so two tenants cannot join into one
            F.countDistinct(F.when(held, F.concat_ws("\x1f", "user", "client_id"))).alias("held_tenants"),
            F.max(F.when(b.isNotNull(), F.col("shadow").cast("int"))).alias("shadow"),
        )
    )
    start, end = F.col("saturated_ts_ms"), F.col("released_ts_ms")
    ending = (
        F.when(start.isNull(), F.lit("released; saturated before the log begins"))
        .when(end.isNotNull(), F.lit("released"))
        .when(
            F.col("next_after_saturation") == FAIR_SATURATED,
            F.lit("saturated again with no release logged (a proxy restart or dropped events)"),
        )
        .otherwise(F.lit("still saturated at the end of the log"))
    )
    return eps.select(
        "proxy",
        "broker",
        "saturated_ts_ms",
        "released_ts_ms",
        ((end - start) / 1000.0).alias("duration_s"),
        ending.alias("ending"),
        "limit_first",
        "limit_min",
        "limit_max",
        "level_first",
        "level_min",
        "level_max",
        "delay_ms",
        "baseline_ms",
        "target_ms",
        "tenants",
        "held",
        "held_ms",
        "held_tenants",
        (F.col("shadow") > 0).alias("shadow"),
    )


def fair_share_brokers(episodes: DataFrame) -> DataFrame:
    """Per (broker, proxy), from :func:`fair_share_episodes`: episodes, the seconds of the complete ones (an
    episode with no logged start or end has no duration: ``incomplete`` counts them), the limit's range, the
    worst delay at a saturation and the requests held."""
    return episodes.groupBy("broker", "proxy").agg(
        F.count(F.lit(1)).alias("episodes"),
        F.sum("duration_s").alias("saturated_s"),
        F.sum(F.when(F.col("duration_s").isNull(), 1).otherwise(0)).alias("incomplete"),
        F.min("limit_min").alias("limit_min"),
        F.max("limit_max").alias("limit_max"),
        F.max("delay_ms").alias("max_delay_ms"),
        F.sum("held").alias("held"),
        F.sum("held_ms").alias("held_ms"),
        F.min(F.coalesce(F.col("saturated_ts_ms"), F.col("released_ts_ms"))).alias("first_ts_ms"),
    )


def latency(events: DataFrame) -> DataFrame:
    req = events.where((F.col("event") == "request") & F.col("upstream_ms").isNotNull())
    q = F.percentile_approx("upstream_ms", [0.5, 0.9, 0.99, 0.999], 2000)
    return (
        req.groupBy("api_key")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.avg("upstream_ms").alias("mean_ms"),
            q.alias("q"),
            F.max("upstream_ms").alias("max_ms"),
        )
        .select(
            "api_key",
            "requests",
            "mean_ms",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p90_ms"),
            F.col("q")[2].alias("p99_ms"),
            F.col("q")[3].alias("p999_ms"),
            "max_ms",
        )
        .orderBy("api_key")
    )


def _long_usage(usage_1s: DataFrame) -> DataFrame:
    """usage_1s (wide) -> (user, client_id, sec, kind, amount, limit, throttle_ms), only where amount > 0."""
    rows = ", ".join(f"'{k}', `{k}`, `{k}_limit`, `{k}_throttle_ms`" for k in QUOTA_KINDS)
    stack = f"stack({len(QUOTA_KINDS)}, {rows}) as (kind, amount, limit, kind_throttle_ms)"
    return usage_1s.select("user", "client_id", "sec", F.expr(stack)).where(
        F.col("amount").isNotNull() & (F.col("amount") > 0)
    )


def usage_windows(usage_1s: DataFrame, window_s: int, pid_window_s: int) -> DataFrame:
    long = _long_usage(usage_1s)
    w = F.when(F.col("kind") == "pids", F.lit(pid_window_s)).otherwise(F.lit(window_s))
    return (
        long.withColumn("window_s", w)
        .withColumn("window_start", (F.floor(F.col("sec") / F.col("window_s")) * F.col("window_s")).cast("long"))
        .groupBy("user", "client_id", "kind", "window_s", "window_start")
        # producer_ids_rate is a count per window (KIP-936, quotas/manager.py), the others per second
        .agg(
            F.when(F.first("kind") == "pids", F.sum("amount"))
            .otherwise(F.sum("amount") / F.first("window_s"))
            .alias("rate"),
            F.max("limit").alias("limit"),
            F.sum("kind_throttle_ms").alias("throttle_ms"),
        )
    )


def recommendations(windows: DataFrame, percentile: float, headroom: float) -> DataFrame:
    """Per user (all client ids) and per (user, client_id), per kind: percentile of windowed rate x headroom."""
    per_user = (
        windows.groupBy("user", "kind", "window_s", "window_start")
        .agg(F.sum("rate").alias("rate"), F.max("limit").alias("limit"))
        .withColumn("client_id", F.lit(None).cast("string"))
        .withColumn("level", F.lit("user"))
    )
    per_pair = windows.select(
        "user", "kind", "window_s", "window_start", "rate", "limit", "client_id", F.lit("user+client-id").alias("level")
    )
    both = per_user.unionByName(per_pair)
    q = F.percentile_approx("rate", [0.5, percentile], 5000)
    agg = both.groupBy("level", "user", "client_id", "kind", "window_s").agg(
        F.count(F.lit(1)).alias("active_windows"),
        q.alias("q"),
        F.max("rate").alias("peak_rate"),
        F.avg("rate").alias("mean_rate"),
        F.max("limit").alias("current_limit"),
    )
    return agg.select(
        "level",
        "user",
        "client_id",
        "kind",
        "window_s",
        "active_windows",
        F.col("q")[0].alias("p50_rate"),
        F.col("q")[1].alias("pct_rate"),
        "peak_rate",
        "mean_rate",
        "current_limit",
    )


def _nice_ceil(x: float, integral: bool) -> float:
    """Round up to 2 significant digits (a quota an operator can read), integral for byte rates."""
    if x <= 0 or not math.isfinite(x):
        return 1.0
    mag = 10 ** (math.floor(math.log10(x)) - 1)
    v = math.ceil(x / mag - 1e-9) * mag
    return float(math.ceil(v)) if integral else float(f"{v:.6g}")


def split_budget(demands: dict[str, float], budget: float) -> dict[str, float]:
    """Max-min fair split: nobody gets more than they need while someone needs more; leftovers go pro rata.

    Why max-min: a proportional split lets one noisy tenant's demand shrink everyone else's share; max-min
    first satisfies the small tenants in full and caps the big ones at an equal share of what remains.
    """
    out: dict[str, float] = {}
    remaining = budget
    left = sorted(demands.items(), key=lambda kv: kv[1])
    n = len(left)
    for i, (name, demand) in enumerate(left):
        share = remaining / (n - i)
        give = min(demand, share)
        out[name] = give
        remaining -= give
    total = sum(demands.values())
    if remaining > 1e-9 and total > 0:
        for name, demand in demands.items():
            out[name] += remaining * demand / total
    return out


def finish_recommendations(
    rec: pd.DataFrame, percentile: float, headroom: float, budgets: dict[str, float]
) -> pd.DataFrame:
    """Driver side, over the aggregate only: the recommended value, a budget share and the reasoning text."""
    if rec.empty:
        return rec.assign(recommended=[], budget_share=[], reasoning=[])
    pct = f"p{percentile * 100:g}"
    recommended: list[float] = []
    reasons: list[str] = []
    shares: list[float | None] = []
    for r in rec.itertuples(index=False):
        integral = r.kind in ("produce", "fetch")
        value = _nice_ceil(r.pct_rate * headroom, integral)
        recommended.append(value)
        unit = UNITS[r.kind]
        text = (
            f"{pct} of {r.active_windows} active {r.window_s}s windows = {r.pct_rate:,.4g} {unit} "
            f"(median {r.p50_rate:,.4g}, peak {r.peak_rate:,.4g}); x{headroom:g} headroom -> {value:,.6g} {unit}"
        )
        if r.current_limit is not None and not pd.isna(r.current_limit):
            ratio = r.peak_rate / r.current_limit if r.current_limit else float("inf")
            text += f"; current limit {r.current_limit:,.6g} (peak is {ratio:.2f}x of it)"
        reasons.append(text)
        shares.append(None)
    out = rec.assign(recommended=recommended, reasoning=reasons, budget_share=shares)
    for kind, budget in budgets.items():
        mask = (out["level"] == "user") & (out["kind"] == kind)
        demands = dict(zip(out.loc[mask, "user"], out.loc[mask, "recommended"], strict=True))
        if not demands:
            continue
        split = split_budget(demands, budget)
        total = sum(demands.values())
        for idx in out.index[mask]:
            user = out.at[idx, "user"]
            share = split[user]
            out.at[idx, "budget_share"] = float(math.floor(share)) if kind in ("produce", "fetch") else share
            verdict = "fits" if total <= budget else "capped (max-min fair)"
            out.at[idx, "reasoning"] += (
                f"; cluster budget {budget:,.6g} {UNITS[kind]} over {len(demands)} users "
                f"(total demand {total:,.6g}): {verdict} -> {share:,.6g}"
            )
    return out.sort_values(["level", "kind", "pct_rate"], ascending=[True, True, False]).reset_index(drop=True)


# ------------------------------------------------------------------------------------------------- replay


def charges(events: DataFrame, kinds: list[str], cluster_scope: bool) -> DataFrame:
    """Events -> one row per (event, kind) with something to charge, with the time the proxy charges it at."""
    events = traffic(events)  # fair share's state changes charge nobody
    parts = []
    for k in kinds:
        # Produce bytes, request time, new producer ids and mutations are charged when the request arrives; fetch
        # bytes when the response does (quotas.kinds: each kind's ``at``). req_ts_ms is that first time when logged.
        when_col = "ts_ms" if any(x.name == k and x.at == "response" for x in KINDS) else None
        ts = F.col("ts_ms") if when_col else F.coalesce(F.col("req_ts_ms"), F.col("ts_ms"))
        amt = F.col(f"{k}_amt")
        # Zero amounts are replayed too: the proxy charges 0 (e.g. Fetch's request time) and still checks.
        cond = amt.isNotNull()
        if k == "mutation":
            # Only requests that met the bucket: something charged, a topic rejected, or per-topic counts known
            # (validate-only requests the proxy leaves free log no mutation_value and 0 mutations).
            cond = cond & (
                (amt > 0)
                | (F.coalesce(F.col("rejected_topics"), F.lit(0)) > 0)
                | F.coalesce(F.size("topic_partitions") > 0, F.lit(False))
            )
        parts.append(
            events.where(cond).select(
                F.coalesce(F.col("proxy"), F.lit("")).alias("proxy"),  # bucket columns are join keys: never null
                # One bucket per entity across the cluster for the keys Kafka enforces at the controller
                # (quotas.manager.bucket_scope), whichever broker's scope the event was logged under.
                (
                    F.lit("")
                    if cluster_scope or KIND_KEYS[k] in CLUSTER_WIDE_KEYS
                    else F.coalesce(F.col("scope"), F.lit(""))
                ).alias("scope"),
                F.lit(k).alias("kind"),
                "user",
                F.coalesce(F.col("client_id"), F.lit("")).alias("client_id"),
                ts.alias("charge_ts_ms"),
                "ts_ms",
                F.coalesce(F.col("seq"), F.lit(0)).alias("seq"),
                "event",
                amt.alias("amount"),
                "api_key",
                "api_version",
                "topic_partitions",
                F.col(f"{k}_throttle_ms").alias("logged_throttle_ms"),
                F.col(f"{k}_limit").alias("logged_limit"),
            )
        )
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


REPLAY_TASKS = 16
"""Least number of replay tasks; the job writes the replay with AQE's partition coalescing off."""


def whatif(
    spark: SparkSession,
    events: DataFrame,
    config: ReplayConfig,
    *,
    prefilter: bool = True,
    skipped: dict[str, Any] | None = None,
) -> DataFrame:
    """Per-charge replay of ``config`` (a lazy DataFrame with :data:`REPLAY_OUTPUT_SCHEMA`).

    ``prefilter``: rate buckets that provably never exceed their quota are not fed through Python (see
    :func:`at_risk_buckets`); their charges are left out of the result (their throttle is 0). ``skipped``, when
    given, receives the count of skipped buckets and charges and how many of those had a logged throttle.
    """
    kinds = [k for k, key in KIND_KEYS.items() if key in config.quota_keys()]
    if not kinds:
        return spark.createDataFrame([], REPLAY_OUTPUT_SCHEMA)
    pairs = events.select("user", F.coalesce(F.col("client_id"), F.lit("")).alias("client_id")).distinct()

    def resolve(batches):
        for pdf in batches:
            rows = resolve_pairs(list(zip(pdf["user"], pdf["client_id"], strict=True)), config)
            yield pd.DataFrame(rows, columns=["user", "client_id", "kind", "bucket_user", "bucket_client_id", "limit"])

    resolved = pairs.mapInPandas(
        resolve, "user string, client_id string, kind string, bucket_user string, bucket_client_id string, limit double"
    )
    ch = charges(events, kinds, config.scope == "cluster")
    joined = ch.join(F.broadcast(resolved), ["user", "client_id", "kind"])
    group = list(GROUP_COLUMNS)
    # One row per bucket (aggregates, a few thousand at most): collected once, so the bucket test is not
    # computed a second time, and each bucket gets a number to travel under (see make_replay_fn).
    if prefilter:
        rows = at_risk_buckets(joined, config).select(*group, "at_risk", "charges", "logged_throttled").collect()
        if skipped is not None:
            safe = [r for r in rows if not r["at_risk"]]
            skipped.update(
                {
                    "buckets": len(safe),
                    "charges": sum(int(r["charges"]) for r in safe),
                    "logged_throttled": sum(int(r["logged_throttled"] or 0) for r in safe),
                }
            )
        rows = [r for r in rows if r["at_risk"]]
    else:
        rows = joined.select(*group).distinct().collect()
    buckets = {i: tuple(r[c] for c in group) for i, r in enumerate(rows)}
    ids = spark.createDataFrame(
        [(i, *keys) for i, keys in buckets.items()], "bucket_id long, " + ", ".join(f"{c} string" for c in group)
    )
    slim = joined.join(F.broadcast(ids), group).drop(*group, "limit")
    # Many small tasks rather than AQE's few big ones: a bucket's replay is CPU in Python, so two coalesced
    # partitions left one core idle while the other finished the larger half.
    tasks = max(REPLAY_TASKS, 4 * spark.sparkContext.defaultParallelism)
    replayed = (
        slim.repartition(tasks, "bucket_id")
        .groupBy("bucket_id")
        .applyInPandas(make_replay_fn(config, buckets), BY_ID_OUTPUT_SCHEMA)
    )
    columns = [c.split(" ")[0] for c in REPLAY_OUTPUT_SCHEMA.split(", ")]
    return replayed.join(F.broadcast(ids), "bucket_id").select(*columns)


def at_risk_buckets(joined: DataFrame, config: ReplayConfig) -> DataFrame:
    """Buckets whose replay could throttle; the others provably never do, so Python need not replay them.

    Why it is sound (Kafka's ``SampledRate``, which ``quotas.rate`` reproduces): the rate is ``total / window``
    with ``window >= (samples - 1) * w``, and every live sample's events fall in the last ``(samples + 1) * w``
    (a sample lives until ``samples * w`` after its last event and spans at most ``w``). Binned by ``w``, that
    span touches at most ``samples + 2`` bins. So if every run of ``samples + 2`` consecutive bins carries at most
    ``quota * (samples - 1) * w``, no charge can see a rate above the quota, and every throttle is 0. Applied to
    the byte rates and the request quota only: token buckets (mutations) and producer ids (whose quota is per
    window, with its own cap) are always replayed - they are rare.
    """
    w = config.windows

    def per_kind(attr: str):  # each kind's window family, from the catalogue
        expr = None
        for kind in KINDS:
            value = F.lit(getattr(getattr(w, kind.window), attr))
            is_kind = F.col("kind") == kind.name
            expr = F.when(is_kind, value) if expr is None else expr.when(is_kind, value)
        return expr

    kind_w, kind_n = per_kind("size_ms"), per_kind("samples")
    group = list(GROUP_COLUMNS)
    binned = (
        joined.withColumn("w", kind_w)
        .withColumn("n", kind_n)
        .withColumn("bin", F.floor(F.col("charge_ts_ms") / F.col("w")).cast("long"))
        .groupBy(*group, "bin")
        .agg(
            F.sum("amount").alias("amount"),
            F.first("w").alias("w"),
            F.first("n").alias("n"),
            F.max("limit").alias("limit"),
            F.count(F.lit(1)).alias("charges"),
            F.sum(F.when(F.col("logged_throttle_ms") > 0, 1).otherwise(0)).alias("logged_throttled"),
        )
    )
    # (samples + 2) bins = the current bin and the (samples + 1) before it. One span for every kind: using the
    # larger sample count only widens the sum, which keeps the test sound (more buckets replayed, never fewer).
    span = max(getattr(w, kind.window).samples for kind in KINDS) + 1
    win = Window.partitionBy(*group).orderBy("bin").rangeBetween(-span, 0)
    rolled = binned.withColumn("run", F.sum("amount").over(win))
    return (
        rolled.groupBy(*group)
        .agg(
            F.max("run").alias("max_run"),
            F.first("w").alias("w"),
            F.first("n").alias("n"),
            F.max("limit").alias("limit"),
            F.sum("charges").alias("charges"),
            F.sum("logged_throttled").alias("logged_throttled"),
        )
        .withColumn(
            "at_risk",
            F.col("kind").isin("mutation", "pids")
            | (F.col("max_run") > F.col("limit") * (F.col("n") - 1) * F.col("w") / 1000.0 * 0.999),
        )
    )


def whatif_summaries(replayed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Per bucket and kind: replayed vs logged throttles; and the agreement table (replay == log, per kind)."""
    summary = (
        replayed.groupBy("kind", "bucket_user", "bucket_client_id")
        .agg(
            F.count(F.lit(1)).alias("charges"),
            F.sum("amount").alias("amount"),
            F.max("limit").alias("limit"),
            F.sum(F.when(F.col("throttle_ms") > 0, 1).otherwise(0)).alias("throttled"),
            F.sum("throttle_ms").alias("throttle_ms"),
            F.max("throttle_ms").alias("max_throttle_ms"),
            F.sum("rejected_topics").alias("rejected_topics"),
            F.sum(F.when(F.col("logged_throttle_ms") > 0, 1).otherwise(0)).alias("logged_throttled"),
            F.sum(F.coalesce(F.col("logged_throttle_ms"), F.lit(0))).alias("logged_throttle_ms"),
            F.countDistinct("user", "client_id").alias("clients"),
            F.min("ts_ms").alias("first_ts_ms"),
            F.max("ts_ms").alias("last_ts_ms"),
        )
        .withColumn("throttled_pct", F.col("throttled") * 100.0 / F.col("charges"))
    )
    logged = F.col("logged_throttle_ms").isNotNull() & (F.col("event") == "request")
    agreement = replayed.groupBy("kind").agg(
        F.count(F.lit(1)).alias("charges"),
        F.sum(F.when(logged, 1).otherwise(0)).alias("logged"),
        F.sum(F.when(logged & (F.col("throttle_ms") == F.col("logged_throttle_ms")), 1).otherwise(0)).alias(
            "identical"
        ),
        F.sum(F.when(logged & ((F.col("throttle_ms") > 0) != (F.col("logged_throttle_ms") > 0)), 1).otherwise(0)).alias(
            "throttle_decision_differs"
        ),
    )
    return summary, agreement


# ------------------------------------------------------------------------------------------------- driver


def run(spark: SparkSession, opts: JobOptions) -> JobResult:
    """Run every stage; returns the driver-side aggregates (the report is written unless ``opts.report`` is off)."""
    t0 = time.monotonic()
    tables: dict[str, str] = {}
    out = opts.out.rstrip("/")
    if "://" not in out:
        Path(out).mkdir(parents=True, exist_ok=True)
    total = 8 + (1 if opts.quotas else 0) + (1 if opts.report else 0)
    prog = Progress(spark.sparkContext, total)
    ship_code(spark)
    pid_window_s = max(1, round(opts.quotas.windows.pids.size_ms / 1000)) if opts.quotas else 3600
    try:
        events = prepare(read_events(spark, opts.input, opts.fmt))
        with prog.stage("overview"):
            ov = overview(events)
            log.info(
                "  %s events (%s requests) from %s users / %s (user, client-id) pairs; %s missing (seq gaps)",
                ov.get("events"),
                ov.get("requests"),
                ov.get("users"),
                ov.get("entities"),
                ov["missing_events"],
            )
            if len(ov["proxies"]):  # per member: what each proxy of a fleet carried and throttled
                spark.createDataFrame(ov["proxies"]).coalesce(1).write.mode("overwrite").parquet(f"{out}/proxies")
                tables["proxies"] = f"{out}/proxies"
        with prog.stage("usage per entity per second"):
            _write(usage_per_second(events), out, "usage_1s", tables)
            usage_1s = spark.read.parquet(tables["usage_1s"])
        with prog.stage("throttle and rejection totals"):
            _write(throttle_totals(events), out, "throttle_totals", tables)
            totals = spark.read.parquet(tables["throttle_totals"])
            top = (
                totals.orderBy(F.desc("throttle_ms"), F.desc("rejected_topics"), F.desc("bytes_in"))
                .limit(opts.top)
                .toPandas()
            )
        with prog.stage("fair share episodes and held tenants"):
            _write(fair_share_episodes(events), out, "fair_share_episodes", tables)
            episodes = spark.read.parquet(tables["fair_share_episodes"])
            fair_brokers: pd.DataFrame = fair_share_brokers(episodes).orderBy("broker", "proxy").toPandas()
            fair_episodes: pd.DataFrame = (
                episodes.orderBy("broker", "proxy", F.coalesce(F.col("saturated_ts_ms"), F.col("released_ts_ms")))
                .limit(FAIR_EPISODE_ROWS)
                .toPandas()
            )
            _write(fair_share_held(events), out, "fair_share_held", tables)
            fair_held: pd.DataFrame = (
                spark.read.parquet(tables["fair_share_held"])
                .orderBy(F.desc("wait_ms"), F.desc("held"), "user", "client_id", "broker")
                .limit(FAIR_HELD_ROWS)
                .toPandas()
            )
            log.info(
                "  fair share: %d saturation episodes on %d brokers; %d (tenant, broker) pairs held",
                int(fair_brokers["episodes"].sum()) if len(fair_brokers) else 0,
                fair_brokers["broker"].nunique() if len(fair_brokers) else 0,
                spark.read.parquet(tables["fair_share_held"]).count(),
            )
        with prog.stage("latency per API"):
            _write(latency(events), out, "latency", tables)
            lat = spark.read.parquet(tables["latency"]).orderBy("api_key").toPandas()
        with prog.stage(f"usage over {opts.window_s}s windows"):
            _write(usage_windows(usage_1s, opts.window_s, pid_window_s), out, "usage_windows", tables)
            windows = spark.read.parquet(tables["usage_windows"])
        with prog.stage("recommendations"):
            rec_raw = recommendations(windows, opts.percentile, opts.headroom).toPandas()
            rec = finish_recommendations(rec_raw, opts.percentile, opts.headroom, opts.budgets)
            if len(rec):  # a short log can have no window to recommend from (Spark cannot type an empty frame)
                spark.createDataFrame(rec.astype({"budget_share": "float64"})).coalesce(1).write.mode(
                    "overwrite"
                ).parquet(f"{out}/recommendations")
                tables["recommendations"] = f"{out}/recommendations"
        with prog.stage("plot data"):
            from spark_analysis import report as report_mod

            plots = report_mod.plot_data(spark, usage_1s, windows, top, ov, opts)
        summary_pd: pd.DataFrame | None = None
        agreement_pd: pd.DataFrame | None = None
        if opts.quotas:
            with prog.stage("what-if replay through quotas/"):
                skipped: dict[str, Any] = {}
                replayed = whatif(spark, events, opts.quotas, skipped=skipped)
                log.info(
                    "  %s buckets (%s charges) provably never over quota: not replayed (%s had a logged throttle)",
                    skipped.get("buckets"),
                    skipped.get("charges"),
                    skipped.get("logged_throttled"),
                )
                ov["replay_skipped"] = skipped
                coalesce = spark.conf.get("spark.sql.adaptive.coalescePartitions.enabled")
                spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
                try:
                    _write(replayed, out, "whatif_charges", tables)
                finally:
                    if coalesce is None:  # it had no value: leave it without one again
                        spark.conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
                    else:
                        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", coalesce)
                replayed = spark.read.parquet(tables["whatif_charges"])
                summary, agreement = whatif_summaries(replayed)
                _write(summary, out, "whatif_summary", tables)
                summary_pd = (
                    spark.read.parquet(tables["whatif_summary"])
                    .orderBy(F.desc("throttle_ms"), F.desc("rejected_topics"))
                    .limit(200)
                    .toPandas()
                )
                agreement_pd = agreement.orderBy("kind").toPandas()
                plots["whatif_bins"] = report_mod.whatif_bins(replayed, summary_pd, ov, opts)
                # The ignore: mypy leaves the pandas class pyspark's toPandas() is annotated with unresolved (an
                # unknown type, not Any: pandas has no stubs here), and the assignment above narrowed summary_pd to it.
                log.info(
                    "  replay: %d buckets, %d throttled charges",
                    len(summary_pd),
                    int(summary_pd["throttled"].sum()) if len(summary_pd) else 0,  # type: ignore[index]
                )
        report_path = None
        if opts.report:
            with prog.stage("HTML report"):
                fair = {"episodes": fair_episodes, "brokers": fair_brokers, "held": fair_held}
                report_path = report_mod.write_report(
                    out, ov, top, lat, rec, summary_pd, agreement_pd, plots, opts, tables, fair
                )
                log.info("  report: %s", report_path)
    finally:
        prog.close()
    log.info("done in %.1f s; tables in %s", time.monotonic() - t0, out)
    return JobResult(
        out,
        ov,
        tables,
        prog.timings,
        report_path,
        top,
        rec,
        summary_pd,
        agreement_pd,
        fair_episodes,
        fair_brokers,
        fair_held,
    )
