"""Fuzzed frames through real proxies with every quota kind on, one in front of the cluster's plaintext listener and
one in front of its SASL listener, while an idempotent producer works through each.

    .venv/bin/python -m bench.fuzz_proxy [--frames 3000000] [--seconds 1800] [--workers 48]
        [--frames-per-connection 50] [--listeners plain,sasl]

The frames are ``tests/harness/fuzz_frames.py``'s cases (as ``bench.fuzz_walks`` and the unit fuzz use them): a
request of every API kafka-python has a schema for, in every version, naming a protected topic and a plain one,
Produce with real record batches, SASL handshakes and first tokens of every mechanism (raw ones after a
SaslHandshake v0), each cut at every offset (its size prefix saying so) and mutated (flipped, inserted, dropped
bytes, lengths set to -1 or the largest int16/int32, bodies sent under another API's header), shuffled. Workers
open connections and pipeline ``--frames-per-connection`` cases each (a case's SASL steps go before its fuzzed
frame); a connection the proxy closes (after the first malformed frame: the rest of its batch is never read) is
replaced. Until ``--frames`` frames are sent or ``--seconds`` pass. Meanwhile an idempotent producer sends
numbered records through each proxy (SCRAM-SHA-512 as alice through the SASL one), read back at the end.

Printed, per proxy and in all: frames sent, the requests and malformed frames the proxy read (its /metrics),
tracebacks, "Task was destroyed but it is pending" lines, ERROR lines, records lost or out of order, RSS. Exit
status 1 when anything the contract forbids showed. Traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.attacks import Normal, Sampler
from tests.harness import KafkaCluster
from tests.harness.fuzz_frames import QUOTAS as FUZZ_QUOTAS
from tests.harness.fuzz_frames import mutations, truncations, valid_cases
from tests.support import ProxyProcess

MiB = 1 << 20
QUOTAS = {
    "quotas.entities": [{"entity": {"user": "<default>"}, "quotas": FUZZ_QUOTAS}],
    "log_level": "ERROR",
}  # one WARNING per closed connection would be millions of lines; errors (and tracebacks) still show
PENDING = "Task was destroyed but it is pending"


def _pool(seed: int, mutations_per_case: int) -> list[bytes]:
    """Every case cut at every offset and mutated, each as the bytes of its frames, shuffled. (The Produce past the
    small-frame size is left to ``bench.fuzz_walks``: its cuts would be gigabytes here.)"""
    rng = random.Random(seed)
    out = []
    for case in valid_cases(large=False, warm=False):
        out += [b"".join(c.frames) for c in truncations(case)]
        out += [b"".join(c.frames) for c in mutations(case, rng, mutations_per_case)]
    rng.shuffle(out)
    return out


@dataclass
class _Side:
    """One proxy under fuzz and what was sent to it."""

    name: str
    proxy: ProxyProcess
    normal: Normal
    metrics_port: int
    frames: int = 0
    cases: int = 0
    connections: int = 0
    rss: list[int] = field(default_factory=list)
    """Start, peak and end."""
    read: tuple[int, int] = (0, 0)
    """Requests the proxy read, connections it closed on an error (its /metrics)."""
    back: tuple[int, bool] = (0, False)
    """The producer's records read back, and whether in order."""
    alive: bool = False


async def _worker(
    side: _Side, pool: list[bytes], deadline: float, per_conn: int, seed: int, budget: list[int], frames: int
) -> None:
    rng = random.Random(seed)
    i = rng.randrange(len(pool))
    while time.monotonic() < deadline and budget[0] < frames:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", side.proxy.port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        side.connections += 1
        batch = [pool[(i + k) % len(pool)] for k in range(per_conn)]
        i = (i + per_conn) % len(pool)
        try:
            writer.write(b"".join(batch))
            await writer.drain()
            sent = sum(_count_frames(b) for b in batch)
            side.frames += sent
            side.cases += len(batch)
            budget[0] += sent
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(65536), 0.2)
        except OSError:
            pass
        finally:
            writer.close()


def _count_frames(data: bytes) -> int:
    n = pos = 0
    while pos + 4 <= len(data):
        pos += 4 + int.from_bytes(data[pos : pos + 4], "big", signed=True)
        n += 1
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> tuple[int, int]:
    """(requests the proxy read, connections it closed on an error) from its /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    def total(name: str) -> int:
        return int(sum(float(v) for v in re.findall(rf"^{name}_total{{[^}}]*}} (\S+)$", text, re.M)))

    return total("ktp_requests"), total("ktp_connection_errors")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=3_000_000, help="frames to send in all (default 3,000,000)")
    ap.add_argument("--seconds", type=float, default=1800, help="at most this long (default 1800)")
    ap.add_argument("--workers", type=int, default=48)
    ap.add_argument("--frames-per-connection", type=int, default=50)
    ap.add_argument("--listeners", default="plain,sasl", help="the proxies to fuzz: plain, sasl or both")
    ap.add_argument("--seed", type=int, default=35)
    return ap.parse_args(argv)


def _start_side(cluster: KafkaCluster, workdir: Path, name: str) -> _Side:
    """A proxy with every quota in front of the ``name`` listener (plain or sasl), and its idempotent producer
    after a first 2 s of records."""
    metrics_port = _free_port()
    upstream = cluster.sasl_bootstrap if name == "sasl" else cluster.bootstrap
    extra = {**QUOTAS, "metrics.port": metrics_port}
    proxy = ProxyProcess(workdir, upstream, extra, name=f"proxy-{name}").start()
    auth = {}
    if name == "sasl":
        auth = {k: v for k, v in cluster.client_config("alice").items() if k != "bootstrap.servers"}
    normal = Normal(proxy.bootstrap, f"fuzz-{name}-{uuid.uuid4().hex[:6]}", auth)
    normal.run(2)
    return _Side(name, proxy, normal, metrics_port)


def _fuzz(sides: list[_Side], pool: list[bytes], args: argparse.Namespace) -> float:
    """The workers fuzz every side while each side's producer works, until ``--frames`` or ``--seconds``; then
    what each proxy read, its RSS, the records read back and whether it lives. Returns the seconds it ran."""
    budget = [0]
    samplers = [Sampler(s.proxy.process.pid) for s in sides]
    for s, sampler in zip(sides, samplers, strict=True):
        sampler.__enter__()
        s.rss.append(sampler.rss())
    t0 = time.monotonic()
    deadline = t0 + args.seconds
    done = [False]  # the fuzz ended: the producers stop too
    normal_for = [
        threading.Thread(target=s.normal.run, args=(args.seconds,), kwargs={"until": lambda: done[0]}) for s in sides
    ]
    for t in normal_for:
        t.start()

    async def run() -> None:
        await asyncio.gather(
            *(
                _worker(
                    sides[i % len(sides)],
                    pool,
                    deadline,
                    args.frames_per_connection,
                    args.seed + i,
                    budget,
                    args.frames,
                )
                for i in range(args.workers)
            )
        )

    asyncio.run(run())
    elapsed = time.monotonic() - t0
    done[0] = True
    for t in normal_for:
        t.join(120)
    time.sleep(2)
    for s, sampler in zip(sides, samplers, strict=True):
        s.rss += [sampler.peak, sampler.rss()]
        sampler.__exit__(None, None, None)
        s.read = _scrape(s.metrics_port)
        s.back = s.normal.read_back()
        s.alive = psutil.pid_exists(s.proxy.process.pid) and s.proxy.alive()
    return elapsed


def _report(args: argparse.Namespace, sides: list[_Side], pool_size: int, elapsed: float) -> bool:
    """Print the table (and every bad log line); True when nothing the contract forbids showed."""
    ok = True
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"# bench.fuzz_proxy, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"`python -m bench.fuzz_proxy --frames {args.frames} --seconds {args.seconds:g} --workers {args.workers} "
        f"--frames-per-connection {args.frames_per_connection} --listeners {args.listeners}`, every quota kind on, "
        f"none binding; {pool_size:,} fuzzed cases in the pool, {elapsed:.0f} s\n"
    )
    print("| figure | " + " | ".join(s.name for s in sides) + " |")
    print("|---|" + "---|" * len(sides))
    rows: dict[str, list[str]] = {}
    for s in sides:
        log = s.proxy.log()
        tracebacks = log.count("Traceback")
        pending = log.count(PENDING)
        errors = sum(1 for ln in log.splitlines() if " ERROR " in ln)
        count, ordered = s.back
        requests, closed = s.read
        lost = s.normal.seq - count
        ok = ok and not (tracebacks or pending or errors or lost or s.normal.errors) and ordered and s.alive
        for label, value in (
            ("frames sent / fuzzed cases / connections", f"{s.frames:,} / {s.cases:,} / {s.connections:,}"),
            ("frames per second", f"{s.frames / elapsed:,.0f}"),
            ("requests read by the proxy / connections it closed on an error", f"{requests:,} / {closed:,}"),
            ("Traceback / pending-task / ERROR lines in the proxy log", f"{tracebacks} / {pending} / {errors}"),
            (
                "idempotent producer: sent, read back, lost, in order",
                f"{s.normal.seq}, {count}, {lost}, {ordered}",
            ),
            ("proxy RSS MiB (start / peak / end)", " / ".join(f"{x / MiB:.0f}" for x in s.rss)),
            ("proxy alive at the end", str(s.alive)),
        ):
            rows.setdefault(label, []).append(value)
        for line in log.splitlines():
            if "Traceback" in line or PENDING in line or " ERROR " in line:
                print(f"    {s.name}: {line[:300]}")
    for label, values in rows.items():
        print(f"| {label} | " + " | ".join(values) + " |")
    print(f"\nframes sent in all: {sum(s.frames for s in sides):,}")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    listeners = [x for x in args.listeners.split(",") if x]
    workdir = Path(tempfile.mkdtemp(prefix="ktp-fuzz-"))
    pool = _pool(args.seed, 20)
    sides: list[_Side] = []
    with KafkaCluster(3, workdir=workdir / "kafka", server_props={"auto.create.topics.enable": "true"}) as cluster:
        try:
            for name in listeners:
                sides.append(_start_side(cluster, workdir, name))
            elapsed = _fuzz(sides, pool, args)
        finally:
            for s in sides:
                s.proxy.terminate()
    return 0 if _report(args, sides, len(pool), elapsed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
