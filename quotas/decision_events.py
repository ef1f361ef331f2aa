"""The decision log's schema (version 1), and the events the proxy writes into it.

Why here: the proxy writes the log (:mod:`proxy.decision_log`) and the Spark job reads it
(:mod:`spark_analysis`), and neither may import the other's layer; the schema is the contract between them, so
it lives in this neutral module both import. Its per-kind columns come from the quota catalogue
(:mod:`quotas.kinds`): a new kind gets its ``<name>_value/_limit/_throttle_ms`` columns without an edit here.
``docs/decision-log.md`` documents every column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from quotas.kinds import BY_KEY, NAMES

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_VERSION: Final = 1

QUOTA_KINDS: Final = NAMES
"""Quota kinds (their short names), in the order of their per-kind columns: the catalogue's order."""

# (name, type). Types: "int32", "int64", "float64", "string", "bool", "list<int32>".
_BASE: Final[tuple[tuple[str, str], ...]] = (
    ("schema", "int32"),
    ("event", "string"),
    ("ts_ms", "int64"),
    ("proxy", "string"),
    ("conn", "string"),
    ("user", "string"),
    ("client_id", "string"),
    ("api_key", "int32"),
    ("api_version", "int32"),
    ("requests", "int64"),
    ("bytes_in", "int64"),
    ("bytes_out", "int64"),
    ("mutations", "int64"),
    ("new_pids", "int64"),
    ("upstream_ms", "float64"),
    ("action", "string"),
    ("throttle_ms", "int64"),
    ("shadow", "bool"),
)
_PER_KIND: Final = tuple(
    col
    for k in QUOTA_KINDS
    for col in ((f"{k}_value", "float64"), (f"{k}_limit", "float64"), (f"{k}_throttle_ms", "int64"))
)
_TAIL: Final[tuple[tuple[str, str], ...]] = (
    ("rejected_topics", "int32"),
    # Optional in v1 (null when the proxy does not fill them); they make the what-if replay exact.
    ("seq", "int64"),
    ("scope", "string"),
    ("req_ts_ms", "int64"),
    ("topic_partitions", "list<int32>"),
    # Fair share (issue 48; optional in v1, null elsewhere): a broker's limit, set on its "fair_share" events
    # (saturated, released) and on requests fair share held (action "fair_share"), with the broker it was.
    ("fair_broker", "string"),
    ("fair_limit", "float64"),
    ("fair_level", "float64"),
    ("fair_delay_ms", "float64"),
    ("fair_baseline_ms", "float64"),
    ("fair_target_ms", "float64"),
    ("fair_tenants", "int32"),
)
COLUMNS: Final[tuple[tuple[str, str], ...]] = _BASE + _PER_KIND + _TAIL
"""Schema version 1: every column, in file order, with its type."""


def column_names() -> list[str]:
    """The schema's column names in file order."""
    return [name for name, _ in COLUMNS]


def arrow_schema() -> pa.Schema:
    """The schema as a ``pyarrow.Schema`` (imports pyarrow lazily: the proxy needs it only with Parquet)."""
    import pyarrow as pa

    types = {
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "string": pa.string(),
        "bool": pa.bool_(),
        "list<int32>": pa.list_(pa.int32()),
    }
    return pa.schema(
        [pa.field(n, types[t]) for n, t in COLUMNS],
        metadata={b"kafka_throttle_proxy.decision_log.schema": str(SCHEMA_VERSION).encode()},
    )


def request_event(
    *,
    ts_ms: int,
    req_ts_ms: int,
    conn: str,
    user: str,
    client_id: str,
    api_key: int,
    api_version: int,
    bytes_in: int,
    bytes_out: int,
    mutations: int,
    new_pids: int,
    upstream_ms: float | None,
    action: str,
    throttle_ms: int,
    shadow: bool,
    rejected_topics: int,
    scope: str,
    topic_partitions: list[int] | None,
    values: dict[str, tuple[float, float, int]],
    fair: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One decided request. ``values``: quota key -> (amount recorded, limit, throttle ms); ``ts_ms`` and
    ``req_ts_ms`` are the exact (epoch-shifted) clock values the response- and request-time charges used, so
    a replay reproduces them."""
    event = {
        "event": "request",
        "ts_ms": ts_ms,
        "req_ts_ms": req_ts_ms,
        "conn": conn,
        "user": user,
        "client_id": client_id,
        "api_key": api_key,
        "api_version": api_version,
        "requests": 1,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "mutations": mutations,
        "new_pids": new_pids,
        "upstream_ms": upstream_ms,
        "action": action,
        "throttle_ms": throttle_ms,
        "shadow": shadow,
        "rejected_topics": rejected_topics,
        "scope": scope,
        "topic_partitions": topic_partitions,
    }
    for key, (value, limit, throttle) in values.items():
        name = BY_KEY[key].name
        event[name + "_value"] = value
        event[name + "_limit"] = limit
        event[name + "_throttle_ms"] = throttle
    if fair:  # fair share held it: the fair_* columns of the broker it was held on
        event.update(fair)
    return event


def summary_event(
    *,
    ts_ms: int,
    conn: str,
    user: str,
    client_id: str,
    requests: int,
    bytes_in: int,
    bytes_out: int,
    shadow: bool,
    scope: str,
) -> dict[str, Any]:
    """A connection's traffic since its last summary that met no quota decision (``api_key`` -1): decided requests
    have their own events, so a column summed over all events counts every request once."""
    return {
        "event": "summary",
        "ts_ms": ts_ms,
        "conn": conn,
        "user": user,
        "client_id": client_id,
        "api_key": -1,
        "api_version": -1,
        "requests": requests,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "mutations": 0,
        "new_pids": 0,
        "action": "pass",
        "throttle_ms": 0,
        "shadow": shadow,
        "scope": scope,
    }


def fair_share_event(
    *,
    ts_ms: int,
    broker: str,
    action: str,
    limit: float,
    level: float,
    delay_ms: float,
    baseline_ms: float,
    target_ms: float,
    tenants: int,
    shadow: bool,
) -> dict[str, Any]:
    """A broker's fair share changed state: ``saturated`` (it limits the work it admits to ``limit`` bytes/s, each
    tenant to ``level``) or ``released`` (unlimited again). Counts no request (``requests`` 0)."""
    return {
        "event": "fair_share",
        "ts_ms": ts_ms,
        "api_key": -1,
        "api_version": -1,
        "requests": 0,
        "bytes_in": 0,
        "bytes_out": 0,
        "mutations": 0,
        "new_pids": 0,
        "action": action,
        "throttle_ms": 0,
        "shadow": shadow,
        "scope": broker,
        "fair_broker": broker,
        "fair_limit": limit,
        "fair_level": level,
        "fair_delay_ms": delay_ms,
        "fair_baseline_ms": baseline_ms,
        "fair_target_ms": target_ms,
        "fair_tenants": tenants,
    }
