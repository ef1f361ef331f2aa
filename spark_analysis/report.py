"""The self-contained HTML report: tables plus matplotlib plots embedded as base64 PNG (one file to mail around).

Plot data is aggregated in Spark first (a handful of entities x a few hundred time bins); only that reaches the
driver.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
import numbers
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_analysis.quota_config import KIND_KEYS

API_NAMES = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    17: "SaslHandshake",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
    21: "DeleteRecords",
    22: "InitProducerId",
    23: "OffsetForLeaderEpoch",
    24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn",
    26: "EndTxn",
    28: "TxnOffsetCommit",
    29: "DescribeAcls",
    30: "CreateAcls",
    31: "DeleteAcls",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    35: "DescribeLogDirs",
    36: "SaslAuthenticate",
    37: "CreatePartitions",
    42: "DeleteGroups",
    44: "IncrementalAlterConfigs",
    47: "OffsetDelete",
    48: "DescribeClientQuotas",
    49: "AlterClientQuotas",
    60: "DescribeCluster",
    61: "DescribeProducers",
    65: "DescribeTransactions",
    66: "ListTransactions",
    68: "ConsumerGroupHeartbeat",
    69: "ConsumerGroupDescribe",
    71: "GetTelemetrySubscriptions",
    72: "PushTelemetry",
}

MAX_SERIES = 6
HEATMAP_ROWS = 20
HEATMAP_BINS = 60
SERIES_BINS = 400
EPISODE_TABLE_ROWS = 200


def _label(user: Any, client: Any) -> str:
    c = "" if client is None or (isinstance(client, float) and math.isnan(client)) else str(client)
    return f"{user} / {c}" if c else f"{user} / *"


def _span(ov: dict[str, Any]) -> tuple[int, int]:
    first = ov.get("first_ts_ms") or 0
    last = ov.get("last_ts_ms") or first
    return int(first // 1000), int(last // 1000) + 1


def _dominant_kind(row: pd.Series) -> str:
    best, kind = 0, None
    for k in KIND_KEYS:
        v = row.get(f"{k}_throttle_ms")
        if v is not None and not pd.isna(v) and v > best:
            best, kind = v, k
    if kind:
        return kind
    return "produce" if (row.get("bytes_in") or 0) >= (row.get("bytes_out") or 0) else "fetch"


def plot_data(
    spark: SparkSession, usage_1s: DataFrame, windows: DataFrame, top: pd.DataFrame, ov: dict[str, Any], opts
) -> dict[str, Any]:
    """Aggregates for the plots: usage-vs-quota series for the top entities, and the throttle heatmap."""
    first, last = _span(ov)
    span = max(last - first, 1)
    out: dict[str, Any] = {"first_sec": first, "last_sec": last}
    if top.empty:
        out["series"], out["heatmap"] = [], pd.DataFrame()
        return out
    # Usage vs quota: the top entities, each with the quota kind that throttled it most.
    picks = []
    for _, row in top.head(MAX_SERIES).iterrows():
        picks.append((row["user"], row["client_id"], _dominant_kind(row)))
    bin_s = max(int(opts.window_s), math.ceil(span / SERIES_BINS))
    sel = spark.createDataFrame(pd.DataFrame(picks, columns=["user", "client_id", "kind"]))
    kind_expr = F.expr("CASE kind " + " ".join(f"WHEN '{k}' THEN `{k}`" for k in KIND_KEYS) + " END")
    limit_expr = F.expr("CASE kind " + " ".join(f"WHEN '{k}' THEN `{k}_limit`" for k in KIND_KEYS) + " END")
    thr_expr = F.expr("CASE kind " + " ".join(f"WHEN '{k}' THEN `{k}_throttle_ms`" for k in KIND_KEYS) + " END")
    series: pd.DataFrame = (
        usage_1s.join(F.broadcast(sel), ["user", "client_id"])
        .withColumn("bin", ((F.col("sec") - first) / bin_s).cast("long"))
        .groupBy("user", "client_id", "kind", "bin")
        .agg(
            (F.sum(kind_expr) / bin_s).alias("rate"),
            F.max(limit_expr).alias("limit"),
            F.sum(thr_expr).alias("throttle_ms"),
        )
        .toPandas()
    )
    store = opts.quotas.store() if opts.quotas else None
    out["series"] = []
    for user, client, kind in picks:
        s = series[(series["user"] == user) & (series["client_id"] == client) & (series["kind"] == kind)]
        proposed = None
        if store is not None:
            r = store.resolve(user, client, KIND_KEYS[kind])
            proposed = r.limit if r is not None else None
        out["series"].append(
            {
                "user": user,
                "client_id": client,
                "kind": kind,
                "bin_s": bin_s,
                "data": s.sort_values("bin"),
                "proposed": proposed,
            }
        )
    # Throttle heatmap: logged throttle time per entity per time bin.
    hbin = max(1, math.ceil(span / HEATMAP_BINS))
    throttled = top[top["throttle_ms"].fillna(0) > 0].head(HEATMAP_ROWS)
    if throttled.empty:
        out["heatmap"] = pd.DataFrame()
    else:
        hs = spark.createDataFrame(throttled[["user", "client_id"]].reset_index(drop=True))
        hm: pd.DataFrame = (
            usage_1s.join(F.broadcast(hs), ["user", "client_id"])
            .withColumn("bin", ((F.col("sec") - first) / hbin).cast("long"))
            .groupBy("user", "client_id", "bin")
            .agg(F.sum("throttle_ms").alias("throttle_ms"))
            .toPandas()
        )
        hm["entity"] = [_label(u, c) for u, c in zip(hm["user"], hm["client_id"], strict=True)]
        out["heatmap"] = hm.pivot_table(index="entity", columns="bin", values="throttle_ms", aggfunc="sum")
        out["heatmap_bin_s"] = hbin
    return out


def whatif_bins(replayed: DataFrame, summary: pd.DataFrame, ov: dict[str, Any], opts) -> pd.DataFrame:
    """Replayed throttle time per bucket per time bin, for the top buckets (a heatmap)."""
    if summary is None or summary.empty:
        return pd.DataFrame()
    first, last = _span(ov)
    hbin = max(1, math.ceil(max(last - first, 1) / HEATMAP_BINS))
    top = summary[summary["throttle_ms"].fillna(0) > 0].head(HEATMAP_ROWS)
    if top.empty:
        return pd.DataFrame()
    spark = replayed.sparkSession
    sel = spark.createDataFrame(top[["kind", "bucket_user", "bucket_client_id"]].reset_index(drop=True))
    hm: pd.DataFrame = (
        replayed.join(F.broadcast(sel), ["kind", "bucket_user", "bucket_client_id"])
        .withColumn("bin", ((F.floor(F.col("ts_ms") / 1000) - first) / hbin).cast("long"))
        .groupBy("kind", "bucket_user", "bucket_client_id", "bin")
        .agg(F.sum("throttle_ms").alias("throttle_ms"))
        .toPandas()
    )
    hm["entity"] = [
        f"{k}: {_label(u, c)}" for k, u, c in zip(hm["kind"], hm["bucket_user"], hm["bucket_client_id"], strict=True)
    ]
    piv = hm.pivot_table(index="entity", columns="bin", values="throttle_ms", aggfunc="sum")
    piv.attrs["bin_s"] = hbin
    return piv


# ------------------------------------------------------------------------------------------------- rendering


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return '<img alt="plot" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def _fmt_time(sec: int) -> str:
    return dt.datetime.fromtimestamp(sec, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _series_figure(series: list[dict[str, Any]], first: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series)
    cols = 2 if n > 1 else 1
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 2.8 * rows), squeeze=False)
    for ax, s in zip(axes.flat, series, strict=False):
        d = s["data"]
        x = (d["bin"] * s["bin_s"]) / 60.0
        ax.plot(x, d["rate"], lw=1, label=f"usage ({s['bin_s']}s bins)")
        lim = d["limit"].dropna()
        if len(lim):
            ax.axhline(lim.max(), color="red", lw=1, label=f"logged limit {lim.max():,.4g}")
        if s["proposed"] is not None:
            ax.axhline(s["proposed"], color="green", ls="--", lw=1, label=f"proposed {s['proposed']:,.4g}")
        thr = d["throttle_ms"].fillna(0) > 0
        if thr.any():
            ax.scatter(x[thr], d["rate"][thr], s=6, color="orange", label="throttled", zorder=3)
        ax.set_title(f"{_label(s['user'], s['client_id'])} - {s['kind']}", fontsize=9)
        ax.set_xlabel(f"minutes since {_fmt_time(first)}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper right")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def _heatmap_figure(piv: pd.DataFrame, bin_s: int, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    piv = piv.reindex(columns=range(int(piv.columns.min()), int(piv.columns.max()) + 1)).fillna(0)
    piv = piv.loc[piv.sum(axis=1).sort_values(ascending=False).index]
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(piv) + 1.5))
    im = ax.imshow(np.log10(piv.to_numpy() / 1000.0 + 1), aspect="auto", cmap="magma_r", interpolation="nearest")
    ax.set_yticks(range(len(piv)), piv.index, fontsize=7)
    ax.set_xlabel(f"time bin ({bin_s} s each)", fontsize=8)
    ax.set_title(title, fontsize=9)
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("log10(throttle seconds + 1)", fontsize=7)
    fig.tight_layout()
    return fig


def _bar_figure(
    labels: list[str],
    values: list[float],
    title: str,
    xlabel: str,
    second: list[float] | None = None,
    second_label: str | None = None,
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(9, 0.3 * len(labels) + 1.5))
    y = np.arange(len(labels))
    if second is None:
        ax.barh(y, values, color="tab:red")
    else:
        ax.barh(y - 0.2, values, height=0.4, color="tab:red", label="replayed")
        ax.barh(y + 0.2, second, height=0.4, color="tab:gray", label=second_label)
        ax.legend(fontsize=7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _fair_timeline_figure(episodes: pd.DataFrame, first: int, last: int):
    """One row per (broker, proxy), a bar per saturation episode. An episode with no logged start or end is drawn
    to the log's edge, pale and hatched: it lasted at least that long."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sorted({(b, p) for b, p in zip(episodes["broker"], episodes["proxy"], strict=True)})
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(rows) + 1.6))
    y = {r: i for i, r in enumerate(rows)}
    for e in episodes.itertuples(index=False):
        start, end = e.saturated_ts_ms, e.released_ts_ms
        complete = not (pd.isna(start) or pd.isna(end))
        x0 = (first if pd.isna(start) else start / 1000.0) - first
        x1 = (last if pd.isna(end) else end / 1000.0) - first
        ax.broken_barh(
            [(x0 / 60.0, max(x1 - x0, 0.5) / 60.0)],
            (y[(e.broker, e.proxy)] - 0.35, 0.7),
            facecolors="tab:red" if complete else "mistyrose",
            edgecolor="tab:red",
            hatch=None if complete else "//",
            lw=0.5,
        )
    multi = len({p for _, p in rows}) > 1  # a fleet: say which member's fair share it was
    ax.set_yticks(range(len(rows)), [f"{b} ({p})" if multi else b for b, p in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(last - first, 1) / 60.0)
    ax.set_xlabel(f"minutes since {_fmt_time(first)}", fontsize=8)
    ax.set_title("Fair share: when each broker was limited", fontsize=9)
    handles = [Patch(facecolor="tab:red", label="saturated .. released")]
    if episodes["saturated_ts_ms"].isna().any() or episodes["released_ts_ms"].isna().any():
        handles.append(
            Patch(facecolor="mistyrose", edgecolor="tab:red", hatch="//", label="start or end not in the log")
        )
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def _with_times(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``df`` with epoch-ms columns shown as UTC times (the raw ms stay in the Parquet tables)."""
    df = df.copy()
    for ms, label in columns.items():
        df[label] = ["" if pd.isna(v) else _fmt_time(int(v) // 1000) for v in df[ms]]
    return df


def _fair_share_sections(fair: dict[str, pd.DataFrame] | None, first: int, last: int) -> list[str]:
    """The report's two fair-share sections (issue 48): the brokers' saturation episodes, and who was held."""
    episodes = fair.get("episodes") if fair else None
    brokers = fair.get("brokers") if fair else None
    held = fair.get("held") if fair else None
    none = episodes is None or episodes.empty
    if none and (held is None or held.empty):
        return [
            "<h2>Fair share</h2><p><i>no fair-share events: fair share was off, never limited a broker, or the "
            "log predates it</i></p>"
        ]
    parts = [
        "<h2>Fair share: saturation episodes</h2><p class='note'>When a broker's answers slowed down, the "
        "proxy's fair share limited the work it admits to that broker (<code>limit</code>, bytes/s) and paced "
        "each heavy tenant at <code>level</code> (bytes/s) until it was released. One row per episode and "
        "proxy instance (each instance limits on its own). <code>*_first</code> and the delay, baseline, target "
        "and tenants are those at the saturation; min and max range over the saturation and the requests held "
        "in the episode (nothing else logs the limit as it moves). <code>held</code>: requests held in it, "
        "<code>held_ms</code> their total wait. An episode whose start or end is not in the log has no "
        "duration: it lasted at least to the log's edge.</p>"
    ]
    if brokers is not None and not brokers.empty:
        parts.append(
            "<h3>Per broker</h3>"
            + _table(_with_times(brokers, {"first_ts_ms": "first"}).drop(columns=["first_ts_ms"]), 200)
        )
    if not none:
        assert episodes is not None  # for mypy: none is False
        parts.append(_png(_fair_timeline_figure(episodes, first, last)))
        shown = _with_times(episodes, {"saturated_ts_ms": "saturated", "released_ts_ms": "released"})
        cols = [
            "broker",
            "proxy",
            "saturated",
            "released",
            "duration_s",
            "ending",
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
            "shadow",
        ]
        total = int(brokers["episodes"].sum()) if brokers is not None and not brokers.empty else len(episodes)
        if total > EPISODE_TABLE_ROWS:
            parts.append(
                f"<p class='note'>{total:,} episodes; the first {EPISODE_TABLE_ROWS} by broker and time below "
                "(all of them in the <code>fair_share_episodes</code> table).</p>"
            )
        parts.append(_table(shown[[c for c in cols if c in shown.columns]], EPISODE_TABLE_ROWS))
    parts.append(
        "<h2>Fair share: who was held back</h2><p class='note'>Per (user, client-id) and broker: the requests "
        "fair share held (a Produce or a topic mutation waited before the broker saw it; a Fetch, counted in "
        "<code>fetches</code>, was throttled at its answer), their total and longest wait, by total wait. A "
        "request a quota throttled longer than fair share held it is logged, and counted, as the quota's. These "
        "waits are also in the offenders' <code>throttle_ms</code> (its <code>fair_share_ms</code> part). "
        "<code>shadow</code>: would have been held (fair share not enforced).</p>"
    )
    if held is not None and not held.empty:
        bars = held[held["wait_ms"].fillna(0) > 0].head(HEATMAP_ROWS)
        if not bars.empty:
            parts.append(
                _png(
                    _bar_figure(
                        [
                            f"{_label(u, c)} @ {b}"
                            for u, c, b in zip(bars["user"], bars["client_id"], bars["broker"], strict=True)
                        ],
                        list(bars["wait_ms"] / 1000.0),
                        "Time held by fair share",
                        "seconds",
                    )
                )
            )
        shown = _with_times(held, {"first_ts_ms": "first", "last_ts_ms": "last"})
        hcols = [
            "user",
            "client_id",
            "broker",
            "held",
            "wait_ms",
            "max_wait_ms",
            "fetches",
            "shadow",
            "level_min",
            "level_max",
            "first",
            "last",
        ]
        parts.append(_table(shown[hcols], 100))
    else:
        parts.append("<p><i>nobody was held</i></p>")
    return parts


def _table(df: pd.DataFrame, max_rows: int = 50) -> str:
    if df is None or df.empty:
        return "<p><i>none</i></p>"
    df = df.head(max_rows).copy()
    for col in df.columns:
        df[col] = [_cell(v) for v in df[col]]
    return df.to_html(index=False, border=0, classes="t")


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    if isinstance(v, float):
        return f"{v:,.0f}" if v.is_integer() and abs(v) < 1e15 else f"{v:,.4g}"
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return f"{int(v):,}"
    return str(v)


_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ccc;margin-top:28px}
table.t{border-collapse:collapse;font-size:12px}table.t td,table.t th{padding:3px 8px;border-bottom:1px solid #eee;
text-align:right}table.t th{background:#f4f4f4}table.t td:first-child,table.t th:first-child{text-align:left}
.note{color:#555;font-size:13px}img{max-width:100%}
"""


def write_report(
    out: str,
    ov: dict[str, Any],
    top: pd.DataFrame,
    lat: pd.DataFrame,
    rec: pd.DataFrame,
    whatif: pd.DataFrame | None,
    agreement: pd.DataFrame | None,
    plots: dict[str, Any],
    opts,
    tables: dict[str, str],
    fair: dict[str, pd.DataFrame] | None = None,
) -> str:
    """Render ``report.html`` in ``out`` (local paths; for remote outputs it is written to the local cwd).
    ``fair``: fair share's ``episodes``, ``brokers`` and ``held`` tables (:mod:`spark_analysis.job`)."""
    e = html.escape
    first, last = plots["first_sec"], plots["last_sec"]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Decision log analysis</title>"
        f"<style>{_CSS}</style></head><body><h1>kafka-throttle-proxy: decision log analysis</h1>"
    ]
    parts.append(
        f"<p class='note'>Input <code>{e(opts.input)}</code>; {_fmt_time(first)} to {_fmt_time(last)} "
        f"({(last - first) / 60:.1f} min). Generated {_fmt_time(int(dt.datetime.now(dt.UTC).timestamp()))}."
        "</p>"
    )
    ovt = pd.DataFrame(
        [
            {
                k: ov.get(k)
                for k in (
                    "events",
                    "request_events",
                    "summary_events",
                    "fair_share_events",
                    "requests",
                    "users",
                    "entities",
                    "shadow_events",
                    "fair_share_held",
                    "missing_events",
                )
            }
        ]
    )
    parts.append("<h2>Overview</h2>" + _table(ovt))
    if ov.get("missing_events"):
        parts.append(
            f"<p class='note'>{ov['missing_events']:,} events are missing (gaps in <code>seq</code>): the "
            "proxy's decision-log queue was full and dropped them. Totals below undercount by that much.</p>"
        )
    parts.append("<h3>Per proxy instance</h3>" + _table(ov.get("proxies"), 100))

    parts.append(
        "<h2>Top offenders (logged decisions)</h2><p class='note'><code>throttled</code> and "
        "<code>throttle_ms</code> count every request the proxy slowed and for how long, whether a quota "
        "throttled it or fair share held it (<code>fair_share_held</code>, <code>fair_share_ms</code>: the "
        "requests whose longest wait was fair share's).</p>"
    )
    if not top.empty and top["throttle_ms"].fillna(0).sum() > 0:
        t = top[top["throttle_ms"].fillna(0) > 0]
        parts.append(
            _png(
                _bar_figure(
                    [_label(u, c) for u, c in zip(t["user"], t["client_id"], strict=True)],
                    list(t["throttle_ms"] / 1000.0),
                    "Total throttle time (logged)",
                    "seconds",
                )
            )
        )
    cols = [
        "user",
        "client_id",
        "requests",
        "decisions",
        "throttled",
        "throttle_ms",
        "max_throttle_ms",
        "rejects",
        "rejected_topics",
        "mutes",
        "shadow_not_enforced",
        "fair_share_held",
        "fair_share_ms",
        "bytes_in",
        "bytes_out",
    ]
    parts.append(_table(top[[c for c in cols if c in top.columns]] if not top.empty else top))

    parts.append(
        "<h2>Usage vs quota over time</h2><p class='note'>Per (user, client-id) usage of the quota kind "
        "that throttled it most. A quota shared by several client ids (a <code>&lt;user&gt;</code> quota) "
        "is measured over their sum, so one client's line can sit below the limit while the bucket is "
        "over it. Red: limit the proxy logged; green dashed: the proposed config.</p>"
    )
    if plots.get("series"):
        parts.append(_png(_series_figure(plots["series"], first)))
    else:
        parts.append("<p><i>no traffic</i></p>")

    parts.append("<h2>Throttle heatmap (logged)</h2>")
    hm = plots.get("heatmap")
    if hm is not None and not hm.empty:
        parts.append(_png(_heatmap_figure(hm, plots["heatmap_bin_s"], "Throttle time per entity and time bin")))
    else:
        parts.append("<p><i>nothing was throttled</i></p>")

    parts.extend(_fair_share_sections(fair, first, last))

    parts.append("<h2>Upstream latency per API</h2>")
    if lat is not None and not lat.empty:
        lat = lat.copy()
        lat.insert(
            1,
            "api",
            [API_NAMES.get(int(k), f"api {k}") if k is not None and k >= 0 else "summary" for k in lat["api_key"]],
        )
    parts.append(_table(lat, 100))

    parts.append(
        f"<h2>Quota recommendations</h2><p class='note'>Recommended quota = p{opts.percentile * 100:g} of "
        f"the windowed rate ({opts.window_s} s windows; the producer-id rate uses its own window) x "
        f"{opts.headroom:g} headroom, rounded up to two significant digits. Percentiles are over windows in "
        "which the entity was active (idle windows would only lower them). Traffic that was throttled "
        "was already slowed, so for throttled entities this measures the throttled demand.</p>"
    )
    rcols = [
        "level",
        "user",
        "client_id",
        "kind",
        "active_windows",
        "pct_rate",
        "peak_rate",
        "current_limit",
        "recommended",
        "budget_share",
        "reasoning",
    ]
    parts.append(_table(rec[[c for c in rcols if c in rec.columns]] if rec is not None and not rec.empty else rec, 200))

    if opts.quotas is not None:
        parts.append(
            f"<h2>What-if replay of <code>{e(str(opts.quotas_path))}</code></h2>"
            "<p class='note'>Every logged charge, grouped by proxy, scope, quota kind and bucket, in time "
            "order, fed through the proxy's own <code>quotas/</code> code (QuotaManager, SampledRate, "
            "TokenBucket, admit). Clients that would have been throttled would also have sent less, so a "
            "stricter config is judged on unthrottled traffic (pessimistic).</p>"
        )
        parts.append("<h3>Proposed quotas</h3>" + _table(pd.DataFrame(opts.quotas.describe()), 200))
        sk = ov.get("replay_skipped") or {}
        if sk.get("buckets"):
            parts.append(
                f"<p class='note'>{sk['buckets']:,} rate buckets ({sk.get('charges', 0):,} charges) never "
                "came near their proposed quota - in no run of window_num + 2 sample windows did they "
                "carry quota x (window_num - 1) windows' worth - so they cannot be throttled and were not "
                f"replayed ({sk.get('logged_throttled', 0):,} of those charges had a logged throttle).</p>"
            )
        if agreement is not None and not agreement.empty:
            parts.append(
                "<h3>Replay vs logged decisions</h3><p class='note'>Replaying the config that was live "
                "should reproduce the logged throttles (identical = same throttle_ms).</p>" + _table(agreement)
            )
        if whatif is not None and not whatif.empty:
            w = whatif[whatif["throttle_ms"].fillna(0) > 0].head(25)
            if not w.empty:
                labels = [
                    f"{k}: {_label(u, c)}"
                    for k, u, c in zip(w["kind"], w["bucket_user"], w["bucket_client_id"], strict=True)
                ]
                parts.append(
                    _png(
                        _bar_figure(
                            labels,
                            list(w["throttle_ms"] / 1000.0),
                            "Who would have been throttled, and by how much",
                            "seconds",
                            list(w["logged_throttle_ms"].fillna(0) / 1000.0),
                            "logged",
                        )
                    )
                )
            wb = plots.get("whatif_bins")
            if wb is not None and not wb.empty:
                parts.append(_png(_heatmap_figure(wb, wb.attrs.get("bin_s", 1), "Replayed throttle time")))
            wcols = [
                "kind",
                "bucket_user",
                "bucket_client_id",
                "clients",
                "charges",
                "limit",
                "throttled",
                "throttled_pct",
                "throttle_ms",
                "max_throttle_ms",
                "rejected_topics",
                "logged_throttled",
                "logged_throttle_ms",
            ]
            parts.append(_table(whatif[[c for c in wcols if c in whatif.columns]], 100))
        else:
            parts.append("<p><i>the proposed quotas apply to none of the logged traffic</i></p>")

    parts.append(
        "<h2>Tables</h2><ul>"
        + "".join(f"<li><code>{e(n)}</code>: {e(p)}</li>" for n, p in tables.items())
        + "</ul></body></html>"
    )
    path = out.rstrip("/") + "/report.html" if "://" not in out else "report.html"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path
