"""The decision log's schema as Spark sees it, and reading a log from any path Spark can read.

The column list is owned by :mod:`quotas.decision_events` (the contract the proxy writes to); this module only
translates it, so the writer and the reader cannot drift apart.
"""

from __future__ import annotations

from typing import cast

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from quotas.decision_events import COLUMNS, QUOTA_KINDS, SCHEMA_VERSION
from quotas.kinds import (
    BY_NAME,
    DEFAULT_THREAD_COST_MS,
    FETCH,
    FETCH_BARE_BYTES,
    FETCH_HEAD_BYTES,
    FETCH_HEAD_MS_PER_KIB,
    MUTATION_APIS,
    NEVER_CHARGED_APIS,
    THREAD_COST_MS,
    WAITING_APIS,
)

__all__ = [
    "FAIR_RELEASED",
    "FAIR_SATURATED",
    "FAIR_SHARE",
    "MUTATION_APIS",
    "NEVER_CHARGED_APIS",
    "QUOTA_KINDS",
    "WAITING_APIS",
    "amount_column",
    "event_schema",
    "read_events",
]

FAIR_SHARE = "fair_share"
"""Both the ``event`` of a broker's fair-share state change (``action`` ``saturated`` or ``released``, ``requests``
0, no tenant) and the ``action`` of a request fair share held longer than any quota throttled it (its wait in
``throttle_ms``): what :func:`quotas.decision_events.fair_share_event` and the proxy's decision recording write."""
FAIR_SATURATED = "saturated"
FAIR_RELEASED = "released"

_DDL = {
    "int32": "int",
    "int64": "bigint",
    "float64": "double",
    "string": "string",
    "bool": "boolean",
    "list<int32>": "array<int>",
}


def event_schema() -> StructType:
    """Spark schema of decision-log schema version 1."""
    # fromDDL is typed to return any DataType; a list of columns parses to a StructType.
    return cast(StructType, StructType.fromDDL(", ".join(f"`{n}` {_DDL[t]}" for n, t in COLUMNS)))


def _looks_like_json(path: str) -> bool:
    lower = path.lower().rstrip("/")
    if lower.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return True
    if "://" in path and not path.startswith("file://"):
        return False
    import glob
    import os

    local = path[len("file://") :] if path.startswith("file://") else path
    if os.path.isdir(local):
        has_json = glob.glob(os.path.join(local, "**", "*.jsonl"), recursive=True)
        has_parquet = glob.glob(os.path.join(local, "**", "*.parquet"), recursive=True)
        return bool(has_json) and not has_parquet
    return False


KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
"""Spark's own Kafka source, for ``kafka://`` input. 4.2.0 although pyspark is 4.3: the 4.3.0 connector is not
on Maven Central (checked 2026-11-25), and 4.2.0's reads the decision-log topic on Spark 4.3 (tested)."""


def kafka_input(path: str) -> tuple[str, str] | None:
    """``kafka://host:port[,host:port]/topic`` -> (bootstrap servers, topic); None for a file path."""
    if not path.startswith("kafka://"):
        return None
    servers, _, topic = path[len("kafka://") :].partition("/")
    if not servers or not topic or "/" in topic:
        raise ValueError(f"{path!r}: a topic input is kafka://HOST:PORT[,HOST:PORT...]/TOPIC")
    return servers, topic


def read_events(spark: SparkSession, path: str, fmt: str = "auto") -> DataFrame:
    """Read a decision log (a file, a directory tree with ``date=`` partitions, a glob; local, hdfs://, s3a://;
    or ``kafka://host:port/topic``, the topic members write with ``decision_log.topic``, through Spark's Kafka
    source: needs :data:`KAFKA_CONNECTOR` in ``spark.jars.packages``, which ``build_spark`` is given).

    Columns missing from older files read as null; rows of another schema version are left out.
    """
    topic = kafka_input(path)
    if topic is not None:
        raw = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", topic[0])
            .option("subscribe", topic[1])
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
        df = raw.select(F.from_json(F.col("value").cast("string"), event_schema()).alias("e")).select("e.*")
        df = df.select(*[n for n, _ in COLUMNS])
        return df.where(F.col("schema").isNull() | (F.col("schema") == SCHEMA_VERSION))
    if fmt == "auto":
        fmt = "json" if _looks_like_json(path) else "parquet"
    reader = spark.read.schema(event_schema())
    df = reader.json(path) if fmt in ("json", "jsonl") else reader.parquet(path)
    df = df.select(*[n for n, _ in COLUMNS])
    return df.where(F.col("schema").isNull() | (F.col("schema") == SCHEMA_VERSION))


def _thread_percent(api: Column) -> Column:
    """quotas.kinds.thread_ms of each event's API and logged sizes, / 10 (percent-seconds of one thread)."""
    base, per_in, per_out = (F.lit(x) for x in DEFAULT_THREAD_COST_MS)
    for key, (b, i, o) in THREAD_COST_MS.items():
        base = F.when(api == key, F.lit(b)).otherwise(base)
        per_in = F.when(api == key, F.lit(i)).otherwise(per_in)
        per_out = F.when(api == key, F.lit(o)).otherwise(per_out)
    bytes_in = F.coalesce(F.col("bytes_in"), F.lit(0)).cast("double")
    bytes_out = F.coalesce(F.col("bytes_out"), F.lit(0)).cast("double")
    # Fetch's steep KiB past its bare bytes (quotas.kinds.fetch_head_bytes). Not replayed: a Produce's acks=-1 term
    # (acks is not logged); a request a quota charged has its exact amount logged, so this fallback only prices
    # the rest.
    past_bare = F.greatest(bytes_out - F.lit(float(FETCH_BARE_BYTES)), F.lit(0.0))
    head = F.when(api == FETCH, F.lit(FETCH_HEAD_MS_PER_KIB) * F.least(past_bare, F.lit(float(FETCH_HEAD_BYTES))))
    return (base + (per_in * bytes_in + per_out * bytes_out + F.coalesce(head, F.lit(0.0))) / 1024.0) / 10.0


def amount_column(kind: str) -> Column:
    """Amount charged (or chargeable) to ``kind`` by an event: the logged ``{kind}_value``, else what the proxy
    would record for it (so usage is known even for traffic no quota applied to)."""
    spec = BY_NAME[kind]  # the catalogue says which APIs it charges and which logged column holds the amount
    api = F.col("api_key")
    applies = api.isin(*spec.apis) if spec.apis else ~api.isin(*NEVER_CHARGED_APIS)
    # request_percentage: quotas.kinds.thread_ms from the logged sizes, in percent-seconds
    value = _thread_percent(api) if spec.measure == "thread_time" else F.col(spec.logged).cast("double")
    fallback = F.when(applies, value)
    return F.coalesce(F.col(f"{kind}_value"), fallback)
