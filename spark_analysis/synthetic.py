"""Synthetic decision logs: many users and clients, Zipf-skewed activity, and one bursty noisy tenant.

Two generators, for two purposes:

* :func:`generate` - vectorised (numpy + pyarrow), for scale: 10 M events in well under a minute. Logged quota
  decisions follow a ``<default user>`` byte-rate config approximately (an 11-second rolling rate per user, the
  throttle formula of KIP-13 applied per second), enough for realistic reports; exact decisions are what the
  replay computes.
  With ``fair_share``, fair share also limits a broker on the noisy tenant's proxy through each burst: a
  ``saturated`` and a ``released`` event (overlapping bursts on one broker make one episode), and most of the
  noisy tenant's Produce requests on that broker in between are held (action ``fair_share``, a wait of 20-300 ms).
* :class:`ProxySimulator` - exact, for tests: feeds events through the proxy's own
  :class:`quotas.manager.QuotaManager` the way :mod:`proxy.rules.policy` does and fills the logged decision columns,
  so a test can check the job's totals and the replay against decisions made by the quota code itself.

CLI: ``python -m spark_analysis.synthetic OUT_DIR --events 10000000 [--span 3600] [--users 200] [--seed 1]
[--fair-share]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from quotas.decision_events import COLUMNS, SCHEMA_VERSION, arrow_schema, fair_share_event
from quotas.kinds import (
    BY_KEY,
    CONTROLLER_MUTATION_RATE,
    MUTATION_APIS,
    PRODUCER_IDS_RATE,
    amount,
    charged_at,
    mutation_is_strict,
)
from quotas.manager import QuotaManager
from spark_analysis.quota_config import ReplayConfig

__all__ = ["NOISY_USER", "ProxySimulator", "generate", "live_config_yaml", "main", "small_traffic"]

NOISY_USER = "noisy"
LIVE_PRODUCE_LIMIT = 2_000_000.0  # <default user> producer_byte_rate in the synthetic "live" config
LIVE_FETCH_LIMIT = 6_000_000.0  # <default user> consumer_byte_rate
FAIR_BROKERS = ("broker 1", "broker 2", "broker 3")  # the synthetic scopes; a burst's episode is on one of them

_APIS_PRODUCER = np.array([0, 0, 0, 0, 0, 0, 0, 0, 3, 22])  # Produce-heavy, some Metadata / InitProducerId
_APIS_CONSUMER = np.array([1, 1, 1, 1, 1, 1, 8, 12, 3, 2])  # Fetch-heavy, commits, heartbeats, metadata
_VERSIONS = {0: 9, 1: 13, 2: 7, 3: 12, 8: 8, 12: 4, 19: 7, 22: 4}


def live_config_yaml() -> str:
    """The config :func:`generate` pretends was live (for ``--quotas`` what-if runs of the same limits)."""
    return (
        "scope: cluster\n"  # the generator's logged decisions pool a user's traffic over every broker
        "quotas:\n"
        "  - entity: {user: <default>}\n"
        f"    quotas: {{producer_byte_rate: {int(LIVE_PRODUCE_LIMIT)}, "
        f"consumer_byte_rate: {int(LIVE_FETCH_LIMIT)}}}\n"
    )


def _rolling_rate(per_sec: np.ndarray, samples: int = 11) -> np.ndarray:
    """Approximate Kafka rate per (row, second): sum of the last ``samples`` seconds over (samples - 0.5) s."""
    c = np.cumsum(per_sec, axis=1)
    shifted = np.zeros_like(c)
    shifted[:, samples:] = c[:, :-samples]
    return (c - shifted) / (samples - 0.5)


def generate(
    out_dir: str | Path,
    n_events: int,
    *,
    span_s: int = 3600,
    n_users: int = 200,
    seed: int = 1,
    proxies: int = 2,
    rows_per_file: int = 1_000_000,
    start_ms: int | None = None,
    fair_share: bool = False,
) -> dict[str, Any]:
    """Write ``n_events`` synthetic events as Parquet under ``out_dir/date=.../``; returns a small description.
    ``fair_share``: also fair share's episodes and held requests (see the module's docstring); ``n_events``
    counts the requests and summaries, the episodes' events come on top."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.monotonic()
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    start_ms = start_ms if start_ms is not None else 1_767_225_600_000  # 2026-01-01T00:00:00Z
    # Entities: users with 1-4 client ids; the noisy tenant is user 0 with two clients.
    users = [NOISY_USER] + [f"tenant-{i:03d}" for i in range(1, n_users)]
    ent_user, ent_client, ent_role = [], [], []
    for ui, u in enumerate(users):
        k = 2 if ui == 0 else int(rng.integers(1, 5))
        for c in range(k):
            ent_user.append(ui)
            ent_client.append(f"{u}-{'batch' if ui == 0 else 'app'}-{c}")
            ent_role.append(0 if (ui == 0 or c % 2 == 0) else 1)  # 0 producer, 1 consumer
    n_ent = len(ent_user)
    ent_user_a = np.array(ent_user, dtype=np.int32)
    ent_role_a = np.array(ent_role, dtype=np.int8)
    weights = 1.0 / np.arange(1, n_ent + 1) ** 1.1
    rng.shuffle(weights)
    noisy_ents = np.flatnonzero(ent_user_a == 0)
    weights[noisy_ents] = weights.max() * 0.15
    weights /= weights.sum()
    # Background traffic, then noisy bursts (20-60 s, every ~5 min, 10x its rate).
    n_noisy_burst = n_events // 10
    n_bg = n_events - n_noisy_burst
    ent = rng.choice(n_ent, size=n_bg, p=weights).astype(np.int32)
    ts = start_ms + rng.integers(0, span_s * 1000, size=n_bg)
    n_bursts = max(1, span_s // 300)
    b_start = rng.integers(0, max(span_s - 60, 1), size=n_bursts) * 1000
    b_len = rng.integers(20, 61, size=n_bursts) * 1000
    which = rng.integers(0, n_bursts, size=n_noisy_burst)
    ts_b = start_ms + b_start[which] + (rng.random(n_noisy_burst) * b_len[which]).astype(np.int64)
    ent_b = rng.choice(noisy_ents, size=n_noisy_burst).astype(np.int32)
    ent = np.concatenate([ent, ent_b])
    ts = np.concatenate([ts, ts_b]).astype(np.int64)
    order = np.argsort(ts, kind="stable")
    ent, ts = ent[order], ts[order]
    n = len(ts)
    role = ent_role_a[ent]
    pick = rng.integers(0, 10, size=n)
    api = np.where(role == 0, _APIS_PRODUCER[pick], _APIS_CONSUMER[pick]).astype(np.int32)
    mut = rng.random(n) < 2e-5  # rare CreateTopics
    api[mut] = 19
    # Sizes and latencies (lognormal; the noisy tenant sends bigger batches).
    noisy = ent_user_a[ent] == 0
    bytes_in = np.full(n, 120, dtype=np.int64)
    is_prod = api == 0
    bytes_in[is_prod] = rng.lognormal(9.3, 1.0, size=is_prod.sum()).astype(np.int64) + 200
    bytes_in[is_prod & noisy] *= 4
    bytes_out = rng.lognormal(5.0, 0.5, size=n).astype(np.int64)
    is_fetch = api == 1
    empty = rng.random(n) < 0.3
    bytes_out[is_fetch] = np.where(empty[is_fetch], 80, rng.lognormal(10.5, 1.2, size=is_fetch.sum()).astype(np.int64))
    upstream = rng.lognormal(0.8, 0.7, size=n)
    upstream[is_fetch] = rng.uniform(0, 500, size=is_fetch.sum())
    upstream[mut] = rng.lognormal(4.0, 0.5, size=mut.sum())
    mutations = np.where(mut, rng.integers(1, 50, size=n), 0).astype(np.int64)
    new_pids = np.where(api == 22, 0, np.where(is_prod & (rng.random(n) < 0.001), 1, 0)).astype(np.int64)
    # Approximate logged decisions under the live <default user> byte-rate quotas.
    sec = ((ts - start_ms) // 1000).astype(np.int64)
    uidx = ent_user_a[ent]
    n_sec = span_s + 1
    prod_thr = np.zeros(n, dtype=np.int64)
    fetch_thr = np.zeros(n, dtype=np.int64)
    for mask, limit, thr in ((is_prod, LIVE_PRODUCE_LIMIT, prod_thr), (is_fetch, LIVE_FETCH_LIMIT, fetch_thr)):
        amount = bytes_in if thr is prod_thr else bytes_out
        per = np.bincount(uidx[mask] * n_sec + sec[mask], weights=amount[mask], minlength=n_users * n_sec)
        rate = _rolling_rate(per.reshape(n_users, n_sec))
        over = np.clip((rate - limit) / limit * 10_500, 0, None).round().astype(np.int64)
        thr[mask] = over[uidx[mask], sec[mask]]
    throttle = np.maximum(prod_thr, fetch_thr)
    # A few pass-through summaries (api_key -1) per connection.
    summary = (rng.random(n) < 0.03) & ~is_prod & ~is_fetch & ~mut
    proxy_idx = (uidx % proxies).astype(np.int32)  # a user's connections all go through one proxy
    conn_idx = ent * 4 + rng.integers(0, 4, size=n)
    seq = np.zeros(n, dtype=np.int64)
    for p in range(proxies):
        m = proxy_idx == p
        seq[m] = np.arange(m.sum())
    strs = {
        "user": pa.DictionaryArray.from_arrays(pa.array(ent_user_a[ent]), pa.array(users)),
        "client_id": pa.DictionaryArray.from_arrays(pa.array(ent), pa.array(ent_client)),
    }
    cols: dict[str, Any] = {
        "schema": np.full(n, SCHEMA_VERSION, dtype=np.int32),
        "event": np.where(summary, "summary", "request"),
        "ts_ms": ts,
        "proxy": np.array([f"proxy-{chr(97 + i)}" for i in range(proxies)])[proxy_idx],
        "conn": np.char.add("c", conn_idx.astype(str)),
        "api_key": np.where(summary, -1, api).astype(np.int32),
        "api_version": np.array([_VERSIONS.get(int(a), 1) for a in range(80)], dtype=np.int32)[np.clip(api, 0, 79)],
        "requests": np.where(summary, rng.integers(2, 50, size=n), 1).astype(np.int64),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "mutations": mutations,
        "new_pids": new_pids,
        "upstream_ms": upstream,
        "action": np.where(throttle > 0, "throttle", "pass"),
        "throttle_ms": throttle,
        "shadow": np.zeros(n, dtype=bool),
        "produce_value": np.where(is_prod, bytes_in.astype(float), np.nan),
        "produce_limit": np.where(is_prod, LIVE_PRODUCE_LIMIT, np.nan),
        "produce_throttle_ms": np.where(is_prod, prod_thr, -1),
        "fetch_value": np.where(is_fetch, bytes_out.astype(float), np.nan),
        "fetch_limit": np.where(is_fetch, LIVE_FETCH_LIMIT, np.nan),
        "fetch_throttle_ms": np.where(is_fetch, fetch_thr, -1),
        "rejected_topics": np.zeros(n, dtype=np.int32),
        "seq": seq,
        "scope": np.array(["broker 1", "broker 2", "broker 3"])[rng.integers(0, 3, size=n)],
        "req_ts_ms": ts - np.where(is_fetch, upstream.astype(np.int64), 0),
    }
    fair_rows: list[dict[str, Any]] = []
    if fair_share:  # its own generator: the default log stays the same, seed for seed
        bursts = [(start_ms + int(b), start_ms + int(b + n)) for b, n in zip(b_start, b_len, strict=True)]
        noisy_prod = noisy & is_prod & (proxy_idx == 0)  # the noisy tenant's proxy is proxy-a (user 0)
        fair_rows = _add_fair_share(cols, np.random.default_rng(seed + 1), bursts, noisy_prod, proxy_idx == 0)
    schema = arrow_schema()
    day = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC).strftime("%Y-%m-%d")
    (out / f"date={day}").mkdir(parents=True, exist_ok=True)
    files = 0
    topic_part = [[int(m)] if m else None for m in mutations[mut]]
    mut_pos = np.flatnonzero(mut)
    for lo in range(0, n, rows_per_file):
        hi = min(n, lo + rows_per_file)
        arrays = []
        for name, kind in COLUMNS:
            f = schema.field(name)
            if name in strs:
                arrays.append(strs[name].slice(lo, hi - lo))  # dictionary-encoded: Spark reads strings
                continue
            if name == "topic_partitions":
                vals: list[Any] = [None] * (hi - lo)
                sel = (mut_pos >= lo) & (mut_pos < hi)
                for p, tp in zip(mut_pos[sel], np.array(topic_part, dtype=object)[sel], strict=True):
                    vals[p - lo] = tp
                arrays.append(pa.array(vals, type=f.type))
                continue
            if name not in cols:
                arrays.append(pa.nulls(hi - lo, type=f.type))
                continue
            v = cols[name][lo:hi]
            if kind == "float64":
                arrays.append(pa.array(v, type=f.type, from_pandas=True))  # NaN -> null
            elif name.endswith("_throttle_ms"):
                arrays.append(pa.array(v, type=f.type, mask=v < 0))
            else:
                arrays.append(pa.array(v, type=f.type))
        fields = [pa.field(nm, a.type) for (nm, _), a in zip(COLUMNS, arrays, strict=True)]
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=schema.metadata))
        pq.write_table(table, out / f"date={day}" / f"decisions-synthetic-{files:05d}.parquet", compression="zstd")
        files += 1
    if fair_rows:
        table = pa.Table.from_pylist(fair_rows, schema=schema)
        pq.write_table(table, out / f"date={day}" / f"decisions-synthetic-{files:05d}.parquet", compression="zstd")
        files += 1
    return {
        "events": n + len(fair_rows),
        "fair_share_events": len(fair_rows),
        "fair_share_held": int(np.count_nonzero(cols["action"] == "fair_share")),
        "files": files,
        "entities": n_ent,
        "users": n_users,
        "span_s": span_s,
        "noisy_user": NOISY_USER,
        "seconds": time.monotonic() - t0,
        "start_ms": start_ms,
    }


def _add_fair_share(
    cols: dict[str, Any],
    rng: np.random.Generator,
    bursts: list[tuple[int, int]],
    noisy_prod: np.ndarray,
    on_proxy: np.ndarray,
) -> list[dict[str, Any]]:
    """Fair share on the noisy tenant's proxy (``on_proxy``): each burst saturates one broker from 2 s after it
    starts (the delay takes a moment to build) to 3 s after it ends, and ~60 % of the noisy tenant's Produce
    requests (``noisy_prod``) on that broker meanwhile are held, unless its quota throttled them (the proxy logs
    the longer reason). Marks those rows in ``cols``, renumbers the proxy's ``seq`` so the state changes sit in
    emit order among its requests, and returns the state-change events."""
    per_broker: dict[str, list[list[int]]] = {}
    for i, (lo, hi) in enumerate(sorted(bursts)):
        spans = per_broker.setdefault(FAIR_BROKERS[i % len(FAIR_BROKERS)], [])
        sat, rel = lo + 2000, hi + 3000
        if spans and sat <= spans[-1][1]:  # overlapping bursts: one episode, as one broker's loop would see it
            spans[-1][1] = max(spans[-1][1], rel)
        else:
            spans.append([sat, rel])
    ts, scope = cols["ts_ms"], cols["scope"]
    cols["action"] = cols["action"].astype(object)  # a fixed-width "<U8" array would cut "fair_share" short
    fair_cols = {
        "fair_broker": np.full(len(ts), None, dtype=object),
        **{c: np.full(len(ts), np.nan) for c in ("fair_limit", "fair_level", "fair_delay_ms")},
    }
    rows: list[dict[str, Any]] = []
    for broker, spans in per_broker.items():
        for sat, rel in spans:
            limit = float(rng.uniform(8, 40)) * 2**20
            tenants = int(rng.integers(5, 40))
            level, delay = limit / 4, float(rng.uniform(2, 8))
            for at, action in ((sat, "saturated"), (rel, "released")):
                e = fair_share_event(
                    ts_ms=at,
                    broker=broker,
                    action=action,
                    limit=limit if action == "saturated" else 0.0,
                    level=level if action == "saturated" else 0.0,
                    delay_ms=delay if action == "saturated" else 0.0,
                    baseline_ms=2.0,
                    target_ms=1.0,
                    tenants=tenants,
                    shadow=False,
                )
                rows.append({"schema": SCHEMA_VERSION, "proxy": "proxy-a", **e})
            held = np.flatnonzero(
                noisy_prod & (scope == broker) & (ts >= sat) & (ts < rel) & (cols["throttle_ms"] == 0)
            )
            held = held[rng.random(len(held)) < 0.6]
            wobble = rng.uniform(0.8, 1.2, size=len(held))  # the limit moves while it holds
            cols["action"][held] = "fair_share"
            cols["throttle_ms"][held] = rng.integers(20, 301, size=len(held))
            fair_cols["fair_broker"][held] = broker
            fair_cols["fair_limit"][held] = limit * wobble
            fair_cols["fair_level"][held] = level * wobble
            fair_cols["fair_delay_ms"][held] = delay * wobble
    cols.update(fair_cols)
    # seq: the proxy numbers events as it emits them; in one millisecond a saturation comes before what it holds
    # and a release after (what spark_analysis.job.fair_share_episodes orders by).
    mine = np.flatnonzero(on_proxy)
    keys = np.concatenate(
        [ts[mine] * 4 + 1, np.array([r["ts_ms"] * 4 + (0 if r["action"] == "saturated" else 2) for r in rows])]
    )
    rank = np.empty(len(keys), dtype=np.int64)
    rank[np.argsort(keys, kind="stable")] = np.arange(len(keys))
    cols["seq"][mine] = rank[: len(mine)]
    for r, q in zip(rows, rank[len(mine) :], strict=True):
        r["seq"] = int(q)
    return rows


# ------------------------------------------------------------------------------------------------- exact


class ProxySimulator:
    """Makes the logged decisions for raw traffic exactly as :mod:`proxy.rules.policy` would, with the quota code.

    Input events carry traffic only (ts_ms, user, client_id, api_key, api_version, bytes_in, bytes_out,
    upstream_ms, mutations / topic_partitions, new_pids, optional req_ts_ms and scope); the simulator fills
    ``{kind}_value / _limit / _throttle_ms``, ``throttle_ms``, ``action``, ``rejected_topics``. Request-side charges
    (produce bytes, producer ids, mutations) happen at ``req_ts_ms``, response-side ones (fetch bytes, request
    time) at ``ts_ms``, as in the proxy. Events must come in the order the proxy would have charged them.
    """

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        self.manager = QuotaManager(config.store(), config.windows, config.idle_ms)
        self.keys = config.quota_keys()

    def decide(self, e: dict[str, Any]) -> dict[str, Any]:
        e = dict(e)
        api = e.get("api_key", -1)
        user, client = e["user"], e.get("client_id") or ""
        scope = "" if self.config.scope == "cluster" else (e.get("scope") or "")
        req_ts = e.get("req_ts_ms", e["ts_ms"])
        throttle = 0
        e.setdefault("rejected_topics", 0)

        def note(kind: str, amount: float, limit: float, t: int) -> None:
            nonlocal throttle
            e[f"{kind}_value"], e[f"{kind}_limit"], e[f"{kind}_throttle_ms"] = float(amount), float(limit), int(t)
            throttle = max(throttle, t)

        def charge(key: str, value: float, now: int) -> None:
            c = self.manager.charge_rate(key, user, client, scope, value, now)
            if c is not None:
                note(BY_KEY[key].name, value, c.limit, c.throttle_ms)

        # The proxy's own order (proxy.rules.policy): request-time kinds, producer ids, mutations, response-time kinds.
        if api >= 0:
            for kind in charged_at(api, "request", self.keys):
                charge(kind.key, amount(kind, api, request_bytes=e.get("bytes_in", 0)), req_ts)
        if api == 0 and e.get("new_pids") and PRODUCER_IDS_RATE in self.keys:
            charge(PRODUCER_IDS_RATE, e["new_pids"], req_ts)
        if api in MUTATION_APIS and CONTROLLER_MUTATION_RATE in self.keys:
            counts = e.get("topic_partitions") or [e.get("mutations", 0)]
            strict = mutation_is_strict(api, e.get("api_version", 0))
            mc = self.manager.charge_mutations(user, client, scope, counts, req_ts, strict)
            if mc is not None:
                e["mutations"] = mc.mutations
                e["rejected_topics"] = len(mc.rejected)
                note("mutation", mc.mutations, mc.limit, mc.throttle_ms)
        if api >= 0:
            for kind in charged_at(api, "response", self.keys):
                charge(
                    kind.key,
                    amount(kind, api, e.get("bytes_in", 0), e.get("bytes_out", 0)),
                    e["ts_ms"],
                )
        e["throttle_ms"] = throttle
        e["action"] = "reject" if e["rejected_topics"] else ("throttle" if throttle > 0 else "pass")
        return e

    def run(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for e in events:
            yield self.decide(e)


def small_traffic(
    n: int, *, seed: int = 7, start_ms: int = 1_767_225_600_000, span_s: int = 120, noisy_user: str = NOISY_USER
) -> list[dict[str, Any]]:
    """Raw traffic for tests: a few steady users and one noisy producer that bursts in the middle of the span."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        t = start_ms + int(i * span_s * 1000 / n)
        r = rng.random()
        burst = span_s * 0.4 <= (t - start_ms) / 1000 <= span_s * 0.6
        if r < 0.3 or (burst and r < 0.6):
            user, client, api = noisy_user, f"{noisy_user}-batch-{int(rng.integers(0, 2))}", 0
            size = int(rng.integers(40_000, 60_000)) if burst else int(rng.integers(1_000, 3_000))
        else:
            k = int(rng.integers(0, 4))
            user, client = f"tenant-{k}", f"tenant-{k}-app"
            api = int(rng.choice([0, 1, 3, 19])) if rng.random() < 0.02 else int(rng.choice([0, 1]))
            size = int(rng.integers(500, 5_000))
        up = float(rng.lognormal(0.5, 0.5))
        e: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "event": "request",
            "ts_ms": t,
            "req_ts_ms": t - int(up),
            "proxy": "p1",
            "conn": f"c-{user}-{client}",
            "user": user,
            "client_id": client,
            "api_key": api,
            "api_version": _VERSIONS.get(api, 1),
            "requests": 1,
            "bytes_in": size if api == 0 else 100,
            "bytes_out": int(rng.integers(1_000, 20_000)) if api == 1 else 50,
            "mutations": 0,
            "new_pids": 0,
            "upstream_ms": up,
            "shadow": False,
            "seq": i,
            "scope": "broker 1",
        }
        if api == 19:
            e["topic_partitions"] = [int(rng.integers(1, 30))]
            e["mutations"] = e["topic_partitions"][0]
        out.append(e)
    out.sort(key=lambda e: (e["req_ts_ms"], e["seq"]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_analysis.synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="output directory (Parquet, date= partitioned)")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--span", type=int, default=3600, help="seconds of traffic (default 3600)")
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--proxies", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--write-live-config", metavar="FILE", help="also write the approximate live quota config")
    p.add_argument(
        "--fair-share", action="store_true", help="also fair share: a broker limited through each noisy burst"
    )
    a = p.parse_args(argv)
    info = generate(
        a.out, a.events, span_s=a.span, n_users=a.users, seed=a.seed, proxies=a.proxies, fair_share=a.fair_share
    )
    if a.write_live_config:
        Path(a.write_live_config).write_text(live_config_yaml(), encoding="utf-8")
    rate = info["events"] / max(info["seconds"], 1e-9)
    print(
        f"wrote {info['events']:,} events in {info['files']} files to {a.out} in {info['seconds']:.1f} s "
        f"({rate:,.0f} events/s); {info['entities']} (user, client-id) pairs, noisy tenant {NOISY_USER!r}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
