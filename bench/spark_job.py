"""Scale benchmark of the decision-log analysis job, and of the decision-log writer itself.

    .venv/bin/python -m bench.spark_job [--events 10000000] [--master local[2]] [--no-replay] [--keep DIR]
    .venv/bin/python -m bench.spark_job writer [--events 300000]

Job mode: generates (once; cached in ``--data``) a synthetic log of ``--events`` events, runs the whole job
(every stage, the what-if replay of the synthetic live config and the HTML report) on ``--master`` and prints
wall time, events/s, the time per stage, and the peak RSS of the driver: the Python driver process and the JVM
it started (in local mode the JVM is also the executor), sampled every 0.2 s. The machine's load average is
printed too: on a shared 2-core box other work inflates every figure.

Writer mode: the cost of :meth:`proxy.decision_log.writer.DecisionLog.emit` on the caller's thread (the event loop),
and the background writer's throughput, for Parquet and JSON lines.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class RssSampler:
    """Peak RSS of this process and, separately, of its child processes (the Spark JVM and Python workers)."""

    def __init__(self, every: float = 0.2) -> None:
        self.me = psutil.Process()
        self.peak_driver_py = 0
        self.peak_jvm = 0
        self.peak_children = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._t.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.peak_driver_py = max(self.peak_driver_py, self.me.memory_info().rss)
                jvm = children = 0
                for c in self.me.children(recursive=True):
                    try:
                        rss = c.memory_info().rss
                        children += rss
                        if "java" in c.name():
                            jvm += rss
                    except psutil.Error:
                        pass
                self.peak_jvm = max(self.peak_jvm, jvm)
                self.peak_children = max(self.peak_children, children)
            except psutil.Error:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._t.join(1)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def bench_job(args: argparse.Namespace) -> int:
    from spark_analysis.job import JobOptions, build_spark, run
    from spark_analysis.quota_config import parse_quota_config
    from spark_analysis.synthetic import generate, live_config_yaml

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    data = Path(args.data or f"/tmp/ktp-spark-bench-{args.events}")
    marker = data / "_GENERATED"
    if not marker.exists():
        t = time.monotonic()
        info = generate(data, args.events, span_s=args.span, n_users=args.users, seed=1)
        marker.write_text(str(info))
        print(f"generated {info['events']:,} events in {time.monotonic() - t:.1f} s -> {data}", flush=True)
    out = args.keep or tempfile.mkdtemp(prefix="ktp-spark-bench-out-")
    import yaml

    quotas = None if args.no_replay else parse_quota_config(yaml.safe_load(live_config_yaml()))
    sampler = RssSampler()
    load_before = os.getloadavg()
    t0 = time.monotonic()
    spark = build_spark(args.master, args.driver_memory)
    t_session = time.monotonic() - t0
    opts = JobOptions(
        input=str(data), out=out, quotas=quotas, quotas_path="synthetic live config", budgets={"produce": 50 * 2**20}
    )
    t1 = time.monotonic()
    try:
        result = run(spark, opts)
    finally:
        spark.stop()
    wall = time.monotonic() - t1
    sampler.stop()
    events = int(result.overview.get("events") or 0)
    print()
    print(f"events          {events:,}")
    print(f"master          {args.master}, driver memory {args.driver_memory}")
    print(f"session start   {t_session:.1f} s")
    print(f"job wall time   {wall:.1f} s  ({events / wall:,.0f} events/s)")
    for name, took in result.timings:
        print(f"  {name:<34}{took:7.1f} s")
    print(
        f"peak RSS        python driver {_mib(sampler.peak_driver_py)}, JVM {_mib(sampler.peak_jvm)}, "
        f"all children (JVM + Python workers) {_mib(sampler.peak_children)}"
    )
    print(f"load average    before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} (2 cores)")
    print(f"report          {result.report_path}")
    return 0


def bench_writer(args: argparse.Namespace) -> int:
    from proxy.decision_log.writer import DecisionLog

    n = args.events

    def event(i: int) -> dict:
        return {
            "schema": 1,
            "event": "request",
            "ts_ms": 1_767_225_600_000 + i,
            "proxy": "p1",
            "conn": f"c{i % 50}",
            "user": "alice",
            "client_id": f"app-{i % 7}",
            "api_key": 0,
            "api_version": 9,
            "requests": 1,
            "bytes_in": 1234 + i % 100,
            "bytes_out": 100,
            "mutations": 0,
            "new_pids": 0,
            "upstream_ms": 2.5,
            "action": "pass",
            "throttle_ms": 0,
            "shadow": False,
            "produce_value": 1234.0,
            "produce_limit": 1e6,
            "produce_throttle_ms": 0,
            "request_value": 0.25,
            "request_limit": 50.0,
            "request_throttle_ms": 0,
            "rejected_topics": 0,
            "scope": "broker 1",
            "req_ts_ms": 1_767_225_600_000,
        }

    events = [event(i) for i in range(n)]
    print(f"{n:,} events of {len(events[0])} keys; load average {os.getloadavg()[0]:.1f} (2 cores)")
    for fmt in ("parquet", "jsonl"):
        d = tempfile.mkdtemp(prefix=f"ktp-dlog-{fmt}-")
        # 1) emit cost alone: the writer sleeps (long flush interval) while the caller emits.
        log = DecisionLog(d, "p1", fmt=fmt, max_queue=n + 1, flush_interval=3600)
        emit = log.emit
        t = time.perf_counter()
        for e in events:
            emit(e)
        emit_s = time.perf_counter() - t
        t = time.perf_counter()
        log.close()
        write_s = time.perf_counter() - t
        size = sum(os.path.getsize(f) for f in glob.glob(f"{d}/date=*/*"))
        # 2) emit cost while the writer runs concurrently (it competes for the GIL, as in the proxy).
        d2 = tempfile.mkdtemp(prefix=f"ktp-dlog-{fmt}-")
        log2 = DecisionLog(d2, "p1", fmt=fmt, max_queue=n + 1, flush_interval=0.05)
        t = time.perf_counter()
        for e in events:
            log2.emit(e)
        emit2_s = time.perf_counter() - t
        log2.close()
        print(
            f"{fmt:8} emit {emit_s / n * 1e9:6.0f} ns/event ({n / emit_s / 1e6:.2f} M/s) idle writer, "
            f"{emit2_s / n * 1e9:6.0f} ns/event with the writer running | writer {n / write_s:,.0f} events/s | "
            f"{size / n:.1f} bytes/event on disk | files {log.files}, dropped {log.dropped + log2.dropped}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spark_job", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="job", choices=["job", "writer"])
    p.add_argument("--events", type=int, default=None, help="default 10,000,000 (job) / 300,000 (writer)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--span", type=int, default=3600, help="seconds of synthetic traffic")
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--data", help="where the synthetic log is generated / reused")
    p.add_argument("--keep", help="output directory (default: a temporary one)")
    p.add_argument("--no-replay", action="store_true", help="skip the what-if replay")
    args = p.parse_args(argv)
    if args.mode == "writer":
        args.events = args.events or 300_000
        return bench_writer(args)
    args.events = args.events or 10_000_000
    return bench_job(args)


if __name__ == "__main__":
    raise SystemExit(main())
