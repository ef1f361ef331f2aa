"""The fleet at scale (issue 32, item 2): what one member pays to publish and fold as the fleet grows.

N simulated members publish every ``sync_interval_ms`` (250) to a real Kafka (``tests.harness.KafkaCluster``, one
broker) with E active entities each (buckets with usage in every interval: the same E client ids at every member,
the worst case for a receiver, which must fold all of them from every other member). Every member is a real
``proxy.fleet_member.FleetSync`` with its own ``QuotaManager`` and ``FleetLedger``, all in one asyncio loop.

Why not N full members: a machine of two shared cores cannot run 100 receivers of 100 x E entries a second each.
So ``--observers`` of them (2) are full members (publish and fold; their fold CPU, sync delay and process CPU are
what the table reports), the others publish only (a FleetSync whose read side is parked): the topic and every
observer see exactly the traffic of N members. The publishing members run in worker processes of ``--per-process``
(10) each: on a host loaded by other work one process gets one share of the CPU, too little to make the reports
of 100 members in time. Publish CPU is the drain + encode of all members' reports (the ledger's adds for the E
entities are the charge path's cost, not counted), divided by N; "loop lag" is how late any process's event loop
woke (a starved process shows there, and its reports are late).

Columns, per member and second of run:
- publish CPU: thread CPU in ``FleetLedger.drain`` + ``UsageReport.encode``;
- fold CPU: thread CPU in ``FleetSync.take`` (MAC, decode) and the fold into the trackers, median of observers;
- topic: the sum of the encoded reports' sizes, per second (the whole fleet's; every member reads all of it);
- delay p99: a report's ts (when its usage was drained) to when an observer had folded it into its trackers;
- peak / run over quota: a bucket every member drives at full speed, replayed through N QuotaManagers with the
  measured delays (``_enforcement``): its peak over any W = 11 s against quota x W, and the whole run's against
  quota x (T + W) (Kafka's own bound for one broker);
- staleness error: that peak minus the same fleet's with usage folded at once (the windowed throttle's own
  overshoot, request granularity included, is not the fleet's doing), against the README's (N - 1) x D / W with
  D = interval + delay p99 (a usage is up to one interval old when drained, then a sync delay late).

    .venv/bin/python -m bench.fleet_scale --members 3 10 30 100 --entities 1000 --seconds 20
    .venv/bin/python -m bench.fleet_scale --members 3 10 30 --entities 10000 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
import uuid

from config.model import ProxyConfig
from proxy.fleet_member import FleetSync
from quotas.entities import DEFAULT, QuotaEntity, QuotaStore
from quotas.fleet_reports import FleetLedger, UsageReport
from quotas.manager import QuotaManager
from tests.harness.measure import percentile

KEY = "producer_byte_rate"
SECRET_ENV = "KTP_BENCH_FLEET_SECRET"
WINDOW_S = 11.0
NAN = float("nan")
CPU = {"publish": 0.0, "bytes": 0, "reports": 0}
"""Totals over every member of the process: encode is a method of the report, not of a member."""


def _timed_encode():
    """Wrap ``UsageReport.encode`` once: its CPU and the bytes it made count as publishing."""
    original = UsageReport.encode
    if getattr(original, "_bench", False):
        return

    def encode(self):
        t0 = time.thread_time()
        value = original(self)
        CPU["publish"] += time.thread_time() - t0
        CPU["bytes"] += len(value)
        CPU["reports"] += 1
        return value

    encode._bench = True  # type: ignore[attr-defined]
    UsageReport.encode = encode  # type: ignore[method-assign]


class BenchLedger(FleetLedger):
    """A member's ledger whose E entities all have usage in every interval (added just before the drain, as the
    charges of the interval would have; the adds are not timed: they are the charge path's)."""

    def __init__(self, entities: list[str]) -> None:
        super().__init__()
        self.entities = entities
        self.rng = random.Random()

    def drain(self, member: str, now_ms: int) -> list[UsageReport]:
        for cid in self.entities:
            self.add((KEY, "", cid), KEY, "", cid, float(self.rng.randint(1, 4096)))
        t0 = time.thread_time()
        reports = super().drain(member, now_ms)
        CPU["publish"] += time.thread_time() - t0
        return reports


class BenchSync(FleetSync):
    """A member whose fold is timed; with ``listen`` False it only publishes (its read side waits forever)."""

    def __init__(self, *args, listen: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.listen = listen
        self.fold_cpu = 0.0
        self.peers: frozenset[str] = frozenset()
        self._peer_ts: list[int] = []
        self.peer_delays: list[int] = []

    async def _read(self, consumer) -> None:
        if self.listen:
            await super()._read(consumer)
        else:
            consumer.pause(*consumer.assignment())  # nor fetching: a publisher's consumer would read it all
            await asyncio.Event().wait()

    def take(self, topic, key, value, headers) -> None:
        t0 = time.thread_time()
        super().take(topic, key, value, headers)
        self.fold_cpu += time.thread_time() - t0

    def _fold(self, value) -> None:
        """Also note the reports of the other observers (same process, so the same loop lag): their delay is
        the design's, not that of a starved worker process's late sends."""
        received = self.received
        super()._fold(value)
        if self.received > received and self.peers:
            from quotas.fleet_reports import _HEAD

            _magic, ts, _n, _m, length = _HEAD.unpack_from(value)
            if value[_HEAD.size : _HEAD.size + length].decode() in self.peers:
                self._peer_ts.append(ts)

    def _apply_pending(self) -> None:  # reports are folded in batches, after they are read
        t0 = time.thread_time()
        super()._apply_pending()
        self.fold_cpu += time.thread_time() - t0
        now = self.now_ms()
        self.peer_delays.extend(now - ts for ts in self._peer_ts)
        self._peer_ts.clear()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _member(config: dict, name: str, entities: list[str], listen: bool) -> BenchSync:
    store = QuotaStore()
    store.set(QuotaEntity(None, DEFAULT), KEY, 1e12)  # every client id its own bucket, never throttled
    qm = QuotaManager(store, max_trackers=max(20_000, 2 * len(entities)))
    qm.ledger = BenchLedger(entities)
    cfg = ProxyConfig.model_validate({**config, "fleet": {**config["fleet"], "member": name}})
    return BenchSync(cfg, qm, _now_ms, listen=listen)


def _config(bootstrap: str, fleet: str, interval_ms: int) -> dict:
    return {
        "upstream": {"bootstrap_servers": [bootstrap]},
        "quotas": {"scope": "fleet"},
        "fleet": {"name": fleet, "secret_env": SECRET_ENV, "sync_interval_ms": interval_ms},
    }


async def _connect(syncs: list[BenchSync]) -> None:
    syncs[0].start()  # the first creates the topics (if no one did); the others find them
    await _wait(lambda: syncs[0].connected, 120)
    for s in syncs[1:]:
        s.start()
    await _wait(lambda: all(s.connected for s in syncs), 300)


async def _measure(syncs: list[BenchSync], t0: float, t1: float) -> dict:
    """Counters of this process's members between wall-clock times t0 and t1."""
    await asyncio.sleep(max(0.0, t0 - time.time()))
    for s in syncs:
        s.fold_cpu = 0.0
        s.peer_delays.clear()
        s.delays.clear()
    CPU.update(publish=0.0, bytes=0, reports=0)
    received0 = [s.received for s in syncs]
    lags: list[float] = []

    async def lag() -> None:  # how late the loop wakes: a starved process shows here
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.05)
            lags.append(time.monotonic() - before - 0.05)

    probe = asyncio.get_running_loop().create_task(lag())
    proc0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(max(0.0, t1 - time.time()))
    wall = time.monotonic() - wall0
    proc = time.process_time() - proc0
    probe.cancel()
    listening = [(s, r0) for s, r0 in zip(syncs, received0, strict=True) if s.listen]
    return {
        "wall": wall,
        "publish": CPU["publish"],
        "bytes": CPU["bytes"],
        "reports": CPU["reports"],
        "process": proc,
        "members": len(syncs),
        "lag_p99": percentile(lags, 99, empty=NAN) * 1000,
        "fold": [s.fold_cpu / wall for s, _ in listening],
        "received": [(s.received - r0) / wall for s, r0 in listening],
        "delays": [d for s, _ in listening for d in s.delays],
        "peer_delays": [d for s, _ in listening for d in s.peer_delays],
    }


def _worker(bootstrap: str, fleet: str, interval_ms: int, members: list[str], entities: int, out, cmd) -> None:
    """A process of publishing members (one process cannot make the reports of 100 members on a loaded host)."""
    _timed_encode()

    async def run() -> dict:
        names = [f"c{j:05d}" for j in range(entities)]
        config = _config(bootstrap, fleet, interval_ms)
        syncs = [_member(config, m, names, listen=False) for m in members]
        await _connect(syncs)
        out.put("ready")
        t0, t1 = await asyncio.get_running_loop().run_in_executor(None, cmd.get)
        try:
            return await _measure(syncs, t0, t1)
        finally:
            for s in syncs:
                await s.stop()

    out.put(asyncio.run(run()))


async def _run(
    bootstrap: str, members: int, entities: int, seconds: float, observers: int, interval_ms: int, per_process: int
) -> dict:
    import multiprocessing

    fleet = f"scale{uuid.uuid4().hex[:8]}"
    config = _config(bootstrap, fleet, interval_ms)
    names = [f"c{j:05d}" for j in range(entities)]
    syncs = [_member(config, f"m{i:03d}", names, listen=True) for i in range(observers)]
    for s in syncs:
        s.peers = frozenset(o.member for o in syncs if o is not s)
    await _connect(syncs)
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    rest = [f"m{i:03d}" for i in range(observers, members)]
    groups = [rest[i : i + per_process] for i in range(0, len(rest), per_process)]
    workers = []
    for group in groups:
        out, cmd = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=_worker, args=(bootstrap, fleet, interval_ms, group, entities, out, cmd), daemon=True)
        proc.start()
        workers.append((proc, out, cmd))
    try:
        for _proc, out, _cmd in workers:
            ready = await loop.run_in_executor(None, out.get, True, 600)
            assert ready == "ready", ready
        t0 = time.time() + 4  # every member publishing, the observers' first names learnt
        t1 = t0 + seconds
        for _proc, _out, cmd in workers:
            cmd.put((t0, t1))
        mine = await _measure(syncs, t0, t1)
        theirs = [await loop.run_in_executor(None, out.get, True, 120) for _proc, out, _cmd in workers]
    finally:
        for s in syncs:
            await s.stop()
        for proc, _out, _cmd in workers:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
    parts = [mine, *theirs]
    wall = mine["wall"]
    published = {k: sum(p[k] for p in parts) for k in ("publish", "bytes", "reports")}
    delays = sorted(mine["delays"])
    return {
        "members": members,
        "entities": entities,
        "seconds": wall,
        "processes": len(parts),
        "publish_ms_s": 1000 * published["publish"] / wall / members,
        "fold_ms_s": statistics.median(1000 * f for f in mine["fold"]),
        "fold_range": [round(1000 * f, 1) for f in mine["fold"]],
        "topic_mb_s": published["bytes"] / wall / 1e6,
        "reports_s": published["reports"] / wall,
        "bytes_per_entry": published["bytes"] / max(1, published["reports"] * entities),
        "delay_p50": percentile(delays, 50, empty=NAN),
        "delay_p99": percentile(delays, 99, empty=NAN),
        "received_s": statistics.median(mine["received"]),
        "process_cpu": mine["process"] / wall,
        "lag_p99": max(p["lag_p99"] for p in parts),
        "observer_lag_p99": mine["lag_p99"],
        "peer_p99": percentile(mine["peer_delays"], 99, empty=NAN),
        "workers_cpu": sum(p["process"] for p in theirs) / wall,
        "delays": delays,
    }


async def _wait(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("fleet members did not connect")
        await asyncio.sleep(0.1)


def _enforcement(
    members: int, delays_ms: list[int], interval_ms: int, seconds: float = 40.0, step_ms: int = 10, seed: int = 1
) -> tuple[float, float]:
    """Every member's client sends as fast as its member lets it (one request of 10 ms of quota each step it is
    not throttled) to one bucket of quota Q; each member publishes its usage every interval (at its own phase)
    and the others fold it in after a delay drawn from the measured ones. Returns (peak overshoot of the
    fleet's usage over any W = 11 s, against Q x W; overshoot of the whole run against Q x (T + W))."""
    rng = random.Random(seed)
    quota = 1 << 20
    store = QuotaStore()
    store.set(QuotaEntity(None, "hot"), KEY, quota)
    qms = [QuotaManager(store) for _ in range(members)]
    steps = int(seconds * 1000 / step_ms)
    arrive: dict[int, float] = {}  # step -> usage arriving at every member then
    # member -> step -> its own share of arrive (not folded back)
    own: list[dict[int, float]] = [{} for _ in range(members)]
    pending = [0.0] * members
    phase = [rng.randrange(interval_ms // step_ms) for _ in range(members)]
    blocked = [0] * members
    per_step = [0.0] * steps
    request = quota * step_ms / 1000
    pool = delays_ms or [interval_ms]
    for k in range(steps):
        now = k * step_ms
        total = arrive.pop(k, 0.0)
        for m in range(members):
            got = total - own[m].pop(k, 0.0)
            if got > 0:
                qms[m].apply_remote(_usage(got), now)
            if now >= blocked[m]:
                c = qms[m].charge_rate(KEY, "", "hot", "", request, now)
                assert c is not None  # client id "hot" has a quota
                blocked[m] = now + c.throttle_ms
                per_step[k] += request
                pending[m] += request
            if (k - phase[m]) % (interval_ms // step_ms) == 0 and pending[m]:
                at = k + max(1, round(rng.choice(pool) / step_ms))
                arrive[at] = arrive.get(at, 0.0) + pending[m]
                own[m][at] = own[m].get(at, 0.0) + pending[m]
                pending[m] = 0.0
    w = int(WINDOW_S * 1000 / step_ms)
    acc = sum(per_step[:w])
    peak = acc
    for k in range(w, steps):
        acc += per_step[k] - per_step[k - w]
        peak = max(peak, acc)
    return peak / (quota * WINDOW_S) - 1, sum(per_step) / (quota * (seconds + WINDOW_S)) - 1


def _usage(amount: float):
    from quotas.fleet_reports import Usage

    return Usage(KEY, "", "hot", amount)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, nargs="+", default=[3, 10, 30, 100])
    ap.add_argument("--entities", type=int, nargs="+", default=[1000])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--observers", type=int, default=2)
    ap.add_argument("--interval-ms", type=int, default=250)
    ap.add_argument("--per-process", type=int, default=10, help="publishing members per worker process")
    ap.add_argument(
        "--max-entries-per-s",
        type=float,
        default=2.5e6,
        help="skip runs whose fleet publishes more entries a second than one process can make",
    )
    args = ap.parse_args()
    os.environ.setdefault(SECRET_ENV, "bench-fleet-secret-" + uuid.uuid4().hex)
    _timed_encode()
    from tests.harness import KafkaCluster

    rows = []
    with KafkaCluster(1) as cluster:
        for e in args.entities:
            for n in args.members:
                if n * e * 1000 / args.interval_ms > args.max_entries_per_s:
                    print(f"skipped N={n} E={e}: {n * e * 1000 / args.interval_ms:.0f} entries/s to make", flush=True)
                    continue
                r = asyncio.run(
                    _run(
                        cluster.bootstrap,
                        n,
                        e,
                        args.seconds,
                        min(args.observers, n),
                        args.interval_ms,
                        args.per_process,
                    )
                )
                peak, whole = _enforcement(n, r["delays"], args.interval_ms)
                peak0, _ = _enforcement(n, [0], args.interval_ms)  # the same fleet, usage folded the next step
                d_s = (args.interval_ms + r["delay_p99"]) / 1000
                r.update(err_peak=peak, err_run=whole, err_stale=peak - peak0, formula=(n - 1) * d_s / WINDOW_S)
                rows.append(r)
                print(
                    _row(r),
                    f"(observers' loop lag p99 {r['observer_lag_p99']:.0f} ms, delay p99 of the "
                    f"observers' own reports {r['peer_p99']:.0f} ms; publishing processes: "
                    f"{r['processes'] - 1}, {100 * r['workers_cpu']:.0f} % of a core together)",
                    flush=True,
                )
    print()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for r in rows:
        print(_row(r))


HEADER = (
    "| N | E | publish CPU ms/s | fold CPU ms/s (observers) | observers' process CPU | loop lag p99 ms | "
    "topic MB/s | B/entry | reports/s folded | delay p50 / p99 ms | peak / run over quota | staleness error | "
    "formula (N-1)D/W | run s |"
)


def _row(r: dict) -> str:
    return (
        f"| {r['members']} | {r['entities']} | {r['publish_ms_s']:.2f} | {r['fold_ms_s']:.1f} "
        f"({', '.join(map(str, r['fold_range']))}) | {100 * r['process_cpu']:.0f} % | {r['lag_p99']:.0f} | "
        f"{r['topic_mb_s']:.2f} | "
        f"{r['bytes_per_entry']:.1f} | {r['received_s']:.0f} | {r['delay_p50']:.0f} / {r['delay_p99']:.0f} | "
        f"{100 * r['err_peak']:+.1f} % / {100 * r['err_run']:+.1f} % | {100 * r['err_stale']:+.1f} % | "
        f"{100 * r['formula']:.1f} % | "
        f"{r['seconds']:.0f} |"
    )


if __name__ == "__main__":
    main()
