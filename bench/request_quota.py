"""KIP-124 fidelity: the request rate a binding ``request_percentage`` allows a request-heavy, byte-light client,
with the brokers enforcing it (no proxy) and with the proxy enforcing it (brokers without quota), side by side.

    flock /work/cluster.lock .venv/bin/python -m bench.request_quota [--warmup 12] [--seconds 48] [--rounds 3]
        [--workloads rdk-produce,consumers-nowait,...] [--brokers 2] [--output PATH]

Per workload, each phase with a fresh client id (so no phase inherits another's window): unthrottled straight
to the cluster, unthrottled through a proxy with no quota (these two also warm the brokers: a cold broker's JIT
charged a tenth of the requests of a warm one), then ``--rounds`` rounds of ``request_percentage = P`` set on
the brokers (``kafka-configs --alter --entity-type clients``) and P set in the proxy's ``quotas.entities``
(brokers: none), alternating; the table gives each round's rates and the median and range of proxy ÷ broker.
P is chosen from the unthrottled rates so that the brokers' quota binds: about a quarter of the direct rate at
:data:`NOMINAL_MS` a request, and at most 40 % of the rate through the proxy. Every workload's topic is led by
broker 1, so one broker's request quota (Kafka's, and the proxy's ``broker`` scope) is what binds.

Why a phase measures 48 s: the brokers hold a flooding client in cycles about one quota window long (11 s),
not evenly. The windowed rate crosses P, every answer then carries the 1-s cap and the muted client gets about
one request a second through until the burst's samples leave the window, then it bursts at full speed for a
second or two (bench/broker_request_log.py shows the cycle). A 12-s phase caught one burst or two, so the
brokers' rate moved 1.3-2 x between rounds of one run and read high on the whole; over 48 s (four cycles or
more) their two rounds agreed within 2-9 % for three workloads of six (BENCHMARKS.md, run 8).

Beside every phase a load probe (:class:`LoadProbe`) times a small request straight to broker 1 and, through a
proxy, scrapes the proxy's own upstream time per API; the second table sets the brokers' implied charge per
request (:func:`implied_ms`) against both, round by round. ``--burn N --burn-rounds 2,4`` runs N busy loops
through the rounds named, for a known extra load (issue 36: does the brokers' charge follow load the proxy can
see?).

Rates come from the clients: for the librdkafka producers, requests answered (delivery reports, one record a
request; :func:`rdk_produce_served` says why not requests sent); for the consumers, librdkafka's statistics
(``brokers[].req``, sampled each second: Fetches sent to broker 1, one in flight at a time) between the end of
the warm-up and the end of the phase, over that time; the raw
ListOffsets loop counts its own; Kafka's producer-perf-test reports ``request-total`` at its end (its whole run,
warm-up included: it has no per-second counter). throttle_time_ms: librdkafka records only non-zero values, so
its ``throttle`` window gives the count of throttled answers and their p50/p99/max; the raw loop keeps every
value; Java gives its average and maximum.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.traffic import SMALL_RECORD, rdkafka_request_flood, request_rate, request_stats

REPO = Path(__file__).resolve().parent.parent
NOMINAL_MS = 0.015
"""Thread time per request assumed when choosing P: about the brokers' own charge on the calibration machine
(0.012-0.016 ms a warm librdkafka Produce, 0.02-0.04 ms a ListOffsets), low enough that P binds at a third of
the unthrottled rate or less."""
TARGET_OF_DIRECT = 0.25
MAX_OF_PROXY = 0.4


# ------------------------------------------------------------------------------------------ client side
def _with_rx(cb, rx: list):
    """``cb`` (a librdkafka stats_cb), also appending (monotonic s, responses, response bytes) from broker 1: the
    mean response size a consumer got, which Fetch's estimate is charged from (docs/quotas.md)."""

    def both(text: str) -> None:
        cb(text)
        for b in json.loads(text).get("brokers", {}).values():
            if b.get("nodeid") == 1:
                rx.append((time.monotonic(), b.get("rx", 0), b.get("rxbytes", 0)))

    return both


def _mean_response(rx: list, start: float, end: float) -> float:
    inside = [s for s in rx if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][1] == inside[0][1]:
        return 0.0
    return (inside[-1][2] - inside[0][2]) / (inside[-1][1] - inside[0][1])


def rdk_consumers(bootstrap: str, topic: str, client_id: str, warm: float, seconds: float, **conf) -> dict:
    """Two librdkafka consumers of one group (same client id), each polling in its own thread."""
    from confluent_kafka import Consumer

    group = f"{client_id}-{uuid.uuid4().hex[:6]}"
    lists: list[list] = [[], []]
    rxs: list[list] = [[], []]
    start = time.monotonic()
    end = start + warm + seconds
    stop_at = end + 1.5

    def run(i: int) -> None:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "group.id": group,
                "auto.offset.reset": "latest",
                "enable.auto.commit": False,
                "statistics.interval.ms": 1000,
                "stats_cb": _with_rx(request_stats("Fetch", lists[i]), rxs[i]),
                **conf,
            }
        )
        c.subscribe([topic])
        while time.monotonic() < stop_at:
            c.poll(0.1)
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = request_rate(lists[0], start + warm, end + 0.5)
    b = request_rate(lists[1], start + warm, end + 0.5)
    return {
        "rate": a["rate"] + b["rate"],
        "seconds": min(a["seconds"], b["seconds"]),
        "throttled": a["throttled"] + b["throttled"],
        "p50": statistics.median([x["p50"] for x in (a, b)]),
        "p99": max(a["p99"], b["p99"]),
        "max": max(a["max"], b["max"]),
        "response_bytes": statistics.mean(_mean_response(x, start + warm, end + 0.5) for x in rxs),
    }


def rdk_tail(bootstrap: str, topic: str, client_id: str, warm: float, seconds: float) -> dict:
    """One librdkafka consumer with the default fetch.wait.max.ms (500) tailing a topic a feeder keeps writing:
    each Fetch returns as soon as a few records land, so it is request-heavy and byte-light too."""
    from confluent_kafka import Consumer, Producer

    stop = threading.Event()

    def feed() -> None:
        p = Producer({"bootstrap.servers": bootstrap.split("|")[-1], "client.id": "rq-feeder", "linger.ms": 0})
        while not stop.is_set():
            try:
                p.produce(topic, SMALL_RECORD, partition=0)
            except BufferError:
                p.poll(0.001)
                continue
            p.poll(0)
            time.sleep(0)
        p.flush(5)

    samples: list = []
    rx: list = []
    c = Consumer(
        {
            "bootstrap.servers": bootstrap.split("|")[0],
            "client.id": client_id,
            "group.id": f"{client_id}-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            "statistics.interval.ms": 1000,
            "stats_cb": _with_rx(request_stats("Fetch", samples), rx),
        }
    )
    c.subscribe([topic])
    feeder = threading.Thread(target=feed)
    feeder.start()
    start = time.monotonic()
    end = start + warm + seconds
    try:
        while time.monotonic() < end + 1.5:
            c.consume(1000, 0.1)
    finally:
        stop.set()
        feeder.join()
        c.close()
    return {
        **request_rate(samples, start + warm, end + 0.5),
        "response_bytes": _mean_response(rx, start + warm, end + 0.5),
    }


def list_offsets_loop(bootstrap: str, topic: str, client_id: str, warm: float, seconds: float) -> dict:
    """ListOffsets (latest, partition 0) back to back on one raw connection to partition 0's leader, ignoring
    throttle_time_ms as a careless client does: the broker's (or the proxy's) mute is what holds it."""
    from kafka.protocol.consumer import ListOffsetsRequest

    from tests.support import KafkaWire

    T = ListOffsetsRequest.ListOffsetsTopic
    req = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            T(name=topic, partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])
        ],
    )
    wire = KafkaWire(bootstrap)
    times: list[float] = []
    throttles: list[int] = []
    start = time.monotonic()
    end = start + warm + seconds
    try:
        while (now := time.monotonic()) < end:
            wire.send(req, 7, client_id=client_id)
            _, resp = wire.recv()
            if now >= start + warm:
                times.append(now)
                throttles.append(resp.throttle_time_ms)
    finally:
        wire.close()
    nz = sorted(t for t in throttles if t > 0)
    return {
        "rate": len(times) / seconds,
        "seconds": seconds,
        "throttled": len(nz),
        "p50": nz[len(nz) // 2] if nz else 0,
        "p99": nz[int(len(nz) * 0.99)] if nz else 0,
        "max": nz[-1] if nz else 0,
    }


def java_produce(kafka_bin: str, bootstrap: str, topic: str, client_id: str, warm: float, seconds: float) -> dict:
    """Kafka's producer-perf-test, linger 0, ``batch.size=0`` (one record, one request), acks 1, 16-B records.
    It has no run time, only a record count: the orchestrator passes the rate it expects (``RQ_JAVA_RATE``) so the
    run lasts about the phase; its 5-s report lines give the rate after the warm-up (records = requests here), its
    final metrics the throttle average and maximum."""
    expected = os.environ.get("RQ_JAVA_RATE")  # unset: unthrottled, cut off after the phase (no final metrics)
    n = int(float(expected) * (warm + seconds)) if expected else 10**9
    cmd = json.loads(kafka_bin) + [
        "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(n), "--record-size", "16",
        "--throughput", "-1", "--print-metrics", "--command-property", "acks=1", "linger.ms=0", "batch.size=0",
        f"client.id={client_id}",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    lines: list[tuple[float, int]] = []  # (seconds since start, records in that report)
    out: list[str] = []
    killer = threading.Timer((warm + seconds) * (3 if expected else 1) + 6, lambda: os.killpg(proc.pid, 9))
    killer.start()
    for line in proc.stdout:
        out.append(line)
        m = re.match(r"^(\d+) records sent, ([\d.]+) records/sec", line)
        if m and "50th" not in line:  # a 5-s report, not the final summary (which has percentiles)
            lines.append((time.monotonic() - t0, int(m.group(1))))
    proc.wait()
    killer.cancel()
    from tests.harness.traffic import java_metrics

    metrics = java_metrics("".join(out))
    after = [(t, k) for t, k in lines if t >= warm + 5]  # each line covers the 5 s before it
    span = after[-1][0] - after[0][0] + 5 if after else 0.0
    return {
        "rate": sum(k for _, k in after) / span if span else 0.0,
        "seconds": span,
        "throttled": None,
        "p50": None,
        "avg": metrics.get("producer-metrics:produce-throttle-time-avg", 0.0),
        "p99": None,
        "max": metrics.get("producer-metrics:produce-throttle-time-max", 0.0),
        "rc": proc.returncode,
    }


def rdk_produce_served(bootstrap: str, topic: str, client_id: str, warm: float, seconds: float, **conf) -> dict:
    """tests.harness.traffic.rdkafka_request_flood's producer (linger 0, one 16-B record a request, pipelined),
    its rate counted as requests *answered*, not requests sent (its docstring says why)."""
    return rdkafka_request_flood(bootstrap, topic, client_id, warm, seconds, served=True, **conf)


WORKERS = {
    "rdk-produce": lambda a: rdk_produce_served(a.bootstrap, a.topic, a.client_id, a.warm, a.seconds),
    "rdk-produce-all": lambda a: rdk_produce_served(a.bootstrap, a.topic, a.client_id, a.warm, a.seconds, acks="all"),
    "consumers-nowait": lambda a: rdk_consumers(
        a.bootstrap, a.topic, a.client_id, a.warm, a.seconds, **{"fetch.wait.max.ms": 0}
    ),
    "consumer-tail": lambda a: rdk_tail(a.bootstrap, a.topic, a.client_id, a.warm, a.seconds),
    "list-offsets": lambda a: list_offsets_loop(a.bootstrap, a.topic, a.client_id, a.warm, a.seconds),
    "java-produce": lambda a: java_produce(a.kafka_bin, a.bootstrap, a.topic, a.client_id, a.warm, a.seconds),
}


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    partitions: int = 1
    replicas: int = 1


WORKLOADS = {
    w.name: w
    for w in (
        Workload("rdk-produce", "librdkafka producer, linger 0, acks 1, 16-B records"),
        Workload("consumers-nowait", "two librdkafka consumers, fetch.wait.max.ms 0, empty partitions", partitions=2),
        Workload("java-produce", "Java producer-perf-test, linger 0, acks 1, 16-B records"),
        Workload("list-offsets", "ListOffsets loop (raw, one connection)"),
        Workload("consumer-tail", "librdkafka consumer, default fetch.wait.max.ms, tailing a busy topic"),
        Workload("rdk-produce-all", "librdkafka producer, linger 0, acks=all (RF 2), 16-B records", replicas=2),
    )
}


# ------------------------------------------------------------------------------------------ load probe
PROBE_INTERVAL_S = 0.05
"""The probe's pace: 20 small requests a second, nothing beside the workload's thousands."""


class LoadProbe:
    """What the proxy could observe of a broker's load, measured beside every phase (issue 36): the round trip
    of a small request (ListOffsets, latest, of partition 0 of the phase's topic, led by broker 1) sent straight
    to broker 1 every :data:`PROBE_INTERVAL_S` on a connection of its own (client id ``rq-probe``, no quota), and,
    when the phase runs through a proxy, that proxy's own upstream time per API (``ktp_request_latency_seconds``:
    forwarding to response, the client's own requests) over the measured window. Why: the brokers' charge per
    request moved 2-4 x between rounds with the machine's load, and a load factor on the proxy's estimate is only
    worth building if the charge tracks something the proxy can see. The request is encoded once and sent raw, so
    the figure is the broker's and the loopback's, not kafka-python's."""

    def __init__(self, broker: str, topic: str, warm: float, seconds: float, metrics_port: int | None) -> None:
        self.broker, self.topic, self.warm, self.seconds = broker, topic, warm, seconds
        self.metrics_port = metrics_port
        self.rtts: list[float] = []
        self.scrapes: list[dict[str, tuple[float, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LoadProbe:
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(10)
        if len(self.scrapes) == 1 and self.metrics_port is not None:  # the worker ended before the window did
            self.scrapes.append(_proxy_latency(self.metrics_port))
        return self.summary()

    def _frame(self) -> bytes:
        from kafka.protocol.consumer import ListOffsetsRequest

        T = ListOffsetsRequest.ListOffsetsTopic
        req = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=[
                T(
                    name=self.topic,
                    partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)],
                )
            ],
        )
        req.API_VERSION = 7
        req.with_header(correlation_id=1, client_id="rq-probe")
        return req.encode(header=True, framed=True)

    def _run(self) -> None:
        import socket

        from tests.support import KafkaWire

        frame = self._frame()
        t0 = time.monotonic()
        scrape_at = [t0 + 1 + self.warm, t0 + 1 + self.warm + self.seconds]  # the worker's own start-up: ~1 s
        wire = KafkaWire(self.broker, timeout=10)
        wire.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if scrape_at and now >= scrape_at[0] and self.metrics_port is not None:
                    scrape_at.pop(0)
                    self.scrapes.append(_proxy_latency(self.metrics_port))
                t = time.perf_counter()
                wire.send_raw(frame)
                wire.read_frame()
                rtt = time.perf_counter() - t
                if t0 + 1 + self.warm <= now <= t0 + 1 + self.warm + self.seconds:
                    self.rtts.append(rtt * 1000)
                self._stop.wait(PROBE_INTERVAL_S)
        finally:
            wire.close()

    def summary(self) -> dict:
        out: dict = {}
        if self.rtts:
            r = sorted(self.rtts)
            out["probe_ms"] = {
                "n": len(r),
                "p50": r[len(r) // 2],
                "mean": statistics.mean(r),
                "p90": r[int(len(r) * 0.9)],
            }
        if len(self.scrapes) == 2:
            a, b = self.scrapes
            out["proxy_upstream_ms"] = {
                api: (b[api][0] - a.get(api, (0, 0))[0]) / n * 1000
                for api in b
                if (n := b[api][1] - a.get(api, (0, 0))[1]) > 0
            }
        return out


def calibrate(bootstrap: str) -> tuple[dict, str]:
    """``kafka-throttle-proxy calibrate`` against the cluster: the proxy config's ``quotas.request_costs`` (as a
    dotted extra for ProxyProcess) and the section it printed, comments and all."""
    import yaml

    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "calibrate", "--bootstrap-server", bootstrap.split(",")[0]],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        raise SystemExit(f"calibrate failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    print(done.stdout, f"(calibrate took {time.monotonic() - t0:.0f} s)", sep="", flush=True)
    return {"quotas.request_costs": yaml.safe_load(done.stdout)["quotas"]["request_costs"]}, done.stdout


def _proxy_latency(port: int) -> dict[str, tuple[float, float]]:
    """api -> (seconds summed, responses) of the proxy's ``ktp_request_latency_seconds``."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return parse_latency(text)


def parse_latency(text: str) -> dict[str, tuple[float, float]]:
    """api -> (seconds summed, responses), from a Prometheus text scrape."""
    sums: dict[str, list[float]] = {}
    for m in re.finditer(r'^ktp_request_latency_seconds_(sum|count)\{api="([^"]+)"\} (\S+)$', text, re.M):
        sums.setdefault(m.group(2), [0.0, 0.0])[0 if m.group(1) == "sum" else 1] = float(m.group(3))
    return {api: (v[0], v[1]) for api, v in sums.items()}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ orchestration
@dataclass
class Result:
    workload: str
    phase: str
    p: float | None
    stats: dict
    load: float
    notes: list[str] = field(default_factory=list)


def run_worker(name: str, bootstrap: str, topic: str, client_id: str, warm: float, seconds: float, kafka_bin: str):
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, "-m", "bench.request_quota", "worker", name, bootstrap, topic, client_id]
        cmd += [str(warm), str(seconds), out.name, kafka_bin]
        subprocess.run(cmd, cwd=REPO, check=True, timeout=(warm + seconds) * 4 + 120, stdin=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def choose_p(direct: float, proxied: float) -> float:
    """P (%) such that a broker charging :data:`NOMINAL_MS` a request allows a quarter of the direct rate, and at
    most 40 % of the rate through the proxy."""
    target = min(direct * TARGET_OF_DIRECT, proxied * MAX_OF_PROXY)
    return max(round(target * NOMINAL_MS / 10, 2), 0.01)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "worker":
        ns = argparse.Namespace(
            **dict(zip(["name", "bootstrap", "topic", "client_id"], argv[1:5], strict=True)),
            warm=float(argv[5]),
            seconds=float(argv[6]),
            kafka_bin=argv[8],
        )
        Path(argv[7]).write_text(json.dumps(WORKERS[ns.name](ns)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=float, default=12)
    ap.add_argument("--seconds", type=float, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved broker / proxy-p rounds per workload")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--phases", default="direct,proxy", help="unthrottled phases before the rounds (warm-up)")
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--p", action="append", default=[], help="name=P: fix P for a workload")
    ap.add_argument("--output", default=str(REPO / "bench" / "REQUEST_QUOTA.md"))
    ap.add_argument(
        "--burn", type=int, default=0, help="busy-loop processes run through the rounds of --burn-rounds (load)"
    )
    ap.add_argument("--burn-rounds", default="", help="1-based rounds (both phases) that run beside --burn")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="run kafka-throttle-proxy calibrate against the fresh cluster first and give its quotas.request_costs "
        "to every proxy that enforces P (issue 50: the costs measured on the cluster itself, not the built-in table)",
    )
    args = ap.parse_args(argv)
    fixed = {k: float(v) for k, v in (x.split("=") for x in args.p)}
    names = [n for n in args.workloads.split(",") if n]
    # The unthrottled phases come first (they warm the brokers' JIT, and P is chosen from them), then the
    # brokers' and the proxy's enforcement of P alternate, so slow drift of the machine hits both alike.
    unthrottled = [p for p in args.phases.split(",") if p]
    phases = unthrottled + ["broker", "proxy-p"] * args.rounds
    burn_rounds = {int(x) for x in args.burn_rounds.split(",") if x}
    from tests.harness import KafkaCluster
    from tests.support import ProxyProcess

    started = datetime.datetime.now(datetime.UTC)
    command = "python -m bench.request_quota " + shlex.join(argv)
    code = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    workdir = Path(tempfile.mkdtemp(prefix="ktp-rq-"))
    results: list[Result] = []
    t_start = time.monotonic()
    with KafkaCluster(args.brokers, workdir=workdir / "kafka") as cluster:
        kafka_bin = json.dumps(cluster.tool_cmd("producer_perf", jvm_opts=("-Xmx512m",)))
        costs_extra: dict = {}
        calibration = ""
        if args.calibrate:
            costs_extra, calibration = calibrate(cluster.bootstrap)
        free = ProxyProcess(workdir, cluster.bootstrap, name="proxy-free").start()
        try:
            for name in names:
                w = WORKLOADS[name]
                rates: dict[str, float] = {}
                p = fixed.get(name)
                for i, phase in enumerate(phases):
                    tag = uuid.uuid4().hex[:6]
                    topic = f"rq-{name}-{phase}-{tag}"
                    _create_topic(cluster.bootstrap, topic, w, args.brokers)
                    time.sleep(1)
                    client_id = f"rq-{name}-{phase}-{tag}"
                    if phase in ("broker", "proxy-p") and p is None:
                        p = choose_p(rates.get("direct", 0) or 4000, rates.get("proxy", 0) or 4000)
                    proxy = None
                    metrics_port: int | None = None
                    bootstrap = cluster.bootstrap
                    if phase == "broker" and p is not None:  # p is set above for both quota phases
                        set_brokers_quota(cluster, client_id, p)
                    elif phase == "proxy":
                        bootstrap = free.bootstrap
                    elif phase == "proxy-p":
                        ents = [{"entity": {"client-id": client_id}, "quotas": {"request_percentage": p}}]
                        metrics_port = _free_port()
                        extra = {"quotas.entities": ents, "metrics.port": metrics_port, **costs_extra}
                        proxy = ProxyProcess(workdir, cluster.bootstrap, extra, name=f"proxy-{name}-{i}").start()
                        bootstrap = proxy.bootstrap
                    bootstrap = worker_bootstrap(name, bootstrap, cluster.bootstrap, topic)
                    os.environ.pop("RQ_JAVA_RATE", None)
                    if phase in ("broker", "proxy-p") and p is not None:  # the rate P allows at NOMINAL_MS
                        os.environ["RQ_JAVA_RATE"] = f"{max(p * 10 / NOMINAL_MS, 50):.0f}"
                    load = os.getloadavg()[0]
                    probe = LoadProbe(
                        _leader_address(cluster.bootstrap, topic), topic, args.warmup, args.seconds,
                        metrics_port if proxy is not None else None,
                    ).start()  # fmt: skip
                    rnd = (i - len(unthrottled)) // 2 + 1 if i >= len(unthrottled) else 0
                    burners = _burn(args.burn if rnd in burn_rounds else 0)
                    try:
                        stats = run_worker(name, bootstrap, topic, client_id, args.warmup, args.seconds, kafka_bin)
                    finally:
                        for b in burners:
                            b.kill()
                            b.wait()
                    stats["burn"] = len(burners)
                    stats.update(probe.stop())
                    if proxy is not None:
                        proxy.terminate()
                    rates.setdefault(phase, stats["rate"])
                    r = Result(name, phase, p if phase in ("broker", "proxy-p") else None, stats, load)
                    results.append(r)
                    print(f"{name:18} {phase:8} P={r.p} {json.dumps(stats)} load {load:.1f}", flush=True)
        finally:
            free.terminate()
        info = [
            f"- Kafka {cluster.version}, {args.brokers} combined KRaft nodes (tests.harness); every workload's "
            "topic led by broker 1; machine: "
            f"{os.cpu_count()} CPUs shared with the brokers, the clients and the proxy (and other work).",
        ]
    shutil.rmtree(workdir, ignore_errors=True)
    minutes = (time.monotonic() - t_start) / 60
    Path(args.output).with_suffix(".json").write_text(json.dumps([r.__dict__ for r in results], indent=1))
    table = format_table(results)
    table += ["", *format_load_table(results)]
    print("\n".join(table))
    doc = [
        "# KIP-124 request_percentage: the brokers' enforcement vs the proxy's",
        "",
        f"- Command: `{command}` ({minutes:.0f} min); date {started:%Y-%m-%d %H:%M} UTC; code {code.stdout.strip()}.",
        *info,
        f"- Each phase: {args.warmup:g} s warm-up, then {args.seconds:g} s measured; load average (1 min) read "
        f"before each phase; {args.rounds} interleaved rounds of brokers-enforce / proxy-enforces per workload.",
        "",
        *table,
        "",
    ]
    if calibration:
        doc += ["The proxy's request costs, as `kafka-throttle-proxy calibrate` printed them for this cluster:", ""]
        doc += ["```yaml", *calibration.rstrip().splitlines(), "```", ""]
    Path(args.output).write_text("\n".join(doc))
    print(f"wrote {args.output}")
    return 0


def set_brokers_quota(cluster, client_id: str, p: float) -> None:
    """``request_percentage = p`` on the brokers for ``client_id`` (``kafka-configs``), given a second to reach
    every broker before the client starts."""
    cluster.tool(
        "configs", "--bootstrap-server", cluster.bootstrap, "--alter", "--entity-type", "clients",
        "--entity-name", client_id, "--add-config", f"request_percentage={p}", check=True,
    )  # fmt: skip
    time.sleep(1)


def worker_bootstrap(name: str, bootstrap: str, cluster_bootstrap: str, topic: str) -> str:
    """What workload ``name``'s worker is given to connect to, ``bootstrap`` being the cluster or a proxy."""
    if name == "consumer-tail":
        return f"{bootstrap}|{cluster_bootstrap}"  # the feeder always writes straight to the cluster
    if name == "list-offsets":  # a raw connection: the leader's own listener, or its proxy port
        return _leader_address(bootstrap, topic)
    return bootstrap


def _burn(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes at the default priority: CPU contention on demand, so the brokers' charge per
    request can be read against the probe's round trip at two known loads in one run (issue 36's finding: a
    broker's request-time sensor is wall-clock time on its threads, so it should grow with contention)."""
    code = "while True:\n    pass"
    return [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL) for _ in range(n)]


def _create_topic(bootstrap: str, topic: str, w: Workload, brokers: int) -> None:
    """``w.partitions`` partitions led by broker 1 (followers on the next brokers when ``w.replicas`` > 1)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    assignment = [[1 + j % brokers for j in range(w.replicas)] for _ in range(w.partitions)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=w.partitions, replica_assignment=assignment)])[topic].result(30)


def _leader_address(bootstrap: str, topic: str) -> str:
    """The listener (the broker's, or the proxy's port for it) of partition 0's leader, from Metadata."""
    from kafka.protocol.metadata import MetadataRequest

    from tests.support import KafkaWire

    wire = KafkaWire(bootstrap.split(",")[0])
    try:
        for _ in range(50):
            req = MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
            )
            wire.send(req, 12, client_id="rq-probe")
            _, md = wire.recv()
            if md.topics and md.topics[0].partitions and md.topics[0].partitions[0].leader_id >= 0:
                leader = md.topics[0].partitions[0].leader_id
                b = next(b for b in md.brokers if b.node_id == leader)
                return f"{b.host}:{b.port}"
            time.sleep(0.2)
    finally:
        wire.close()
    raise RuntimeError(f"no leader for {topic}")


def _cell(s: dict) -> str:
    return f"{s['rate']:,.0f}"


def _throttle_cell(s: dict) -> str:
    if s.get("throttled") is None:  # Java: average and maximum only
        return f"avg {s.get('avg', 0):.0f}, max {s.get('max', 0):.0f}"
    if not s["throttled"]:
        return "none"
    return f"{s['throttled']:,} answers; p50 {s['p50']:.0f}, p99 {s['p99']:.0f}, max {s['max']:.0f}"


def ratios(results: list[Result], workload: str) -> list[float]:
    """proxy ÷ broker for each interleaved round of ``workload`` (the i-th proxy-p phase against the i-th broker
    phase), rounds where the brokers let nothing through left out."""
    b = [r.stats["rate"] for r in results if r.workload == workload and r.phase == "broker"]
    pp = [r.stats["rate"] for r in results if r.workload == workload and r.phase == "proxy-p"]
    return [x / y for x, y in zip(pp, b, strict=False) if y > 0]


API_OF = {
    "rdk-produce": "Produce",
    "rdk-produce-all": "Produce",
    "java-produce": "Produce",
    "consumers-nowait": "Fetch",
    "consumer-tail": "Fetch",
    "list-offsets": "ListOffsets",
}
"""The API each workload floods (the proxy's ``ktp_request_latency_seconds`` label)."""


def implied_ms(p: float, rate: float) -> float:
    """The thread time a quota of P % charges a request when it holds a client at ``rate`` requests/s: 0.8 x P %
    x 1 s / rate, the 0.8 being the throttle-then-mute duty cycle of Kafka's windowed formula (docs/quotas.md)."""
    return 0.8 * p / 100 * 1000 / rate


def _probe(r: Result, key: str = "p50") -> float | None:
    pm = r.stats.get("probe_ms")
    return pm[key] if pm else None


def format_load_table(results: list[Result]) -> list[str]:
    """Per workload and round: the brokers' implied charge per request, the probe's round trip beside it (p50,
    mean) and their ratio; the proxy's phase's probe and its own upstream time of the workload's API. Read the
    spread (max/min over rounds) of the charge against that of the ratio: a ratio steadier than the charge is what
    a load factor on the proxy's estimate would need."""
    out = [
        "| workload | round | brokers: implied ms/request | probe p50 / mean ms (brokers' phase) | implied ÷ "
        "probe p50 | implied ÷ probe mean | proxy's phase: probe p50 / mean ms | proxy's upstream ms of the "
        "workload's API | proxy's effective ms/request |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.workload, []).append(r)
    spreads = []
    for name, rs in by.items():
        bs = [r for r in rs if r.phase == "broker"]
        ps = [r for r in rs if r.phase == "proxy-p"]
        charges, r50, rmean = [], [], []
        for i, b in enumerate(bs):
            pp = ps[i] if i < len(ps) else None
            c = implied_ms(b.p, b.stats["rate"]) if b.p and b.stats["rate"] else None
            p50, pmean = _probe(b), _probe(b, "mean")
            if c is not None and p50 and pmean:
                charges.append(c)
                r50.append(c / p50)
                rmean.append(c / pmean)
            up = (pp.stats.get("proxy_upstream_ms") or {}).get(API_OF[name]) if pp else None
            eff = implied_ms(pp.p, pp.stats["rate"]) if pp and pp.p and pp.stats["rate"] else None
            burn = f" (burn {b.stats['burn']})" if b.stats.get("burn") else ""
            out.append(
                f"| {name} | {i + 1}{burn} | {_f(c)} | {_f(p50)} / {_f(pmean)} | "
                f"{_f(c / p50 if c and p50 else None)} | {_f(c / pmean if c and pmean else None)} | "
                f"{_f(_probe(pp) if pp else None)} / "
                f"{_f(_probe(pp, 'mean') if pp else None)} | {_f(up)} | {_f(eff)} |"
            )
        if len(charges) > 1:
            spreads.append(
                f"- {name}: max/min over rounds: implied charge {max(charges) / min(charges):.2f}, ÷ probe p50 "
                f"{max(r50) / min(r50):.2f}, ÷ probe mean {max(rmean) / min(rmean):.2f}"
            )
    return [*out, "", *spreads]


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def format_table(results: list[Result]) -> list[str]:
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.workload, []).append(r)
    out = [
        "| workload | P % | unthrottled req/s direct / via proxy | brokers enforce P: req/s per round | their "
        "throttle_time_ms (last round) | proxy enforces P: req/s per round | its throttle_time_ms (last round) | "
        "proxy ÷ broker: median (range) | rounds | proxy ÷ unthrottled via proxy (median) | load (1 min) |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for name, rs in by.items():
        one = {r.phase: r for r in rs}
        d, px = one.get("direct"), one.get("proxy")
        bs = [r for r in rs if r.phase == "broker"]
        ps = [r for r in rs if r.phase == "proxy-p"]
        p = (bs or ps)[0].p if (bs or ps) else None
        rat = ratios(results, name)
        ratio = f"{statistics.median(rat):.2f} ({min(rat):.2f}-{max(rat):.2f})" if rat else "–"
        under = (
            f"{statistics.median(r.stats['rate'] for r in ps) / px.stats['rate']:.2f}"
            if ps and px and px.stats["rate"]
            else "–"
        )
        loads = f"{min(r.load for r in rs):.1f}-{max(r.load for r in rs):.1f}"
        out.append(
            f"| {WORKLOADS[name].label} | {p if p is not None else '–'} | "
            f"{_cell(d.stats) if d else '–'} / {_cell(px.stats) if px else '–'} | "
            f"{' / '.join(_cell(r.stats) for r in bs) or '–'} | {_throttle_cell(bs[-1].stats) if bs else '–'} | "
            f"{' / '.join(_cell(r.stats) for r in ps) or '–'} | {_throttle_cell(ps[-1].stats) if ps else '–'} | "
            f"{ratio} | {len(rat)} | {under} | {loads} |"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
