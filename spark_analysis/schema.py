"""The decision log's schema as Spark sees it, and reading a log from any path Spark can read.

The column list is owned by :mod:`quotas.decision_events` (the contract the proxy writes to); this module only
translates it, so the writer and the reader cannot drift apart.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from quotas.decision_events import COLUMNS, QUOTA_KINDS, SCHEMA_VERSION
from quotas.kinds import MUTATION_APIS, NEVER_CHARGED_APIS, WAITING_APIS

__all__ = ["MUTATION_APIS", "NEVER_CHARGED_APIS", "QUOTA_KINDS", "WAITING_APIS", "amount_column", "event_schema",
           "read_events"]

_DDL = {"int32": "int", "int64": "bigint", "float64": "double", "string": "string", "bool": "boolean",
        "list<int32>": "array<int>"}

def event_schema() -> StructType:
    """Spark schema of decision-log schema version 1."""
    return StructType.fromDDL(", ".join(f"`{n}` {_DDL[t]}" for n, t in COLUMNS))


def _looks_like_json(path: str) -> bool:
    lower = path.lower().rstrip("/")
    if lower.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return True
    if "://" in path and not path.startswith("file://"):
        return False
    import glob
    import os

    local = path[len("file://"):] if path.startswith("file://") else path
    if os.path.isdir(local):
        has_json = glob.glob(os.path.join(local, "**", "*.jsonl"), recursive=True)
        has_parquet = glob.glob(os.path.join(local, "**", "*.parquet"), recursive=True)
        return bool(has_json) and not has_parquet
    return False


def read_events(spark: SparkSession, path: str, fmt: str = "auto") -> DataFrame:
    """Read a decision log (a file, a directory tree with ``date=`` partitions, a glob; local, hdfs://, s3a://).

    Columns missing from older files read as null; rows of another schema version are left out.
    """
    if fmt == "auto":
        fmt = "json" if _looks_like_json(path) else "parquet"
    reader = spark.read.schema(event_schema())
    df = reader.json(path) if fmt in ("json", "jsonl") else reader.parquet(path)
    df = df.select(*[n for n, _ in COLUMNS])
    return df.where(F.col("schema").isNull() | (F.col("schema") == SCHEMA_VERSION))


def amount_column(kind: str) -> Column:
    """Amount charged (or chargeable) to ``kind`` by an event: the logged ``{kind}_value``, else what the proxy
    would record for it (so usage is known even for traffic no quota applied to)."""
    api = F.col("api_key")
    if kind == "produce":
        fallback = F.when(api == 0, F.col("bytes_in").cast("double"))
    elif kind == "fetch":
        fallback = F.when(api == 1, F.col("bytes_out").cast("double"))
    elif kind == "request":
        # the proxy charges waits the client asked for as 0, and never charges SASL, ApiVersions, quota admin
        fallback = (F.when(api.isin(*NEVER_CHARGED_APIS), F.lit(None).cast("double"))
                    .when(api.isin(*WAITING_APIS), F.lit(0.0))
                    .otherwise(F.col("upstream_ms") / 10.0))
    elif kind == "mutation":
        fallback = F.when(api.isin(*MUTATION_APIS), F.col("mutations").cast("double"))
    elif kind == "pids":
        fallback = F.when(api == 0, F.col("new_pids").cast("double"))
    else:
        raise ValueError(kind)
    return F.coalesce(F.col(f"{kind}_value"), fallback)
