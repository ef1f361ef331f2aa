"""The fleet at scale (issues 32 and 39): what one member pays to publish and take lease records as the fleet grows,
and how the leases hold the quota.

N simulated members write a lease record every ``sync_interval_ms`` (250) to a real Kafka
(``tests.harness.KafkaCluster``, one broker) with E active entities each (buckets with usage in every interval: the
same E client ids at every member, the worst case for a reader, which takes all of them from every other member).
Every member is a real ``proxy.fleet.member.FleetSync`` with its own ``QuotaManager``, ``FleetLedger`` and lease
holder, all in one asyncio loop.

Why not N full members: a machine of two shared cores cannot run 100 readers of 100 x E entries a second each.
So ``--observers`` of them (2) are full members (publish and take every record into their lease book; their CPU,
sync delay and process CPU are what the table reports), the others publish only (a FleetSync whose read side is
parked, writing every interval as if its records came back at once): the topic and every observer see exactly the
traffic of N members. The publishing members run in worker processes of ``--per-process`` (10) each. Publish CPU
is the demand meter, ``LeaseHolder.record`` and ``LeaseRecord.encode`` of all members (the ledger's adds are the
charge path's cost, not counted), divided by N; "loop lag" is how late any process's event loop woke.

Columns, per member and second of run:
- publish CPU: thread CPU in the ledger's take, the demand meter (``FleetSync._observe``), the holder's record
  and its encoding;
- take + allocate CPU: thread CPU in ``FleetSync.take`` (MAC, decode, ``LeaseBook.take`` and each epoch's max-min
  division), median of observers;
- topic: the sum of the encoded records' sizes, per second (the whole fleet's; every member reads all of it);
- delay p50 / p99: a record's ts (when written) to when an observer took it; own read-back p99: the same for the
  observers' own records (how late a grant is);
- the enforcement columns replay the measured delays through N lease holders (``quotas.fleet_sim``, smooth
  enforcement's pacing at a 10-ms step, one bucket of quota Q): every member's clients ask 3 x Q / N for 30 s,
  then the load moves to the other half of the members for 15 s. 5-s slices of the admitted rate over Q from
  10 to 30 s, the same over those 20 s (the utilisation when demand is 3 x Q), the time until the 1-s rate is back
  at 0.9 x Q after the shift and the largest 1-s and 5-s rate during it, and the largest sum of the shares the
  members enforced at any step after the first 5 s (over Q; at most 1 + N x 1e-6 by construction).

    .venv/bin/python -m bench.fleet_scale --members 3 10 30 100 --entities 1000 --seconds 20
    .venv/bin/python -m bench.fleet_scale --sim-only 200 600 --members 3 10 30 100 --entities 1000  # no Kafka
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import time
import uuid

from config.model import ProxyConfig
from proxy.fleet.member import FleetSync
from proxy.fleet.parts import fleet_parts
from quotas.entities import DEFAULT, QuotaEntity, QuotaStore
from quotas.fleet_leases import LeaseHolder, LeaseRecord
from quotas.fleet_reports import FleetLedger, Usage
from quotas.manager import QuotaManager
from tests.harness.measure import percentile

KEY = "producer_byte_rate"
SECRET_ENV = "KTP_BENCH_FLEET_SECRET"
WINDOW_S = 11.0
NAN = float("nan")
CPU = {"publish": 0.0, "bytes": 0, "reports": 0}
"""Totals over every member of the process: encode is a method of the report, not of a member."""


def _timed_encode():
    """Wrap ``LeaseHolder.record`` and ``LeaseRecord.encode`` once: their CPU and the bytes made count as
    publishing."""
    original = LeaseRecord.encode
    if getattr(original, "_bench", False):
        return
    record = LeaseHolder.record

    def encode(self):
        t0 = time.thread_time()
        value = original(self)
        CPU["publish"] += time.thread_time() - t0
        CPU["bytes"] += len(value)
        CPU["reports"] += 1
        return value

    def timed_record(self, now_ms):
        t0 = time.thread_time()
        rec = record(self, now_ms)
        CPU["publish"] += time.thread_time() - t0
        return rec

    encode._bench = True  # type: ignore[attr-defined]
    LeaseRecord.encode = encode  # type: ignore[method-assign]
    LeaseHolder.record = timed_record  # type: ignore[method-assign]


class BenchLedger(FleetLedger):
    """A member's ledger whose E entities all have usage in every interval (added just before the member takes
    them, as the charges of the interval would have; the adds are not timed: they are the charge path's)."""

    def __init__(self, entities: list[str]) -> None:
        super().__init__()
        self.entities = entities
        self.rng = random.Random()

    def take(self) -> list[Usage]:
        for cid in self.entities:
            self.add((KEY, "", cid), KEY, "", cid, float(self.rng.randint(1, 4096)))
        t0 = time.thread_time()
        usage = super().take()
        CPU["publish"] += time.thread_time() - t0
        return usage


class BenchSync(FleetSync):
    """A member whose taking of records is timed; with ``listen`` False it only publishes (its read side waits
    forever, and it writes every interval as if each record had been read back at once)."""

    def __init__(self, *args, listen: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.listen = listen
        self.fold_cpu = 0.0
        self.own_delays: list[int] = []
        if not listen:
            self.holder.due = lambda now_ms: True  # type: ignore[method-assign]

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

    def _observe(self, usage, now: int) -> None:  # the demand meter (and a look at each bucket's throttles)
        t0 = time.thread_time()
        super()._observe(usage, now)
        CPU["publish"] += time.thread_time() - t0

    def _take_lease(self, value: bytes) -> None:
        """Also note the round trip of this member's own records (write to read-back: how late a grant is)."""
        before = self.leases_taken
        super()._take_lease(value)
        if self.leases_taken > before and self.delays:
            self.own_delays.append(self.delays[-1])


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _member(config: dict, name: str, entities: list[str], listen: bool) -> BenchSync:
    store = QuotaStore()
    store.set(QuotaEntity(None, DEFAULT), KEY, 1e12)  # every client id its own bucket, never throttled
    cfg = ProxyConfig.model_validate({**config, "fleet": {**config["fleet"], "member": name}})
    made = fleet_parts(cfg, None, _now_ms)
    assert made is not None
    parts = dataclasses.replace(made, ledger=BenchLedger(entities))
    qm = QuotaManager(parts.leased(store), max_trackers=max(20_000, 2 * len(entities)), ledger=parts.ledger)
    return BenchSync(cfg, qm, parts, _now_ms, listen=listen)


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
        s.own_delays.clear()
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
        "peer_delays": [d for s, _ in listening for d in s.own_delays],
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


def _leases(
    members: int, delays_ms: list[int], interval_ms: int, seed: int = 1, step_ms: int = 10, kafka: bool = False
) -> dict:
    """The fleet's enforcement with leases (``quotas.fleet_sim``), every record landing a delay drawn from the
    measured ones after it was written: one bucket of quota Q, every member's clients asking 3 x Q / N (3 x Q in
    all) for 30 s, then the load moves to the other half of the members (each half's clients ask 3 x Q) for 15 s.
    Returns the 5-s slices of the admitted rate over Q after the first 10 s, the whole steady part's, the time
    until the 1-s rate is back above 0.9 x Q after the shift, the largest 1-s and 5-s rate during the shift, and
    the largest sum of the shares enforced at any step (over Q)."""
    from quotas.fleet_sim import fleet

    quota = float(1 << 20)
    pool = delays_ms or [interval_ms]
    sim = fleet(
        members,
        {1: quota},
        seed=seed,
        skew_ms=50,
        fallback="floor",  # a connected member's (FleetSync's rule)
        interval_ms=interval_ms,
        step_ms=step_ms,
        write_delay=lambda rng: rng.choice(pool),
        read_delay=lambda rng: 0,
        check_from_ms=5_000,
        kafka=kafka,
    )
    half = {f"m{i:03d}" for i in range(members // 2)} if members > 1 else set()
    sim.run(30_000, lambda now, m, lid: 3 * quota / members)
    second = {m.name for m in sim.members} - half

    def shifted(now, m, lid):
        if not half:
            return 3 * quota
        return 3 * quota / len(second) if m in second else 0.0

    sim.run(45_000, shifted)
    slices = [sim.rate(1, t, t + 5_000) for t in range(10_000, 30_000, 5_000)]
    follow = next((t - 30_000 for t in range(30_000, 44_000, 50) if sim.rate(1, t, t + 1_000) >= 0.9), None)
    return {
        "slices": slices,
        "run": sim.rate(1, 10_000, 30_000),
        "follow_s": None if follow is None else follow / 1000,
        "shift_1s": max(sim.rate(1, t, t + 1_000) for t in range(30_000, 44_000, 100)),
        "shift_5s": max(sim.rate(1, t, t + 5_000) for t in range(30_000, 40_000, 250)),
        "shares_max": sim.max_ratio,
    }


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
    ap.add_argument(
        "--sim-only",
        type=float,
        nargs=2,
        metavar=("P50_MS", "P99_MS"),
        help="no Kafka: replay a log-normal delay of this median and 99th percentile through N lease holders, and "
        "time the lease book's taking of N members' records of E buckets (the enforcement columns only)",
    )
    ap.add_argument(
        "--enforcement",
        choices=["smooth", "kafka"],
        default="smooth",
        help="with --sim-only: the members' enforcement (kafka: a windowed rate and a mute per member)",
    )
    args = ap.parse_args()
    if args.sim_only:
        _sim_only(args)
        return
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
                r.update(_leases(n, r["delays"], args.interval_ms))
                rows.append(r)
                print(
                    _row(r),
                    f"(observers' loop lag p99 {r['observer_lag_p99']:.0f} ms; publishing processes: "
                    f"{r['processes'] - 1}, {100 * r['workers_cpu']:.0f} % of a core together)",
                    flush=True,
                )
    print()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for r in rows:
        print(_row(r))


def _sim_only(args) -> None:
    import math

    import numpy as np

    from quotas.fleet_leases import LeaseBook

    p50, p99 = args.sim_only
    sigma = math.log(p99 / p50) / 2.326
    rng = random.Random(1)
    pool = [max(1, round(rng.lognormvariate(math.log(p50), sigma))) for _ in range(4096)]
    print(
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; delays log-normal p50 {p50:.0f} p99 {p99:.0f}; "
        f"{args.enforcement} enforcement"
    )
    print(
        "| N | E | take + allocate CPU ms/s per member | 5-s slices ÷ quota (10-30 s) "
        "| run ÷ quota (utilisation at 3×) | shift: followed in / largest 1-s, 5-s | shares max |"
    )
    print("|---|---|---|---|---|---|---|")
    for e in args.entities:
        for n in args.members:
            ids = np.sort(np.random.default_rng(n).integers(1, 2**63, e).astype("<u8"))
            q = np.full(e, 1e6)
            book = LeaseBook(args.interval_ms)
            recs = [
                LeaseRecord.decode(
                    LeaseRecord(
                        f"m{m:03d}", k * args.interval_ms + m, n, ids, q, np.full(e, 1e6), np.full(e, 1e4)
                    ).encode()
                )
                for k in range(8)
                for m in range(n)
            ]
            t0 = time.thread_time()
            for rec in recs:
                book.take(rec, grant=rec.member == "m000")
            cpu = (time.thread_time() - t0) / (8 * args.interval_ms / 1000)
            r = _leases(n, pool, args.interval_ms, kafka=args.enforcement == "kafka")
            follow = "never" if r["follow_s"] is None else f"{r['follow_s']:.2f} s"
            print(
                f"| {n} | {e} | {1000 * cpu:.1f} | {' '.join(f'{x:.3f}' for x in r['slices'])} | {r['run']:.3f} | "
                f"{follow} / {r['shift_1s']:.3f}, {r['shift_5s']:.3f} | {r['shares_max']:.4f} |",
                flush=True,
            )


HEADER = (
    "| N | E | publish CPU ms/s | take + allocate CPU ms/s (observers) | observers' process CPU | loop lag p99 ms | "
    "topic MB/s | B/entry | records/s taken | delay p50 / p99 ms | own read-back p99 ms | 5-s slices ÷ quota "
    "(10-30 s) | run ÷ quota (utilisation at 3×) | shift: followed in / largest 1-s, 5-s | shares max | run s |"
)


def _row(r: dict) -> str:
    follow = "never" if r["follow_s"] is None else f"{r['follow_s']:.2f} s"
    return (
        f"| {r['members']} | {r['entities']} | {r['publish_ms_s']:.2f} | {r['fold_ms_s']:.1f} "
        f"({', '.join(map(str, r['fold_range']))}) | {100 * r['process_cpu']:.0f} % | {r['lag_p99']:.0f} | "
        f"{r['topic_mb_s']:.2f} | "
        f"{r['bytes_per_entry']:.1f} | {r['received_s']:.0f} | {r['delay_p50']:.0f} / {r['delay_p99']:.0f} | "
        f"{r['peer_p99']:.0f} | {' '.join(f'{x:.3f}' for x in r['slices'])} | {r['run']:.3f} | "
        f"{follow} / {r['shift_1s']:.3f}, {r['shift_5s']:.3f} | {r['shares_max']:.4f} | {r['seconds']:.0f} |"
    )


if __name__ == "__main__":
    main()
