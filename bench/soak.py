"""Soak: a proxy with every quota on, under steady mixed load with churn, sampled every minute for growth.

    nice -n 15 .venv/bin/python -m bench.soak [--minutes 30] [--warmup 3] [--interval 60] [--quick]
    .venv/bin/python -m bench.soak --fit SAMPLES [--warmup 3]   # the table again from a run's samples

One single-broker KRaft cluster (it measures growth, not speed: run it niced, outside the measured cluster lock)
and one proxy in front of it with every quota kind configured, bucket expiry short (``entity_idle_seconds``) and
the producer-id window short, so expiry happens many times within the run. The load, all through the proxy:

- a steady idempotent producer and a consumer group on ``soak-main`` (confluent-kafka);
- a producer over its ``producer_byte_rate`` (throttled all the time), whose quota is altered every few minutes
  through the proxy's AlterClientQuotas (``kafka-throttle-proxy quotas alter``);
- short raw connections, each with a new client id (ApiVersions + Metadata, every 20th closed with its request
  unanswered): a new ``request_percentage`` bucket each, which must expire;
- short-lived idempotent producers with new client ids (a new producer id each: KIP-936's bloom filters);
- kcat consumers and short consumer groups with new client and group ids;
- an admin client creating a topic and deleting the previous one (KIP-599).

Sampled every ``--interval`` seconds from outside: RSS and threads (``/proc/<pid>/status``), open file descriptors
(``/proc/<pid>/fd``), and from the metrics port: connections, asyncio tasks, tracked quota buckets (series of
``ktp_*_quota_limit``: one per bucket, with ``metrics.max_entity_series`` set above any count reached),
producer-id bloom users and bytes, the decision-log queue, the request pool. Each quantity's samples after the
warm-up get a least-squares slope per hour with its 95 % interval (Student's t) and a verdict: ``flat`` when the
interval includes 0, ``within noise`` when it does not but the fitted change over the run is below
``--tolerance`` (5 %) of the mean level, ``falls``, or ``GROWS``. Minute samples of a saw-tooth (buckets made
and expired) are autocorrelated, so the interval is narrower than an independent-sample one would be: the
tolerance is what keeps a trivially small slope from reading as a leak.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.harness import KafkaCluster, free_port
from tests.support import ProxyProcess, http_get

TOPIC = "soak-main"
THROTTLED = "soak-throttled"
THROTTLED_RATES = (32 * 1024, 48 * 1024)  # alternated through AlterClientQuotas
MiB = 1 << 20

QUANTITIES: tuple[tuple[str, str], ...] = (
    ("rss_mib", "RSS, MiB"),
    ("fds", "open file descriptors"),
    ("threads", "threads"),
    ("tasks", "asyncio tasks"),
    ("buckets", "tracked quota buckets"),
    ("connections", "client connections"),
    ("pid_users", "producer-id bloom users"),
    ("pid_bytes", "producer-id bloom bytes"),
    ("dlog_queued", "decision-log queue"),
    ("pool_bytes", "request pool bytes"),
)
"""(key of a sample, label in the table): what is fitted."""


# ---------------------------------------------------------------------------------------------- pure: fitting


@dataclass(frozen=True)
class Fit:
    n: int
    slope: float
    """Per hour."""
    lo: float
    hi: float
    """The slope's 95 % interval."""
    mean: float
    span_h: float


T_975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
"""Student's t 0.975 quantile for 1 to 30 degrees of freedom (the printed table)."""


def t_975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to 30 degrees of freedom, beyond it a Cornish-Fisher expansion
    about the normal's (off by less than 0.01 % there)."""
    if df < 1:
        return math.inf
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959963984540054
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def fit_slope(hours: Sequence[float], values: Sequence[float]) -> Fit:
    """Least-squares line through (hours, values): the slope per hour and its 95 % interval. Fewer than 3 points
    give an infinite interval; values all equal give slope 0 and the interval [0, 0]."""
    n = len(hours)
    if n != len(values):
        raise ValueError("hours and values differ in length")
    if n < 2:
        raise ValueError("a slope needs at least two samples")
    mx = sum(hours) / n
    my = sum(values) / n
    sxx = sum((x - mx) ** 2 for x in hours)
    if sxx == 0:
        raise ValueError("all samples at one time")
    slope = sum((x - mx) * (y - my) for x, y in zip(hours, values, strict=True)) / sxx
    span = max(hours) - min(hours)
    if n < 3:
        return Fit(n, slope, -math.inf, math.inf, my, span)
    ssr = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(hours, values, strict=True))
    se = math.sqrt(ssr / (n - 2) / sxx)
    half = t_975(n - 2) * se
    return Fit(n, slope, slope - half, slope + half, my, span)


def verdict(fit: Fit, tolerance: float = 0.05) -> str:
    """``flat``: the 95 % interval includes 0. ``within noise``: it does not, but the fitted change over the run
    (slope × span) is below ``tolerance`` of the mean level. ``falls``: a significant decrease beyond that.
    ``GROWS``: a significant increase beyond it."""
    if fit.lo <= 0 <= fit.hi:
        return "flat"
    change = fit.slope * fit.span_h
    if abs(change) <= tolerance * abs(fit.mean):
        return "within noise"
    return "falls" if change < 0 else "GROWS"


# ---------------------------------------------------------------------------------------------- pure: parsing


def parse_metrics(text: str) -> dict[str, float]:
    """The gauges the soak watches from one /metrics page; ``buckets`` is the number of ``ktp_*_quota_limit``
    series (each quota bucket exports exactly one)."""
    out: dict[str, float] = {"buckets": 0.0}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_quota_limit"):
            out["buckets"] += sum(1 for s in fam.samples if s.labels.get("client_id") != "__other__")
            continue
        if fam.name == "ktp_quota_decisions":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    key = f"decisions_{s.labels.get('quota')}_{s.labels.get('action')}"
                    out[key] = out.get(key, 0.0) + s.value
            continue
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def proc_sample(pid: int) -> dict[str, float]:
    """RSS (MiB) and threads from /proc/<pid>/status, open descriptors from /proc/<pid>/fd."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields["VmRSS"].split()[0])
    return {
        "rss_mib": rss_kib / 1024,
        "threads": float(fields["Threads"].strip()),
        "fds": float(len(os.listdir(f"/proc/{pid}/fd"))),
    }


def sample(pid: int, metrics_port: int) -> dict[str, float]:
    s = proc_sample(pid)
    code, text = http_get(metrics_port, "/metrics", timeout=30)
    if code != 200:
        raise RuntimeError(f"metrics port answered {code}")
    m = parse_metrics(text)
    s.update(
        tasks=m.get("ktp_asyncio_tasks", math.nan),
        buckets=m["buckets"],
        connections=m.get("ktp_connections", math.nan),
        pid_users=m.get("ktp_producerids_cache_users", math.nan),
        pid_bytes=m.get("ktp_producerids_cache_bytes", math.nan),
        dlog_queued=m.get("ktp_decision_log_queued", math.nan),
        pool_bytes=m.get("ktp_request_pool_used_bytes", math.nan),
        accepted=m.get("ktp_connections_accepted_total", math.nan),
        throttles=sum(v for k, v in m.items() if k.startswith("decisions_") and not k.endswith("_pass")),
    )
    return s


# ---------------------------------------------------------------------------------------------- load


class Load:
    """The workload threads; each counts what it did and the errors it met, and stops on ``stop``."""

    def __init__(self, bootstrap: str, stop: threading.Event, scale: float = 1.0) -> None:
        self.bootstrap = bootstrap
        self.host, port = bootstrap.rsplit(":", 1)
        self.port = int(port)
        self.stop = stop
        self.scale = scale
        """Multiplies the pauses between churn events (1: the soak's rates)."""
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _loop(self, name: str, every: float, step: Callable[[int], None]) -> None:
        i = 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                step(i)
            except Exception as exc:  # noqa: BLE001 - a failed step is counted, the soak goes on
                with self._lock:
                    self.errors[f"{name}: {type(exc).__name__}: {str(exc)[:80]}"] += 1
            i += 1
            self.stop.wait(max(0.0, every * self.scale - (time.monotonic() - t0)))

    def start(self) -> None:
        jobs: list[tuple[str, Callable[[], None]]] = [
            ("steady-producer", lambda: self._producer("soak-steady", 100)),
            # small batches and queue: at 32 KiB/s a default 1 MB batch waits longer than a request may
            ("throttled-producer", lambda: self._producer(THROTTLED, 100, **{"batch.size": 16384})),
            ("steady-consumer", self._consumer),
            ("raw-churn", lambda: self._loop("raw-churn", 0.5, self._raw_connection)),
            ("idempotent-churn", lambda: self._loop("idempotent-churn", 5, self._short_producer)),
            ("kcat-churn", lambda: self._loop("kcat-churn", 15, self._kcat)),
            ("group-churn", lambda: self._loop("group-churn", 30, self._short_group)),
            ("admin-churn", lambda: self._loop("admin-churn", 30, self._admin)),
            ("quota-alter", lambda: self._loop("quota-alter", 120, self._alter_quota)),
        ]
        for name, target in jobs:
            t = threading.Thread(target=self._guard(name, target), name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def _guard(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self.stop.is_set():
                try:
                    target()
                except Exception as exc:  # noqa: BLE001 - restarted after a pause, and counted
                    with self._lock:
                        self.errors[f"{name}: {type(exc).__name__}: {str(exc)[:80]}"] += 1
                    self.stop.wait(5)

        return run

    # the long-lived clients

    def _producer(self, client_id: str, per_s: int, **conf: object) -> None:
        from confluent_kafka import Producer

        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": client_id,
                "enable.idempotence": True,
                "linger.ms": 20,
                "queue.buffering.max.kbytes": 256,
                **conf,
            }
        )
        value = os.urandom(1024)
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                for _ in range(per_s // 10):
                    try:
                        p.produce(TOPIC, value, on_delivery=self._delivered)
                    except BufferError:
                        self.count(f"{client_id} queue full")
                        break
                p.poll(0)
                self.stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))
        finally:
            p.purge()  # what a throttled producer still holds is not waited for at the end
            p.flush(10)

    def _delivered(self, err: object, _msg: object) -> None:
        if err is None:
            self.count("records delivered")
        else:  # purged at the end (a throttled producer's backlog), or a real failure while running
            self.count("records purged at the end" if self.stop.is_set() else "delivery errors")

    def _consumer(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "soak-group",
                "client.id": "soak-consumer",
                "auto.offset.reset": "latest",
            }
        )
        c.subscribe([TOPIC])
        try:
            while not self.stop.is_set():
                msgs = c.consume(500, 1.0)
                self.count("records consumed", len(msgs))
        finally:
            c.close()

    # churn

    def _raw_connection(self, i: int) -> None:
        cid = f"churn-{i}".encode()
        head = struct.pack(">h", len(cid)) + cid
        api_versions = struct.pack(">hhi", 18, 0, 1) + head
        metadata = struct.pack(">hhi", 3, 1, 2) + head + struct.pack(">i", 0)  # Metadata v1, no topics
        with socket.create_connection((self.host, self.port), timeout=30) as s:
            s.sendall(b"".join(struct.pack(">i", len(b)) + b for b in (api_versions, metadata)))
            if i % 20 == 19:
                self.count("raw connections dropped mid-request")
                return  # closed with its requests in flight
            _read_frames(s, 2)
        self.count("raw connections")

    def _short_producer(self, i: int) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "client.id": f"idem-{i}", "enable.idempotence": True})
        for k in range(20):
            p.produce(TOPIC, f"idem-{i}-{k}".encode())
        left = p.flush(30)
        self.count("short idempotent producers")
        if left:
            self.count("short producer records unsent", left)

    def _kcat(self, i: int) -> None:
        subprocess.run(
            ["kcat", "-b", self.bootstrap, "-C", "-t", TOPIC, "-o", "-50", "-e", "-q", "-X", f"client.id=kcat-{i}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=True,
        )
        self.count("kcat consumers")

    def _short_group(self, i: int) -> None:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"soak-short-{i}",
                "client.id": f"group-{i}",
                "auto.offset.reset": "latest",
                "session.timeout.ms": 10000,
            }
        )
        c.subscribe([TOPIC])
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not self.stop.is_set():
            self.count("records consumed by short groups", len(c.consume(500, 0.5)))
        c.close()
        self.count("short consumer groups")

    def _admin(self, i: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        a = AdminClient({"bootstrap.servers": self.bootstrap, "client.id": f"admin-{i}"})
        for fut in a.create_topics([NewTopic(f"soak-tmp-{i}", 2, 1)], operation_timeout=20).values():
            fut.result(30)
        self.count("topics created")
        if i > 0:
            for fut in a.delete_topics([f"soak-tmp-{i - 1}"], operation_timeout=20).values():
                fut.result(30)
            self.count("topics deleted")

    def _alter_quota(self, i: int) -> None:
        rate = THROTTLED_RATES[i % 2]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy.cli",
                "quotas",
                "--bootstrap-server",
                self.bootstrap,
                "alter",
                "--client-id",
                THROTTLED,
                "--add-config",
                f"producer_byte_rate={rate}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
            check=True,
        )
        self.count("quota alterations")


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30).values():
        fut.result(60)


def _read_frames(s: socket.socket, n: int) -> None:
    buf = b""
    while n:
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(1 << 16)
            if not chunk:
                raise ConnectionError("proxy closed the connection")
            buf += chunk
        buf = buf[4 + int.from_bytes(buf[:4], "big") :]
        n -= 1


# ---------------------------------------------------------------------------------------------- the run


def proxy_settings(workdir: Path, metrics_port: int, idle_s: float) -> dict[str, object]:
    return {
        "metrics.port": metrics_port,
        "quotas.enforcement": "smooth",
        "quotas.entity_idle_seconds": idle_s,
        "quotas.producer_id_window_size_seconds": 10.0,  # 11 windows: ids forgotten after about 2 minutes
        "quotas.admins": ["ANONYMOUS"],
        "metrics.max_entity_series": 100_000,  # every bucket named: the soak counts them
        "decision_log.directory": str(workdir / "decision-log"),
        "log_level": "WARNING",
        "quotas.entities": [
            {
                "entity": {"client-id": "<default>"},
                "quotas": {
                    "producer_byte_rate": 4 * MiB,
                    "consumer_byte_rate": 8 * MiB,
                    "request_percentage": 200,
                    "controller_mutation_rate": 10,
                },
            },
            {"entity": {"user": "<default>"}, "quotas": {"producer_ids_rate": 50}},
            {"entity": {"client-id": THROTTLED}, "quotas": {"producer_byte_rate": THROTTLED_RATES[0]}},
        ],
    }


def _fmt(x: float) -> str:
    if math.isinf(x) or math.isnan(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(samples: list[dict[str, float]], warmup_min: float, tolerance: float) -> list[str]:
    fitted = [s for s in samples if s["t_min"] >= warmup_min]
    hours = [s["t_min"] / 60 for s in fitted]
    lines = [
        "| quantity | first | last | min–max | slope per hour | 95 % interval "
        "| change over the run, % of mean | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, label in QUANTITIES:
        ys = [s[key] for s in fitted]
        if any(math.isnan(y) for y in ys):
            lines.append(f"| {label} | not exported | | | | | | |")
            continue
        f = fit_slope(hours, ys)
        pct = 100 * f.slope * f.span_h / f.mean if f.mean else 0.0
        lines.append(
            f"| {label} | {_fmt(ys[0])} | {_fmt(ys[-1])} | {_fmt(min(ys))}–{_fmt(max(ys))} | {_fmt(f.slope)} | "
            f"{_fmt(f.lo)} … {_fmt(f.hi)} | {pct:+.1f} % | {verdict(f, tolerance)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30, help="the fitted span, after the warm-up (default 30)")
    ap.add_argument("--warmup", type=float, default=3, help="minutes of load before the fitted samples")
    ap.add_argument("--interval", type=float, default=60, help="seconds between samples")
    ap.add_argument("--idle", type=float, default=60, help="quotas.entity_idle_seconds (bucket expiry)")
    ap.add_argument("--tolerance", type=float, default=0.05, help="'within noise' bound: change / mean level")
    ap.add_argument("--quick", action="store_true", help="a check of the machinery: 3 minutes, 10 s samples")
    ap.add_argument("--samples", type=Path, help="also write every sample here (JSON lines)")
    ap.add_argument(
        "--fit",
        type=Path,
        metavar="SAMPLES",
        help="no run: fit the samples a run wrote (JSON lines) and print the table, with --warmup and --tolerance",
    )
    args = ap.parse_args(argv)
    if args.fit is not None:
        recorded = [json.loads(line) for line in args.fit.read_text().splitlines() if line.strip()]
        print("\n".join(table(recorded, args.warmup, args.tolerance)))
        return 0
    if args.quick:
        args.minutes, args.warmup, args.interval, args.idle = 2.5, 0.5, 10, 20
    workdir = Path(tempfile.mkdtemp(prefix="ktp-soak-"))
    samples_path = args.samples or workdir / "samples.jsonl"
    mport = free_port()
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    samples: list[dict[str, float]] = []
    with KafkaCluster(1, workdir=workdir / "kafka") as cluster:
        _create_topic(cluster.bootstrap, TOPIC, 3)
        proxy = ProxyProcess(workdir, cluster.bootstrap, proxy_settings(workdir, mport, args.idle)).start()
        stop = threading.Event()
        load = Load(proxy.bootstrap, stop)
        try:
            pid = proxy.process.pid
            load.start()
            t0 = time.monotonic()
            total_s = (args.warmup + args.minutes) * 60
            k = 0
            with samples_path.open("w") as out:
                while True:
                    due = t0 + k * args.interval
                    if due > t0 + total_s + 1e-6:
                        break
                    time.sleep(max(0.0, due - time.monotonic()))
                    if not proxy.alive():
                        raise RuntimeError(f"the proxy exited:\n{proxy.log()[-3000:]}")
                    s = sample(pid, mport)
                    s["t_min"] = (time.monotonic() - t0) / 60
                    s["load1"] = os.getloadavg()[0]
                    samples.append(s)
                    out.write(json.dumps(s) + "\n")
                    out.flush()
                    print(
                        f"{s['t_min']:5.1f} min  rss {s['rss_mib']:.1f} MiB  fds {s['fds']:.0f}  "
                        f"tasks {s['tasks']:.0f}  buckets {s['buckets']:.0f}  conns {s['connections']:.0f}  "
                        f"pid users {s['pid_users']:.0f} bytes {s['pid_bytes']:.0f}  "
                        f"dlog queued {s['dlog_queued']:.0f}  load {s['load1']:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
                    k += 1
        finally:
            stop.set()
            for t in load.threads:
                t.join(40)
            proxy.terminate()
    warnings = [ln for ln in proxy.log().splitlines() if "WARNING" in ln or "ERROR" in ln]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    print(
        f"# bench.soak, started {started}, commit {commit}, load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"1-min load over the run median {statistics.median(s['load1'] for s in samples):.2f}"
    )
    print(f"`python -m bench.soak {argv_text}`; samples in {samples_path}\n")
    print(
        f"{len(samples)} samples every {args.interval:g} s; fitted: those at or after {args.warmup:g} min "
        f"({sum(1 for s in samples if s['t_min'] >= args.warmup)}), bucket expiry {args.idle:g} s\n"
    )
    print("\n".join(table(samples, args.warmup, args.tolerance)))
    last, first = samples[-1], samples[0]
    print(
        f"\nconnections accepted {last['accepted'] - first['accepted']:,.0f}, quota decisions other than pass "
        f"{last['throttles'] - first['throttles']:,.0f}"
    )
    print("load: " + ", ".join(f"{k} {v:,}" for k, v in sorted(load.counts.items())))
    print("client errors: " + (", ".join(f"{k} ×{v}" for k, v in load.errors.most_common(8)) or "none"))
    print(f"proxy WARNING/ERROR lines: {len(warnings)}")
    for ln in warnings[:5]:
        print(f"  {ln[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
