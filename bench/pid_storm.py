"""A KIP-936 storm: many short-lived idempotent producers of one user over ``producer_ids_rate``.

    .venv/bin/python -m bench.pid_storm [--seconds 60] [--threads 8] [--quota 10] [--window 5]

Threads each create a brand-new idempotent producer (librdkafka) as user alice, produce one record, flush and
close it, again and again (the KIP's misbehaving pattern, several at once); one more thread does the same as
bob, who has no quota (the control). The proxy fronts the cluster's SASL listener (SCRAM-SHA-512) with
``producer_ids_rate: QUOTA`` per ``WINDOW`` s window for alice. Printed: new producer ids admitted per window
(alice's producers bucketed by when their record was delivered), producers started and delivered, how long
each one took (the hold), connections the proxy closed (log lines and ``ktp_connection_errors_total``),
ERROR/Traceback lines, and proxy RSS at the start, peak and end. Traffic to 127.0.0.1 only; bounded in time.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
from confluent_kafka import Producer

from tests.harness import KafkaCluster, free_port
from tests.harness.measure import percentile
from tests.support import ProxyProcess

Runs = dict[str, list[tuple[float, float, bool]]]
"""Per user, each producer's (start, done, delivered)."""


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--quota", type=int, default=10)
    ap.add_argument("--window", type=int, default=5)
    return ap.parse_args(argv)


def _storm(cluster: KafkaCluster, proxy: ProxyProcess, args: argparse.Namespace) -> tuple[Runs, tuple[int, int, int]]:
    """alice's threads and bob's one making producer after producer until ``--seconds`` are up; returns their
    runs and the proxy's RSS (start, peak, end)."""
    topic = f"storm-{uuid.uuid4().hex[:6]}"
    runs: Runs = {"alice": [], "bob": []}
    lock = threading.Lock()

    def storm(user: str, deadline: float) -> None:
        conf = {
            **cluster.client_config(user, "SCRAM-SHA-512"),
            "bootstrap.servers": proxy.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 120_000,
        }
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            p = Producer(conf)
            p.produce(topic, value=user.encode())
            ok = p.flush(150) == 0
            with lock:
                runs[user].append((t0, time.monotonic(), ok))

    warm = Producer({**cluster.client_config("bob", "SCRAM-SHA-512"), "bootstrap.servers": proxy.bootstrap})
    warm.produce(topic, b"create the topic")
    warm.flush(60)
    proc = psutil.Process(proxy.process.pid)
    rss_start = peak = proc.memory_info().rss
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=storm, args=("alice", deadline)) for _ in range(args.threads)]
    threads.append(threading.Thread(target=storm, args=("bob", deadline)))
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline + 300:
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.5)
    for t in threads:
        t.join(300)
    return runs, (rss_start, peak, proc.memory_info().rss)


def _per_window(delivered: list[float], window: int) -> list[int]:
    """alice's deliveries counted per whole ``window`` s from the first (the last, partial window dropped)."""
    if not delivered:
        return []
    first = delivered[0]
    n_windows = int((delivered[-1] - first) // window)
    per_window = [0] * n_windows
    for done in delivered:
        w = int((done - first) // window)
        if w < n_windows:
            per_window[w] += 1
    return per_window


def _report(args: argparse.Namespace, runs: Runs, rss: tuple[int, int, int], log: str, metrics: str) -> int:
    """Print the table; 0 when the proxy closed no connection and logged no error, else 1."""
    closed_lines = sum(1 for ln in log.splitlines() if "closing the connection" in ln)
    closed_metric = sum(
        float(m.group(1)) for m in re.finditer(r"^ktp_connection_errors_total\{.*\} (\S+)$", metrics, re.M)
    )
    errors = sum(1 for ln in log.splitlines() if "ERROR" in ln or "Traceback" in ln or "never awaited" in ln)
    alice = runs["alice"]
    delivered = sorted(done for _t0, done, ok in alice if ok)
    per_window = _per_window(delivered, args.window)
    took = sorted(done - t0 for t0, done, ok in alice if ok)
    bob_took = sorted(done - t0 for t0, done, ok in runs["bob"] if ok)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    mib = 1 << 20
    print(
        f"# bench.pid_storm, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"`python -m bench.pid_storm --seconds {args.seconds:g} --threads {args.threads} --quota {args.quota} "
        f"--window {args.window}`: alice (quota {args.quota} new ids / {args.window} s) in {args.threads} threads, "
        "bob (no quota) in one\n"
    )
    print("| figure | value |")
    print("|---|---|")
    print(f"| alice producers started / delivered | {len(alice)} / {len(delivered)} |")
    if per_window:
        print(
            f"| admitted per {args.window} s window (median, max; first window incl. burst) | "
            f"{statistics.median(per_window):g}, {max(per_window)}; {per_window} |"
        )
    if took:
        print(
            f"| alice producer lifetime s (p50 / p90 / max) | {percentile(took, 50):.2f} / "
            f"{percentile(took, 90):.2f} / {took[-1]:.2f} |"
        )
    if bob_took:
        print(
            f"| bob producers, lifetime s (p50 / max) | {len(bob_took)}, {percentile(bob_took, 50):.2f} / "
            f"{bob_took[-1]:.2f} |"
        )
    print(f"| connections closed by the proxy (log lines / metric) | {closed_lines} / {closed_metric:g} |")
    print(f"| ERROR / Traceback / never-awaited lines | {errors} |")
    rss_start, peak, rss_end = rss
    print(f"| proxy RSS MiB (start / peak / end) | {rss_start / mib:.0f} / {peak / mib:.0f} / {rss_end / mib:.0f} |")
    return 0 if closed_lines == 0 and errors == 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    workdir = Path(tempfile.mkdtemp(prefix="ktp-pid-storm-"))
    with KafkaCluster(3, workdir=workdir / "kafka", server_props={"auto.create.topics.enable": "true"}) as cluster:
        port = free_port()
        proxy = ProxyProcess(
            workdir,
            cluster.sasl_bootstrap,
            {
                "metrics.port": port,
                "quotas.producer_id_window_num": 2,
                "quotas.producer_id_window_size_seconds": args.window,
                "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"producer_ids_rate": args.quota}}],
            },
        ).start()
        try:
            runs, rss = _storm(cluster, proxy, args)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        finally:
            proxy.terminate()
        log = proxy.log()
    return _report(args, runs, rss, log, metrics)


if __name__ == "__main__":
    raise SystemExit(main())
