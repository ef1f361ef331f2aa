"""The analysis job on a real Spark standalone cluster (master + worker on loopback), whose worker has its own
Python with only pyspark, pandas and pyarrow, outside the repository: everything the executors import must be
shipped by the job. Run as an operator would: ``python -m spark_analysis LOG --out DIR --quotas FILE --master
spark://...``, then the what-if tables are read back and held against the quota code run directly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from proxy.decision_log.writer import DecisionLog
from spark_analysis.quota_config import parse_quota_config
from spark_analysis.synthetic import NOISY_USER, ProxySimulator, small_traffic
from tests.harness.spark import SparkStandalone, bare_env
from tests.unit.test_spark_analysis import LIVE

REPO = Path(__file__).resolve().parents[2]


def _log(directory: Path) -> list[dict]:
    decided = list(ProxySimulator(parse_quota_config(yaml.safe_load(LIVE))).run(small_traffic(6000, span_s=120)))
    log = DecisionLog(directory, "p1", rotate_bytes=50_000, flush_interval=0.01)
    for e in decided:
        assert log.emit(e)
    while log.queued:
        time.sleep(0.01)
    log.close()
    return decided


def test_job_runs_on_a_standalone_cluster_whose_workers_cannot_see_the_repository(tmp_path):
    decided = _log(tmp_path / "log")
    quotas = tmp_path / "live.yaml"
    quotas.write_text(LIVE)
    with SparkStandalone(tmp_path / "spark") as spark:
        # The worker's Python really is bare: neither this repository nor its other requirements import there.
        for module in ("protocol", "quotas", "yaml", "mmh3"):
            probe = subprocess.run(
                [str(spark.python), "-c", f"import {module}"],
                cwd=spark.root,
                env=bare_env(),
                capture_output=True,
                text=True,
            )
            assert probe.returncode != 0, f"{module} must not be importable by the worker's Python"
        # The driver runs from this checkout; the executors run the worker's Python, as on a real cluster.
        env = bare_env(PYSPARK_PYTHON=str(spark.python), PYSPARK_DRIVER_PYTHON=sys.executable)
        started = time.monotonic()
        job = subprocess.run(
            [
                sys.executable,
                "-m",
                "spark_analysis",
                str(tmp_path / "log"),
                "--out",
                str(tmp_path / "out"),
                "--quotas",
                str(quotas),
                "--master",
                spark.master,
                "--driver-memory",
                "1g",
                "--no-report",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        wall = time.monotonic() - started
        executor_logs = spark.executor_logs()
    assert job.returncode == 0, (job.stdout[-3000:], job.stderr[-5000:], executor_logs[-3000:])
    assert executor_logs, "no executor ran on the worker"
    print(f"{len(decided)} events analysed on {spark.master} in {wall:.1f} s")
    summary = pd.read_parquet(tmp_path / "out" / "whatif_summary")
    charges = pd.read_parquet(tmp_path / "out" / "whatif_charges")
    assert len(charges) > 0
    # Replaying the live config on the cluster reproduces every decision the quota code made directly.
    assert any(e["user"] == NOISY_USER and e["throttle_ms"] > 0 for e in decided)
    noisy = summary[summary["bucket_user"] == NOISY_USER]
    assert len(noisy) > 0 and noisy["throttled"].sum() > 0, summary
    logged = charges[charges["logged_throttle_ms"].notna() & (charges["event"] == "request")]
    assert len(logged) > 0
    differ = logged[logged["throttle_ms"] != logged["logged_throttle_ms"]]
    assert len(differ) == 0, differ.head()
