"""Pass-through cost of the proxy: real Kafka clients direct to a 3-broker cluster vs through the proxy.

    .venv/bin/python -m bench.run [--records N] [--repeats R] [--quick] [--profile] [--output PATH]

Why it is built this way:
  * One cluster, one topic (3 partitions, RF 3) and one proxy process for every measurement, so the
    only difference between a "direct" and a "proxy" sample is the extra hop.
  * Direct and proxy runs are interleaved per workload (ABBA order across repeats) and the medians are
    compared: the machine is small and noisy, so drift over the run must hit both sides alike.
  * Two client stacks (Java: producer/consumer-perf-test; librdkafka: kcat, confluent-kafka), because
    they batch and pipeline differently and a proxy can be fine for one and a bottleneck for the other.
  * Java perf tools print latency percentiles in whole milliseconds, too coarse for a 0.2 ms target, so
    a sequential confluent-kafka producer (one 1 KiB acks=all record in flight at a time) measures
    round trips with sub-millisecond resolution.
  * The proxy's CPU (its threads' schedstat before/after each proxy run, tests.harness.process_tree's
    cpu_reading) shows how close it is to saturating its single event-loop thread, which is what limits a
    Python proxy.
  * Peer proxies (``--kroxylicious``, ``--kafka-proxy``: Kroxylicious and grepplabs kafka-proxy, see
    bench/peers.py) can run as further sides, started once like ours and measured the same way (CPU of
    their process tree), so their CPU per GiB and per round trip stand beside ours.
  * Profiling (``--profile``) attaches py-spy to the same warm proxy only after all measurements, so the
    numbers in the table are never taken under a profiler.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.peers import PEER_ENV, PEER_NAMES, PEER_SIDES, PeerProcess, start_peers
from tests.harness import KafkaCluster
from tests.harness.measure import percentile
from tests.harness.process_tree import cpu_between, cpu_reading, tree_peak_rss
from tests.support import REPO, ProxyProcess

TOPIC = "bench"
RECORD = 1024
MIB = 1024 * 1024
PERF_JVM = ("-Xmx512m",)  # full tiered JIT: the harness's C1-only tool default would make the client the bottleneck
THROUGHPUT_TARGET = 0.95  # proxy/direct
QUOTAS_TARGET = 0.90  # (proxy with every quota configured, none binding)/direct: issue 5
LATENCY_TARGET_MS = 0.2  # added p50
SIDES = ("direct", "proxy", "quotas")
"""Where a workload's clients connect: the cluster itself; a proxy with no quota configured; a second proxy
with every quota kind configured at a value no client reaches, so every request is charged and checked."""
HUGE_QUOTAS = {
    "producer_byte_rate": 10**15,
    "consumer_byte_rate": 10**15,
    "request_percentage": 10**6,
    "controller_mutation_rate": 10**9,
}
TARGETS = {"proxy": THROUGHPUT_TARGET, "quotas": QUOTAS_TARGET}  # peers' sides (bench.peers) have none
ALL_SIDES = (*SIDES, *PEER_SIDES)
PROFILE_DIR = REPO / "bench" / "profiles"

Metrics = dict[str, float]  # "_active_s": seconds of actual work in the run (for the proxy's % of a core)


def _run(cmd: list[str], timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a client to completion; fail loudly (a silently failed run would be a fake number)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd[:3])}… exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p, wall


_PERF_LINE = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"[\d.]+ ms max latency, (\d+) ms 50th, \d+ ms 95th, (\d+) ms 99th"
)


def java_produce(cluster: KafkaCluster, bootstrap: str, n: int, throughput: int) -> Metrics:
    """producer-perf-test, 1 KiB records, acks=all, other producer settings at their defaults."""
    cmd = cluster.tool_cmd(
        "producer_perf", "--bootstrap-server", bootstrap, "--topic", TOPIC, "--num-records", str(n),
        "--record-size", str(RECORD), "--throughput", str(throughput), "--command-property", "acks=all",
        jvm_opts=PERF_JVM,
    )  # fmt: skip
    p, _ = _run(cmd)
    found = _PERF_LINE.findall(p.stdout)
    if not found or int(found[-1][0]) != n:
        raise RuntimeError(f"producer-perf-test summary missing or short:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    _, rps, mbps, avg, p50, p99 = map(float, found[-1])
    return {"rps": rps, "mbps": mbps, "avg": avg, "p50": p50, "p99": p99, "_active_s": n / rps}


def java_consume(cluster: KafkaCluster, bootstrap: str, n: int) -> Metrics:
    """consumer-perf-test from the beginning with a fresh group; fetch MB/s excludes the group join."""
    cmd = cluster.tool_cmd(
        "consumer_perf", "--bootstrap-server", bootstrap, "--topic", TOPIC, "--num-records", str(n),
        "--group", f"bench-{time.time_ns()}", "--timeout", "30000", jvm_opts=PERF_JVM,
    )  # fmt: skip
    p, _ = _run(cmd)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    i = next(i for i, ln in enumerate(lines) if ln.startswith("start.time"))
    row = dict(zip((h.strip() for h in lines[i].split(",")), (v.strip() for v in lines[i + 1].split(",")), strict=True))
    if int(row["data.consumed.in.nMsg"]) < n:
        raise RuntimeError(f"consumer-perf-test read only {row['data.consumed.in.nMsg']} of {n} records")
    fetch_s = float(row["fetch.time.ms"]) / 1000
    return {"mbps": float(row["MB.sec"]), "fetch_mbps": float(row["fetch.MB.sec"]), "_active_s": fetch_s}


def kcat_produce(bootstrap: str, payload: Path, n: int) -> Metrics:
    """kcat (librdkafka) producing n 1 KiB lines from a file; wall clock includes its (small) startup."""
    cmd = ["kcat", "-P", "-b", bootstrap, "-t", TOPIC, "-X", "acks=all", "-X", "linger.ms=5", "-l", str(payload)]
    p, wall = _run(cmd)
    if re.search(r"fail|error", p.stderr, re.IGNORECASE):
        raise RuntimeError(f"kcat producer reported errors:\n{p.stderr[-2000:]}")
    return {"mbps": n * RECORD / MIB / wall, "_active_s": wall}


def kcat_consume(bootstrap: str, n: int) -> Metrics:
    """kcat reading n records from the beginning; prints one byte per record so we can count them."""
    p, wall = _run(["kcat", "-C", "-b", bootstrap, "-t", TOPIC, "-o", "beginning", "-e", "-c", str(n), "-q", "-f", "."])
    if len(p.stdout) != n:
        raise RuntimeError(f"kcat consumed {len(p.stdout)} of {n} records:\n{p.stderr[-2000:]}")
    return {"mbps": n * RECORD / MIB / wall, "_active_s": wall}


def probe_latency(bootstrap: str, n: int) -> Metrics:
    """Sequential acks=all produce round trips (one record in flight) timed with perf_counter."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "socket.nagle.disable": True})
    value, warmup, lat = os.urandom(RECORD), 50, []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        producer.produce(TOPIC, value, partition=i % 3)
        if producer.flush(10) != 0:
            raise RuntimeError("probe record not delivered within 10 s")
        if i >= warmup:
            lat.append((time.perf_counter() - t0) * 1000)
    return {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "_active_s": sum(lat) / 1000}


@dataclass
class Workload:
    """One client run, measured on both sides; samples are kept per side for medians."""

    name: str
    run: Callable[[str], Metrics]
    payload_bytes: int = 0
    """Record payload one run moves (records x 1 KiB): the denominator of CPU seconds per GiB."""
    round_trips: int = 0
    """Sequential round trips one run makes (the probe): the denominator of CPU µs per round trip."""
    samples: dict[str, list[Metrics]] = field(default_factory=lambda: {s: [] for s in ALL_SIDES})
    proxy_cpu: dict[str, list[tuple[float, float]]] = field(  # per proxy side: (CPU seconds, active seconds) per run
        default_factory=lambda: {s: [] for s in ALL_SIDES[1:]}
    )
    machine: dict[str, list[tuple[float, float]]] = field(  # per side: (busy CPU s of the whole machine, wall s)
        default_factory=lambda: {s: [] for s in ALL_SIDES}
    )


# (workload, metric key, label, "tput" = higher is better and held to the throughput target, or "lat")
ROWS: list[tuple[str, str, str, str]] = [
    ("java-produce", "rps", "Java producer, unthrottled: records/s", "tput"),
    ("java-produce", "mbps", "Java producer, unthrottled: MB/s", "tput"),
    ("java-produce", "p50", "Java producer, unthrottled: p50 latency ms", "lat"),
    ("java-produce", "p99", "Java producer, unthrottled: p99 latency ms", "lat"),
    ("java-fixed", "avg", "Java producer @ fixed rate: avg latency ms", "lat"),
    ("java-fixed", "p50", "Java producer @ fixed rate: p50 latency ms", "lat"),
    ("java-fixed", "p99", "Java producer @ fixed rate: p99 latency ms", "lat"),
    ("java-consume", "fetch_mbps", "Java consumer: fetch MB/s", "tput"),
    ("java-consume", "mbps", "Java consumer: MB/s incl. group join", "tput"),
    ("kcat-produce", "mbps", "kcat producer: MB/s", "tput"),
    ("kcat-consume", "mbps", "kcat consumer: MB/s", "tput"),
    ("probe", "p50", "confluent-kafka sequential produce: p50 ms", "lat"),
    ("probe", "p99", "confluent-kafka sequential produce: p99 ms", "lat"),
]


def _busy() -> float:
    """CPU seconds the whole machine has spent not idle (every process: brokers, clients, proxies)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


def _med(w: Workload, side: str, key: str) -> float:
    return statistics.median(s[key] for s in w.samples[side])


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def _inexact_note(inexact: dict[str, int]) -> str:
    if not inexact:
        return "no run needed them"
    return "needed for " + ", ".join(f"{n} run(s) of {side}" for side, n in sorted(inexact.items()))


def results_markdown(
    wl: dict[str, Workload], sides: tuple[str, ...], peak_rss: dict[str, int] | None = None
) -> tuple[str, list[str]]:
    """The comparison table, the proxy CPU table, and verdict lines on the targets.

    ``sides`` is "direct" plus the proxy sides measured; each proxy side gets its median and its ratio to
    direct, held to its own target (:data:`TARGETS`; the peers' sides have none). With a peer measured, a
    table puts every proxy side's CPU per GiB and per round trip side by side, and ``peak_rss`` (bytes per
    proxy side) gives a table of peak resident memory."""
    proxies = [s for s in sides if s != "direct"]
    head = ["metric", "direct"] + [x for s in proxies for x in (s, f"{s}/direct")] + [f"{s} range" for s in sides]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    misses: list[str] = []
    for name, key, label, kind in ROWS:
        if name not in wl:
            continue
        w = wl[name]
        d = _med(w, "direct", key)
        cells = [label, _fmt(d)]
        for s in proxies:
            p = _med(w, s, key)
            ratio = p / d if d else float("nan")
            flag = " ✗" if kind == "tput" and s in TARGETS and ratio < TARGETS[s] else ""
            cells += [_fmt(p), f"{ratio:.3f}{flag}"]
            if flag:
                misses.append(f"{label} ({s}): {ratio:.3f} < {TARGETS[s]}")
        cells += [f"{_fmt(min(v))}–{_fmt(max(v))}" for s in sides if (v := [m[key] for m in w.samples[s]])]
        out.append("| " + " | ".join(cells) + " |")
    if "probe" in wl and "java-fixed" in wl:
        out.append("")
        for s in proxies:
            added_probe = _med(wl["probe"], s, "p50") - _med(wl["probe"], "direct", "p50")
            added_java = _med(wl["java-fixed"], s, "p50") - _med(wl["java-fixed"], "direct", "p50")
            added_avg = _med(wl["java-fixed"], s, "avg") - _med(wl["java-fixed"], "direct", "avg")
            out.append(
                f"**Added p50 latency, {s}** (its p50 − direct p50): **{added_probe:+.3f} ms** with the sequential "
                f"confluent-kafka probe (sub-ms resolution); {added_java:+.0f} ms with producer-perf-test at a fixed "
                f"rate (whole-ms resolution; its avg latency moved {added_avg:+.2f} ms)."
            )
            out.append("")
            if s == "proxy" and added_probe > LATENCY_TARGET_MS:
                misses.append(f"added p50 latency {added_probe:.3f} ms > {LATENCY_TARGET_MS} ms")
    if out[-1]:
        out.append("")
    out += ["| workload | side | proxy CPU s per run | active s per run | proxy CPU, % of one core "
            "| proxy CPU s per GiB of records | proxy CPU µs per round trip |",
            "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for w in wl.values():
        for s in proxies:
            if not w.proxy_cpu[s]:
                continue
            cpu = statistics.median(c for c, _ in w.proxy_cpu[s])
            act = statistics.median(a for _, a in w.proxy_cpu[s])
            pct = statistics.median(100 * c / a for c, a in w.proxy_cpu[s])
            per_gib = f"{cpu / (w.payload_bytes / 2**30):.2f}" if w.payload_bytes else ""
            per_rt = f"{cpu / w.round_trips * 1e6:.0f}" if w.round_trips else ""
            out.append(f"| {w.name} | {s} | {cpu:.2f} | {act:.2f} | {pct:.0f}% | {per_gib} | {per_rt} |")
        if "quotas" in proxies and "proxy" in proxies and w.proxy_cpu["quotas"] and w.proxy_cpu["proxy"]:
            ratio = statistics.median(c for c, _ in w.proxy_cpu["quotas"]) / statistics.median(
                c for c, _ in w.proxy_cpu["proxy"]
            )
            out.append(f"| {w.name} | quotas/proxy | {ratio:.2f}× | | | | |")
    if peers := [s for s in proxies if s in PEER_SIDES]:
        out += side_by_side(wl, proxies, peers)
    if peak_rss:
        out += ["", "| side | peak RSS MiB (VmHWM, process tree) |", "|---|---:|"]
        out += [f"| {s} | {peak_rss[s] / 2**20:.0f} |" for s in proxies if s in peak_rss]
    out += [
        "",
        "| workload | side | machine CPU s per run (all processes) | wall s per run | machine busy, % of all "
        f"{os.cpu_count()} cores |",
        "|---|---|---:|---:|---:|",
    ]
    for w in wl.values():
        for s in sides:
            if w.machine[s]:
                busy = statistics.median(b for b, _ in w.machine[s])
                wall = statistics.median(t for _, t in w.machine[s])
                pct = statistics.median(100 * b / t / (os.cpu_count() or 1) for b, t in w.machine[s])
                out.append(f"| {w.name} | {s} | {busy:.2f} | {wall:.2f} | {pct:.0f}% |")
    return "\n".join(out), misses


def side_by_side(wl: dict[str, Workload], proxies: list[str], peers: list[str]) -> list[str]:
    """Median CPU per unit of work for every proxy side in one row per workload, and each peer's ratio to ours."""
    ours = "proxy" if "proxy" in proxies else proxies[0]
    head = ["workload", "CPU per"] + proxies + [f"{p}/{ours}" for p in peers]
    out = ["", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for w in wl.values():
        units = ([("s per GiB of records", w.payload_bytes / 2**30, "{:.2f}")] if w.payload_bytes else []) + (
            [("µs per round trip", w.round_trips / 1e6, "{:.0f}")] if w.round_trips else []
        )
        for unit, per, fmt in units:
            val = {s: statistics.median(c for c, _ in w.proxy_cpu[s]) / per for s in proxies if w.proxy_cpu[s]}
            cells = [w.name, unit] + [fmt.format(val[s]) if s in val else "" for s in proxies]
            cells += [f"{val[p] / val[ours]:.2f}×" if p in val and val.get(ours) else "" for p in peers]
            out.append("| " + " | ".join(cells) + " |")
    return out


def write_payload(path: Path, n: int) -> None:
    """n lines of 1024 random base64 characters: kcat sends each line as one 1 KiB record."""
    with path.open("wb") as f:
        for start in range(0, n, 1000):
            block = base64.b64encode(os.urandom(768 * 1000))
            f.write(b"".join(block[j * RECORD : (j + 1) * RECORD] + b"\n" for j in range(min(1000, n - start))))


# ------------------------------------------------------------------------------------------ profiling
def _pyspy() -> str:
    local = Path(sys.executable).parent / "py-spy"
    found = str(local) if local.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy (a binary wheel from PyPI)")
    return found


def _short(frame: str) -> str:
    """'func (/long/path/site-packages/pkg/mod.py:12)' -> 'func (pkg/mod.py:12)'."""
    frame = frame.replace(str(REPO) + "/", "")
    return re.sub(r"\((?:[^()]*/(?:site-packages|lib/python3\.\d+)/)", "(", frame)


def profile_summary(path: Path, top: int = 12) -> tuple[str, list[tuple[str, str]]]:
    """Header and (title, markdown table) pairs from py-spy's raw output, in % of the proxy's busy samples.

    Self time by function and by where the code lives (libc = system calls and memcpy; libpython =
    the interpreter; uvloop's .so; our modules), and cumulative time below the event loop's root frames.
    """
    self_t: Counter[str] = Counter()
    cum_t: Counter[str] = Counter()
    idle = 0
    for line in path.read_text().splitlines():  # py-spy raw: "frame;frame;...;leaf count" per distinct stack
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r"^0x[0-9a-f]+ ", "<unnamed> ", _short(f)) for f in stack.split(";")]
        if frames[-1].startswith(("epoll_wait ", "epoll_pwait ")):  # waiting for I/O: idle, py-spy missed it
            idle += int(count)
            continue
        self_t[frames[-1]] += int(count)
        for f in set(frames):
            cum_t[f] += int(count)
    total = sum(self_t.values())
    unit = f"py-spy samples at 200 Hz, idle excluded (and {idle} more in epoll_wait, i.e. idle, dropped)"
    where: Counter[str] = Counter()
    for k, v in self_t.items():
        where[re.sub(r":\d+$", "", k.rpartition(" (")[2].rstrip(")"))] += v
    below_root = Counter({k: v for k, v in cum_t.items() if v < 0.99 * total and ".py:" in k})

    def table(c: Counter[str], what: str) -> str:
        return "\n".join([f"| % | {what} |", "|---:|---|"] +
                         [f"| {100 * v / total:.1f} | `{k}` |" for k, v in c.most_common(top)])  # fmt: skip

    return f"{total:.0f} {unit}", [
        ("Self time by function", table(self_t, "function")),
        ("Self time by library / module", table(where, "where")),
        ("Cumulative time, Python functions below the event loop's root", table(below_root, "function")),
    ]


def _profiled(cmd: list[str], fn: Callable[[], Metrics]) -> tuple[Metrics, float]:
    """Run ``fn`` while the profiler ``cmd`` is attached; both py-spy and perf write their output on SIGINT."""
    prof = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # let it attach
    t0 = time.perf_counter()
    try:
        return fn(), time.perf_counter() - t0
    finally:
        prof.send_signal(signal.SIGINT)
        prof.wait(120)


def perf_tables(data: Path, top: int = 12) -> list[tuple[str, str]]:
    """Self on-CPU time by library and by symbol from ``perf report`` ([k] = kernel, [.] = user space)."""
    tables = []
    for sort, title in (("dso", "On-CPU time by library (perf)"), ("sym", "On-CPU hottest symbols (perf)")):
        out = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio",
                              "-g", "none"], capture_output=True, text=True).stdout  # fmt: skip
        rows = re.findall(r"^\s*([\d.]+)%\s+(.+?)\s*$", out, re.MULTILINE)[:top]
        tables.append((title, "\n".join(["| % | where |", "|---:|---|", *(f"| {p} | `{w}` |" for p, w in rows)])))
    return tables


def run_profiles(cluster: KafkaCluster, proxy: ProxyProcess, n: int) -> str:
    """Profiles of the measured (warm) proxy, one run each of a Java produce, a Java consume and a kcat
    consume (the client that pushes the proxy hardest).

    py-spy (--native: which C code the time goes to) samples the thread whenever it is not idle, which on
    this oversubscribed 2-core machine includes time runnable but waiting for a CPU; so, when perf is
    installed, a second run of the same workload under ``perf record`` gives the true on-CPU split.
    """
    PROFILE_DIR.mkdir(exist_ok=True)
    (PROFILE_DIR / ".gitignore").write_text("*\n")
    assert proxy.proc is not None
    pid = str(proxy.proc.pid)
    runs: list[tuple[str, Callable[[], Metrics], str]] = [
        ("Java producer", lambda: java_produce(cluster, proxy.bootstrap, n, -1), "mbps"),
        ("Java consumer", lambda: java_consume(cluster, proxy.bootstrap, 3 * n), "fetch_mbps"),
        ("kcat consumer", lambda: kcat_consume(proxy.bootstrap, 3 * n), "mbps"),
    ]
    parts = [
        "Profilers attached to the long-lived proxy after the measurements, one run each (raw output in "
        "`bench/profiles/`, git-ignored). py-spy percentages are of the samples in which the proxy's "
        "thread was not idle (on a CPU *or waiting for one*); perf percentages are of on-CPU samples."
    ]
    for name, fn, key in runs:
        slug = name.replace(" ", "-").lower()
        out = PROFILE_DIR / f"{slug}.txt"
        m, wall = _profiled([_pyspy(), "record", "--pid", pid, "--native", "--rate", "200", "--function",
                             "--format", "raw", "-o", str(out)], fn)  # fmt: skip
        head, tables = profile_summary(out)
        print(f"profile {name}: {m[key]:.1f} MB/s under py-spy, {head}", flush=True)
        parts += ["", f"### {name} run ({m[key]:.1f} MB/s under py-spy, {wall:.1f} s; {head})"]
        if shutil.which("perf"):
            data = PROFILE_DIR / f"{slug}.perf.data"
            m, _ = _profiled(["perf", "record", "-F", "499", "-p", pid, "-o", str(data)], fn)
            parts += ["", f"Under perf (499 Hz): {m[key]:.1f} MB/s."]
            tables += perf_tables(data)
        for heading, tab in tables:
            parts += ["", f"{heading}:", "", tab]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------- main
def warm_up(
    cluster: KafkaCluster, proxy_bs: list[str], wl: dict[str, Workload], n: int, budget_s: float, consume_n: int
) -> float:
    """Unmeasured runs until the brokers are warm; returns the seconds spent.

    Freshly started brokers are slow: in trials on this machine their C2 JIT took ~300 MB of acks=all
    traffic to settle, direct producer throughput rising 4x (1.8 -> 7.5 MB/s) over six 50 MB runs. So
    produce (direct and through the first proxy, >= 3 rounds) until direct throughput changes < 10% between
    rounds or the budget is spent, then run every other workload once per side for its own code paths
    (fetch, kcat, probe) in the brokers and in each proxy.
    """
    t0, seen, produced = time.monotonic(), [0.0], 0
    while time.monotonic() - t0 < budget_s:
        seen.append(java_produce(cluster, cluster.bootstrap, n, -1)["mbps"])
        via = java_produce(cluster, proxy_bs[0], n, -1)["mbps"]
        produced += 2 * n
        print(f"warm-up produce: direct {seen[-1]:.1f} MB/s, proxy {via:.1f} MB/s", flush=True)
        if len(seen) > 3 and abs(seen[-1] - seen[-2]) < 0.1 * seen[-2]:
            break
    if produced < consume_n:  # consumers read from the beginning: the topic must hold enough
        java_produce(cluster, cluster.bootstrap, consume_n - produced, -1)
    for i, w in enumerate(wl.values()):
        for bs in (cluster.bootstrap, *proxy_bs) if i else proxy_bs[1:]:
            w.run(bs)
    print(f"warm-up done in {time.monotonic() - t0:.0f} s", flush=True)
    return time.monotonic() - t0


def proxy_code_version() -> str:
    """Commit the proxy runs from, and whether its working tree differs (results belong to that code)."""
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "proxy", "protocol", "config"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return f"commit {git.strip()}" + (" plus uncommitted changes in proxy/protocol/config" if dirty else "")


def machine_info(cluster: KafkaCluster, code: str, peers: dict[str, PeerProcess] | None = None) -> list[str]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = m.group(1).strip() if (m := re.search(r"model name\s*:\s*(.*)", cpuinfo)) else platform.processor()
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    kcat = re.search(r"librdkafka [\d.]+", subprocess.run(["kcat", "-V"], capture_output=True, text=True).stdout)
    import confluent_kafka

    dist = cluster.dist
    tools = getattr(dist, "tools_version", cluster.version)
    return [
        f"- Machine: {os.cpu_count()} CPUs (nproc), {model}, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
        f"Linux {platform.release()}; shared by the 3 brokers, the clients and the proxy.",
        f"- Kafka: broker {cluster.version}, CLI/perf tools {tools} (3 combined broker+controller KRaft nodes, "
        f"tests.harness defaults); {java}.",
        f"- Python {platform.python_version()} (proxy on uvloop); kcat with {kcat.group(0) if kcat else '?'}; "
        f"confluent-kafka {confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]}).",
        f"- Proxy code: {code}.",
        *(
            f"- Peer `{s}`: {PEER_NAMES[s]} {p.version} (`{p.cmd[0]}`), listening on {p.bootstrap}."
            for s, p in (peers or {}).items()
        ),
    ]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, help="records per throughput run (default 300000; quick 30000)")
    ap.add_argument("--repeats", type=int, help="direct/proxy pairs per workload (default 3; quick 1)")
    ap.add_argument("--quick", action="store_true", help="small sanity run; writes no report unless --output")
    ap.add_argument("--profile", action="store_true", help="afterwards, profile the proxy in one produce/consume run")
    ap.add_argument(
        "--output",
        help="write the markdown report here (default: print it; BENCHMARKS.md is edited by "
        "hand from a report, so a run never overwrites it)",
    )
    ap.add_argument(
        "--only",
        help="comma-separated workloads to measure (e.g. java-consume,kcat-consume); writes no report unless --output",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="brokers, clients and this process on CPU 0, each proxy on CPU 1 (the proxy with a core "
        "of its own); writes no report unless --output",
    )
    ap.add_argument(
        "--no-quotas",
        action="store_true",
        help="skip the third side (a proxy with every quota configured, none binding)",
    )
    ap.add_argument(
        "--kroxylicious",
        default=os.environ.get(PEER_ENV["kroxy"]),
        help=f"peer side `kroxy`: Kroxylicious' bin/kroxylicious-start.sh (default ${PEER_ENV['kroxy']}; "
        "skipped if neither)",
    )
    ap.add_argument(
        "--kafka-proxy",
        default=os.environ.get(PEER_ENV["goproxy"]),
        help=f"peer side `goproxy`: the grepplabs kafka-proxy binary (default ${PEER_ENV['goproxy']}; "
        "skipped if neither)",
    )
    return ap.parse_args(argv)


@dataclass
class Plan:
    """What one run measures, from the command line: the sides, the peers' start scripts and the sizes."""

    sides: tuple[str, ...]
    given: dict[str, str]  # peer side -> its executable ("": not run)
    n: int  # records per throughput run
    repeats: int
    rate: int  # records/s of the fixed-rate run
    rate_s: int  # its seconds
    probes: int  # sequential round trips the probe times
    partial: bool  # a sanity run: no report unless --output

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        given = {"kroxy": args.kroxylicious or "", "goproxy": args.kafka_proxy or ""}
        for side, path in given.items():
            if path and not os.access(path, os.X_OK):
                raise SystemExit(f"{PEER_NAMES[side]}: {path} is not an executable file")
        if args.pin and ((os.cpu_count() or 1) < 2 or not shutil.which("taskset")):
            raise SystemExit("--pin needs 2 CPUs and taskset (util-linux)")
        return cls(
            sides=(*(SIDES[:2] if args.no_quotas else SIDES), *(s for s in PEER_SIDES if given[s])),
            given=given,
            n=args.records or (30_000 if args.quick else 300_000),
            repeats=args.repeats or (1 if args.quick else 3),
            rate=2000,
            rate_s=5 if args.quick else 12,
            probes=300 if args.quick else 2000,
            partial=bool(args.quick or args.only or args.pin),
        )


def _start_sides(
    workdir: Path, cluster: KafkaCluster, plan: Plan
) -> tuple[ProxyProcess, dict[str, ProxyProcess | PeerProcess], dict[str, PeerProcess]]:
    """The long-lived relays: our proxy, the proxy with every quota (side `quotas`) and the peers. Returns our
    proxy, every side's relay and the peers among them."""
    proxy = ProxyProcess(workdir, cluster.bootstrap).start()
    proxies: dict[str, ProxyProcess | PeerProcess] = {"proxy": proxy}
    if "quotas" in plan.sides:
        proxies["quotas"] = ProxyProcess(workdir, cluster.bootstrap, {"quotas.entities": [
            {"entity": {"user": "<default>"}, "quotas": {**HUGE_QUOTAS, "producer_ids_rate": 10**9}},
            {"entity": {"client-id": "<default>"}, "quotas": HUGE_QUOTAS},
        ]}, name="quotas").start()  # fmt: skip
    peers = start_peers(plan.given, workdir, cluster)
    proxies.update(peers)  # same surface: bootstrap, process, log(), terminate()
    return proxy, proxies, peers


def _workloads(cluster: KafkaCluster, payload: Path, plan: Plan, only: str | None) -> dict[str, Workload]:
    """The workloads to measure, by name (``--only`` keeps java-produce too: the warm-up needs it)."""
    n, rate, rate_s, probes = plan.n, plan.rate, plan.rate_s, plan.probes
    wl = {w.name: w for w in [
        Workload("java-produce", lambda bs: java_produce(cluster, bs, n, -1), n * RECORD),
        Workload("java-fixed", lambda bs: java_produce(cluster, bs, rate * rate_s, rate),
                 rate * rate_s * RECORD),
        Workload("kcat-produce", lambda bs: kcat_produce(bs, payload, n), n * RECORD),
        Workload("java-consume", lambda bs: java_consume(cluster, bs, 3 * n), 3 * n * RECORD),
        Workload("kcat-consume", lambda bs: kcat_consume(bs, 3 * n), 3 * n * RECORD),
        Workload("probe", lambda bs: probe_latency(bs, probes), (probes + 50) * RECORD, probes + 50),
    ]}  # fmt: skip
    if only:
        unknown = set(only.split(",")) - wl.keys()
        if unknown:
            raise SystemExit(f"--only: unknown workload(s) {sorted(unknown)}; known: {sorted(wl)}")
        wl = {k: w for k, w in wl.items() if k in only.split(",") or k == "java-produce"}
    return wl


def _measure(
    cluster: KafkaCluster,
    proxies: dict[str, ProxyProcess | PeerProcess],
    proxy_ps: dict[str, psutil.Process],
    wl: dict[str, Workload],
    plan: Plan,
) -> dict[str, int]:
    """Every workload on every side, interleaved, the order reversed every other round; the samples go into the
    workloads. Returns, per side, the runs whose CPU was measured in clock ticks (a thread exited: cpu_between)."""
    inexact: dict[str, int] = {}
    sides, repeats = plan.sides, plan.repeats
    for r in range(repeats):
        for w in wl.values():
            for side in sides if r % 2 == 0 else sides[::-1]:
                bs = proxies[side].bootstrap if side in proxies else cluster.bootstrap
                ps = proxy_ps.get(side, proxy_ps["proxy"])
                cpu0, all0, t0 = cpu_reading(ps), _busy(), time.perf_counter()
                m = w.run(bs)
                cpu1, wall = cpu_reading(ps), time.perf_counter() - t0
                w.machine[side].append((_busy() - all0, wall))
                cpu, exact = cpu_between(cpu0, cpu1)  # the process tree's, to the ns
                if not exact:
                    inexact[side] = inexact.get(side, 0) + 1
                w.samples[side].append(m)
                if side in proxies:
                    w.proxy_cpu[side].append((cpu, m["_active_s"]))
                shown = ", ".join(f"{k}={v:.4g}" for k, v in m.items() if not k.startswith("_"))
                print(f"[{r + 1}/{repeats}] {w.name:13} {side:7} {shown}  "
                      f"(wall {wall:.1f}s, proxy cpu {cpu:.3f}s{'' if exact else ' in ticks'})",
                      flush=True)  # fmt: skip
    return inexact


@dataclass
class Outcome:
    """What a finished run reports besides the table: the logs' warnings, the warm-up, the machine."""

    table: str
    verdict: list[str]
    warm_s: float
    inexact: dict[str, int]
    warnings: int
    peer_warnings: dict[str, int]
    profile: str
    info: list[str]
    peers: bool


def _run_all(args: argparse.Namespace, plan: Plan, workdir: Path, code: str) -> Outcome:
    """The cluster, the relays, the warm-up, the measured rounds and the table: everything that needs Kafka."""
    n = plan.n
    with KafkaCluster(3, workdir=workdir / "kafka") as cluster:
        cluster.tool("topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", TOPIC,
                     "--partitions", "3", "--replication-factor", "3", check=True)  # fmt: skip
        payload = workdir / "payload.txt"
        write_payload(payload, n)
        peers: dict[str, PeerProcess] = {}
        try:
            proxy, proxies, peers = _start_sides(workdir, cluster, plan)
            if args.pin:  # every thread of each proxy onto the other CPU
                for relay in proxies.values():
                    pid = str(relay.process.pid)
                    subprocess.run(["taskset", "-a", "-p", "-c", "1", pid], check=True, capture_output=True)
            proxy_ps = {s: psutil.Process(p.process.pid) for s, p in proxies.items()}
            wl = _workloads(cluster, payload, plan, args.only)
            print(
                f"cluster {cluster.bootstrap}, "
                + ", ".join(f"{s} {p.bootstrap}" for s, p in proxies.items())
                + "; warming up",
                flush=True,
            )
            bootstraps = [p.bootstrap for p in proxies.values()]
            warm_s = warm_up(cluster, bootstraps, wl, max(n // 3, 10_000), 45 if args.quick else 150, 3 * n)
            if args.only and "java-produce" not in args.only.split(","):
                del wl["java-produce"]  # it was kept for the warm-up only
            inexact = _measure(cluster, proxies, proxy_ps, wl, plan)
            ours = [p for s, p in proxies.items() if s not in peers]
            warnings = sum(" WARNING " in ln for p in ours for ln in p.log().splitlines())
            peer_warnings = {s: len(p.warnings()) for s, p in peers.items()}
            for s, p in peers.items():
                for ln in p.warnings()[:5]:
                    print(f"{s} log: {ln[:300]}", flush=True)
            peak_rss = {s: tree_peak_rss(ps) for s, ps in proxy_ps.items()}
            table, misses = results_markdown(wl, plan.sides, peak_rss)
            print("\n" + table + "\n")
            verdict = (["**All targets met.**"] if not misses else
                       ["**Targets not met:**", *(f"- {m}" for m in misses)])  # fmt: skip
            print("\n".join(verdict), flush=True)
            profile = run_profiles(cluster, proxy, n) if args.profile else ""
            for s, relay in proxies.items():
                if relay.terminate() != 0:
                    raise RuntimeError(f"{s} exited badly:\n{relay.log()[-3000:]}")
        except BaseException:
            for p in peers.values():  # ours die with their pipe; a peer would linger
                p.terminate()
            raise
        info = machine_info(cluster, code, peers)
    return Outcome(table, verdict, warm_s, inexact, warnings, peer_warnings, profile, info, bool(peers))


def _report(
    args: argparse.Namespace, plan: Plan, o: Outcome, command: str, started: datetime.datetime, minutes: float
) -> list[str]:
    """The markdown report: the targets, how it was measured, the results."""
    n, rate, rate_s, probes, sides, repeats = plan.n, plan.rate, plan.rate_s, plan.probes, plan.sides, plan.repeats
    doc = [
        "# Benchmarks: pass-through cost of the proxy", "",
        f"Targets: pass-through throughput ≥ {THROUGHPUT_TARGET} × direct and added p50 latency ≤ "
        f"{LATENCY_TARGET_MS} ms (side `proxy`: no quota configured, issue 2); throughput ≥ {QUOTAS_TARGET} × direct "
        "with every quota configured but none binding (side `quotas`, issue 5).",
        "", "## How it was measured", "",
        f"- Command: `{command}` ({minutes:.0f} min in total); date {started:%Y-%m-%d %H:%M %Z}.", *o.info,
        f"- Topic `{TOPIC}`: 3 partitions, replication factor 3. Records are 1 KiB. Throughput runs move "
        f"{n:,} records each (consumers {3 * n:,}: they are fast); the fixed-rate latency run sends {rate} "
        f"records/s for {rate_s} s; the probe times "
        f"{probes} sequential produce round trips. MB = MiB, as Kafka's tools print.",
        "- Clients: Java producer-perf-test (acks=all, default batching: linger.ms 5, batch.size 16 KiB) and "
        "consumer-perf-test (fresh group, from the beginning), JVMs with `-Xmx512m` and the full JIT; "
        "kcat producing from a file (acks=all, linger.ms=5) and consuming (`-C -e -o beginning -c N`), timed "
        "wall-clock including startup on both sides; a confluent-kafka producer in the benchmark process "
        "(acks=all, linger.ms=0, one record in flight).",
        f"- Each workload runs direct and through each long-lived proxy process ({', '.join(sides)}), interleaved, "
        f"{repeats} round(s), the order reversed every other round (ABC CBA); the table shows medians and the "
        "min–max of the samples. Side `quotas` is a second proxy whose config sets every quota kind (producer and "
        "consumer byte rate, request percentage, controller mutation rate, producer ids rate) on `<default>` "
        "user and `<default>` client-id at values no client reaches, so every request is charged and checked. "
        f"Warm-up first ({o.warm_s:.0f} s, unmeasured): producer runs on both sides until direct throughput "
        "is steady (fresh brokers' JIT needs a few hundred MB), then each other workload once per side.",
        "- Proxy CPU: the scheduler's time on CPU (user+system, to the nanosecond: `/proc/<pid>/task/*/schedstat`, "
        "summed over the process tree's threads) across each proxy run; psutil's clock ticks (10 ms) when a thread "
        f"exited during the run ({_inexact_note(o.inexact)}). Divided by the "
        "run's active time (records/throughput for the producer, fetch time for the Java consumer, wall time "
        "for kcat and the probe). 100% = one core, the most a single-threaded event loop can use.",
        "- Machine CPU: psutil's system-wide busy time (user, nice, system, irq, softirq) across each run, all "
        "processes together; divided by wall time × cores it says whether the run was CPU-bound, in which case "
        "every CPU second a relay adds comes out of the brokers' and the client's share.",
        *(["- **Pinned** (`--pin`): the benchmark process and everything it starts (the 3 brokers, every client) "
            "on CPU 0, each proxy (all its threads, `taskset -a`) on CPU 1: the proxy has a core of its own and the "
            "cluster and clients get the same single core on both sides."] if args.pin else []),
        *(["- Peers, configured as bench/peers.py says: Kroxylicious with no filter and `portIdentifiesNode` "
           "networking (a bootstrap port, then one port per broker), JVM at its start script's defaults; grepplabs "
           "kafka-proxy with one `--bootstrap-server-mapping` per broker, dynamic listeners and HTTP off, other "
           "options at their defaults. Each started once before the warm-up; their CPU is user+system of the "
           "process tree (for Kroxylicious the JVM: its script execs java), peak RSS is VmHWM; a peer has no "
           "throughput target, the ✗ marks and verdict concern our sides only."] if o.peers else []),
        f"- Proxy log after the measured runs: {o.warnings} WARNING lines"
        + "".join(f"; {s} log: {k} warning/error lines" for s, k in o.peer_warnings.items()) + ".", "",
        "## Results", "", o.table, "", *o.verdict, "",
    ]  # fmt: skip
    if o.profile:
        doc += ["## Where the proxy spends its time", "", o.profile]
    return doc


def _write(doc: list[str], output: Path) -> None:
    """Write the report; the hand-written interpretation after "## Notes" survives re-runs (it says which run it
    was written for)."""
    notes = output.read_text().partition("\n## Notes")[2] if output.exists() else ""
    output.write_text("\n".join(doc).rstrip() + "\n" + (f"\n## Notes{notes}" if notes else ""))
    print(f"wrote {output}")


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    plan = Plan.of(args)
    if args.pin:
        os.sched_setaffinity(0, {0})  # inherited by the brokers and every client started from here
    output = Path(args.output) if args.output else None
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *sys.argv[1:]])
    started = datetime.datetime.now().astimezone()
    code = proxy_code_version()  # now: others may edit the tree while we run
    workdir = Path(tempfile.mkdtemp(prefix="ktp-bench-"))
    t_start = time.monotonic()
    try:
        outcome = _run_all(args, plan, workdir, code)
    except BaseException:
        print(f"failed; kept {workdir} for the proxy and broker logs", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    minutes = (time.monotonic() - t_start) / 60
    print(f"total {minutes:.1f} min")
    if plan.partial and output is None:
        return 0
    doc = _report(args, plan, outcome, command, started, minutes)
    if output is None:
        print("\n".join(doc).rstrip())
    else:
        _write(doc, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
