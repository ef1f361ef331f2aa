"""Command line: ``python -m spark_analysis INPUT --out DIR [--quotas FILE] [--master local[*]]``.

Also runnable as ``spark-submit spark_analysis/__main__.py INPUT --out DIR ...`` (then ``--master`` and memory
come from spark-submit's own flags).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # spark-submit runs this file as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_analysis.quota_config import KIND_KEYS, QuotaConfigError, _parse_value, load_quota_config  # noqa: E402


def _budgets(text: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.split(","):
        kind, _, value = part.partition("=")
        kind = kind.strip()
        if kind not in KIND_KEYS:
            raise SystemExit(f"--budget: unknown quota kind {kind!r}; use one of {', '.join(KIND_KEYS)}")
        try:
            out[kind] = _parse_value("--budget", kind, value.strip())
        except QuotaConfigError as exc:
            raise SystemExit(str(exc)) from None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m spark_analysis", description="Analyse kafka-throttle-proxy decision logs with Spark."
    )
    p.add_argument(
        "input",
        help="decision log: a file, directory or glob; local, hdfs://, s3a://...; or "
        "kafka://HOST:PORT/TOPIC (decision_log.topic, read with Spark's Kafka connector)",
    )
    p.add_argument("--out", required=True, help="output directory for Parquet tables and report.html")
    p.add_argument("--quotas", help="proposed quota config (YAML) to replay over the logged traffic")
    p.add_argument("--master", default=None, help="Spark master (default local[*]; ignored under spark-submit)")
    p.add_argument("--format", default="auto", choices=["auto", "parquet", "jsonl"], help="input format")
    p.add_argument("--window", type=int, default=10, help="usage window in seconds (default 10, ~Kafka's 11 x 1 s)")
    p.add_argument("--percentile", type=float, default=0.99, help="percentile for recommendations (default 0.99)")
    p.add_argument("--headroom", type=float, default=1.25, help="multiplier on the percentile (default 1.25)")
    p.add_argument("--budget", help="cluster budgets to split among users, e.g. produce=100MiB,fetch=200MiB")
    p.add_argument("--top", type=int, default=20, help="top offenders to list (default 20)")
    p.add_argument("--driver-memory", default="2g", help="driver memory when not under spark-submit (default 2g)")
    p.add_argument("--shuffle-partitions", type=int, default=None)
    p.add_argument("--ui", action="store_true", help="enable the Spark web UI")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not 0 < args.percentile < 1:
        raise SystemExit("--percentile must be between 0 and 1")
    if args.window < 1 or args.headroom <= 0:
        raise SystemExit("--window must be >= 1 and --headroom > 0")
    quotas = None
    if args.quotas:
        try:
            quotas = load_quota_config(args.quotas)
        except QuotaConfigError as exc:
            raise SystemExit(f"--quotas: {exc}") from None
    from spark_analysis.job import JobOptions, build_spark, run
    from spark_analysis.schema import KAFKA_CONNECTOR, kafka_input

    try:
        packages = [KAFKA_CONNECTOR] if kafka_input(args.input) else None
    except ValueError as exc:
        raise SystemExit(f"spark_analysis: {exc}") from None
    spark = build_spark(args.master, args.driver_memory, args.shuffle_partitions, args.ui, packages=packages)
    opts = JobOptions(
        input=args.input,
        out=args.out,
        fmt=args.format,
        quotas=quotas,
        quotas_path=args.quotas,
        window_s=args.window,
        percentile=args.percentile,
        headroom=args.headroom,
        budgets=_budgets(args.budget),
        top=args.top,
        report=not args.no_report,
    )
    try:
        result = run(spark, opts)
    finally:
        spark.stop()
    print(f"tables: {result.out}")
    if result.report_path:
        print(f"report: {result.report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
