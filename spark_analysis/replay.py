"""The what-if replay: feed logged traffic, per bucket and in time order, through the proxy's own quota code.

Runs inside Spark's Python workers (``groupBy(...).applyInPandas(replay_group)``), one call per
``(proxy, scope, kind, bucket)``. Nothing here computes a quota: every decision comes from
:class:`quotas.manager.QuotaManager` (resolution via :class:`quotas.entities.QuotaStore`, rates via
:class:`quotas.rate.SampledRate`, tokens via :class:`quotas.token_bucket.TokenBucket` and
:func:`quotas.token_bucket.admit`), exactly the calls :mod:`proxy.rules.policy` makes. So a replay of the config that
was live reproduces the logged decisions, and a replay of a proposed config shows what the proxy would do.

What a replay cannot know: clients that would have been throttled would also have slowed down, so the traffic
after the first throttle is what clients sent *without* that throttle - a stricter config is judged on
unthrottled traffic, i.e. pessimistically.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from quotas.kinds import mutation_is_strict
from quotas.manager import QuotaManager
from spark_analysis.quota_config import KIND_KEYS, ReplayConfig

REPLAY_OUTPUT_SCHEMA = (
    "proxy string, scope string, kind string, bucket_user string, bucket_client_id string, user string, "
    "client_id string, ts_ms long, seq long, event string, amount double, limit double, throttle_ms long, "
    "rejected_topics int, logged_throttle_ms long, logged_limit double"
)

# Per worker process: the store built from one config (building it per group would dominate small groups).
_STORES: dict[int, Any] = {}


def _store(config: ReplayConfig):
    key = hash(config.quotas)
    store = _STORES.get(key)
    if store is None:
        if len(_STORES) > 8:
            _STORES.clear()
        store = _STORES[key] = config.store()
    return store


def replay_frame(pdf: pd.DataFrame, config: ReplayConfig) -> pd.DataFrame:
    """Replay one bucket's charges (any order; sorted here by ``charge_ts_ms`` then ``seq``).

    Input columns: proxy, scope, kind, bucket_user, bucket_client_id, user, client_id, charge_ts_ms, ts_ms, seq,
    event, amount, api_key, api_version, topic_partitions, logged_throttle_ms, logged_limit. Output: one row per
    charge, :data:`REPLAY_OUTPUT_SCHEMA`.
    """
    pdf = pdf.sort_values(["charge_ts_ms", "seq"], kind="stable", na_position="first")
    n = len(pdf)
    manager = QuotaManager(_store(config), config.windows, config.idle_ms)
    throttles = [0] * n
    rejected = [0] * n
    limits: list[float | None] = [None] * n
    kind = pdf["kind"].iloc[0] if n else "produce"
    key = KIND_KEYS[kind]
    users = pdf["user"].tolist()
    clients = pdf["client_id"].tolist()
    scopes = pdf["scope"].tolist()
    times = pdf["charge_ts_ms"].tolist()
    amounts = pdf["amount"].tolist()
    idle_check_every = max(config.idle_ms // 10, 1)
    last_expire = times[0] if n else 0
    if kind == "mutation":
        api_keys = pdf["api_key"].tolist()
        versions = pdf["api_version"].tolist()
        partitions = pdf["topic_partitions"].tolist()
    for i in range(n):
        now = int(times[i])
        if now - last_expire >= idle_check_every:  # the proxy's upkeep drops idle trackers the same way
            manager.expire(now)
            last_expire = now
        user, client, scope = users[i], clients[i], scopes[i]
        if kind == "mutation":
            counts = partitions[i]
            counts = [int(c) for c in counts] if counts is not None and len(counts) else [amounts[i]]
            strict = mutation_is_strict(int(api_keys[i]), int(versions[i]))
            mc = manager.charge_mutations(user, client, scope, counts, now, strict)
            if mc is None:
                continue
            throttles[i] = mc.throttle_ms
            rejected[i] = len(mc.rejected)
            limits[i] = mc.limit
        else:
            charge = manager.charge_rate(key, user, client, scope, float(amounts[i]), now)
            if charge is None:
                continue
            throttles[i] = charge.throttle_ms
            limits[i] = charge.limit
    return pd.DataFrame(
        {
            "proxy": pdf["proxy"].to_numpy(),
            "scope": pdf["scope"].to_numpy(),
            "kind": pdf["kind"].to_numpy(),
            "bucket_user": pdf["bucket_user"].to_numpy(),
            "bucket_client_id": pdf["bucket_client_id"].to_numpy(),
            "user": pdf["user"].to_numpy(),
            "client_id": pdf["client_id"].to_numpy(),
            "ts_ms": pdf["ts_ms"].to_numpy(),
            "seq": pdf["seq"].to_numpy(),
            "event": pdf["event"].to_numpy(),
            "amount": pdf["amount"].to_numpy(),
            "limit": pd.array(limits, dtype="Float64"),
            "throttle_ms": pd.array(throttles, dtype="Int64"),
            "rejected_topics": pd.array(rejected, dtype="Int32"),
            "logged_throttle_ms": pdf["logged_throttle_ms"].to_numpy(),
            "logged_limit": pdf["logged_limit"].to_numpy(),
        }
    )


GROUP_COLUMNS = ("proxy", "scope", "kind", "bucket_user", "bucket_client_id")
"""What identifies a bucket; inside Spark they travel as one ``bucket_id`` (see :func:`make_replay_fn`)."""

BY_ID_OUTPUT_SCHEMA = "bucket_id long, " + ", ".join(
    f for f in REPLAY_OUTPUT_SCHEMA.split(", ") if f.split(" ")[0] not in GROUP_COLUMNS
)


def make_replay_fn(config: ReplayConfig, buckets: dict[int, tuple[str, ...]]):
    """The function handed to ``applyInPandas``, grouped by ``bucket_id`` (a closure over the picklable
    config and the bucket table, ``id -> GROUP_COLUMNS values``; a few thousand entries at most).

    Why ids: every column crossing into and out of the Python worker is converted row by row, and the five
    bucket columns are the same strings on every row of a group. Shipping one long instead took a large
    share of the replay's time; the caller joins the names back.
    """

    def replay_group(pdf: pd.DataFrame) -> pd.DataFrame:
        bucket_id = int(pdf["bucket_id"].iloc[0])
        for name, value in zip(GROUP_COLUMNS, buckets[bucket_id], strict=True):
            pdf[name] = value
        out = replay_frame(pdf, config).drop(columns=list(GROUP_COLUMNS))
        out.insert(0, "bucket_id", bucket_id)
        return out

    return replay_group


def resolve_pairs(pairs: list[tuple[str, str]], config: ReplayConfig) -> list[tuple[str, str, str, str, str, float]]:
    """For each distinct (user, client_id) seen and each quota kind the config sets: the bucket it is charged to.

    Returns (user, client_id, kind, bucket_user, bucket_client_id, limit); pairs with no quota are left out, so
    the replay never touches traffic no quota applies to (Kafka records nothing for it either).
    """
    store = config.store()
    keys = config.quota_keys()
    out = []
    for user, client in pairs:
        for kind, key in KIND_KEYS.items():
            if key not in keys:
                continue
            r = store.resolve(user, client, key)
            if r is not None:
                out.append((user, client, kind, r.bucket.user, r.bucket.client_id, r.limit))
    return out
