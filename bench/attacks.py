"""The proxy under attack: its memory, and a normal client's latency, while hostile clients do their worst.

    .venv/bin/python -m bench.attacks [--idle 10000] [--dribblers 2000] [--huge 500] [--seconds 20]

Phases, each against the same real 3-broker cluster and one proxy (``queued_max_request_bytes`` at its default
256 MiB), with a normal idempotent producer sending one record at a time throughout and a consumer reading its
records back at the end (none lost, none reordered):

- ``baseline``: nothing else;
- ``idle``: ``--idle`` TCP connections that never send a byte;
- ``dribble+huge``: ``--dribblers`` connections that announce a 1 MiB request and send it at 1 byte/s, plus
  ``--huge`` connections that announce 90 MiB requests and send as fast as the proxy reads.

Printed per phase: proxy RSS at the start, peak (sampled every 0.1 s) and end, the normal producer's round-trip
p50 / p99 / max and its record count. Traffic goes to 127.0.0.1 only; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
from confluent_kafka import Consumer, KafkaError, Message, Producer

from tests.harness import KafkaCluster
from tests.harness.measure import percentile
from tests.support import ProxyProcess

MiB = 1 << 20


class Normal:
    """One well-behaved client: sequential produces, each timed; sequence numbers checked when read back."""

    def __init__(self, bootstrap: str, topic: str, auth: dict[str, str] | None = None) -> None:
        """``auth``: librdkafka settings to authenticate with (SASL), for the producer and the read back."""
        self.bootstrap, self.topic = bootstrap, topic
        self.auth = dict(auth or {})
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "enable.idempotence": True, **self.auth}
        )
        self.seq = 0
        self.errors: list[str] = []

    def _delivered(self, err: KafkaError | None, _m: Message) -> None:
        if err:
            self.errors.append(str(err))

    def run(self, seconds: float, until: Callable[[], bool] | None = None) -> list[float]:
        """Produce for ``seconds``, or until ``until()`` says stop."""
        latencies = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until is not None and until()):
            t0 = time.monotonic()
            self.producer.produce(self.topic, str(self.seq).encode(), on_delivery=self._delivered)
            if self.producer.flush(30):
                self.errors.append("flush timed out")
            latencies.append(time.monotonic() - t0)
            self.seq += 1
            time.sleep(0.02)
        return latencies

    def read_back(self) -> tuple[int, bool]:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"attacks-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **self.auth,
            }
        )
        c.subscribe([self.topic])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < self.seq and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and not m.error():
                value = m.value()
                assert value is not None  # run's records all have one
                got.append(int(value))
        c.close()
        return len(got), got == list(range(len(got)))


class Sampler:
    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> Sampler:
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def open_idle(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def attack_dribble_huge(port: int, dribblers: int, huge: int, seconds: float, result: dict[str, int]) -> None:
    """Run both attacks for ``seconds``; ``result`` gets the bytes the huge senders got into the proxy and how
    many attacking connections the proxy closed meanwhile."""
    drib = open_idle(port, dribblers)
    for s in drib:
        s.sendall(struct.pack(">i", MiB))
    big = open_idle(port, huge)
    sel = selectors.DefaultSelector()
    for s in big:
        s.setblocking(False)
        s.send(struct.pack(">i", 90 * MiB))
        sel.register(s, selectors.EVENT_WRITE)
    chunk = b"\x00" * (256 * 1024)
    closed = 0
    sent = 0
    deadline = time.monotonic() + seconds
    next_drip = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_drip:
            next_drip = time.monotonic() + 1
            for s in list(drib):
                try:
                    s.send(b"\x00")
                except OSError:
                    drib.remove(s)
                    closed += 1
        for key, _ in sel.select(timeout=0.1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)  # the huge senders registered above
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                pass
            except OSError:
                sel.unregister(key.fileobj)
                closed += 1
    for s in drib + big:
        s.close()
    result.update(closed=closed, huge_bytes=sent)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--dribblers", type=int, default=2_000)
    ap.add_argument("--huge", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workdir = Path(tempfile.mkdtemp(prefix="ktp-attacks-"))
    rows = []
    with KafkaCluster(3, workdir=workdir / "kafka", server_props={"auto.create.topics.enable": "true"}) as cluster:
        proxy = ProxyProcess(workdir, cluster.bootstrap, {"request_read_timeout_ms": 60_000}).start()
        try:
            normal = Normal(proxy.bootstrap, f"attacks-{uuid.uuid4().hex[:6]}")
            normal.run(2)  # topic, connections, idempotent producer id
            phases = [("baseline", None), ("idle", "idle"), ("dribble+huge", "dribble")]
            for name, kind in phases:
                with Sampler(proxy.process.pid) as s:
                    start = s.rss()
                    held: list[socket.socket] = []
                    attack = None
                    result: dict[str, int] = {}
                    if kind == "idle":
                        held = open_idle(proxy.port, args.idle)
                    elif kind == "dribble":
                        attack = threading.Thread(
                            target=attack_dribble_huge,
                            daemon=True,
                            args=(proxy.port, args.dribblers, args.huge, args.seconds, result),
                        )
                        attack.start()
                        time.sleep(1)
                    lat = normal.run(args.seconds if kind != "dribble" else args.seconds - 2)
                    if attack is not None:
                        attack.join(args.seconds + 60)
                    end = s.rss()
                    for sock in held:
                        sock.close()
                rows.append((name, start, s.peak, end, lat))
                if result:
                    print(
                        f"{name}: huge senders got {result['huge_bytes'] / MiB:.0f} MiB into the proxy; "
                        f"{result['closed']} attacking connections closed by it"
                    )
            count, ordered = normal.read_back()
        finally:
            proxy.terminate()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"# bench.attacks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"`python -m bench.attacks --idle {args.idle} --dribblers {args.dribblers} --huge {args.huge} "
        f"--seconds {args.seconds:g}`\n"
    )
    print("| phase | RSS start MiB | RSS peak MiB | RSS end MiB | produce p50 ms | p99 ms | max ms | records |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, start, peak, end, lat in rows:
        print(
            f"| {name} | {start / MiB:.0f} | {peak / MiB:.0f} | {end / MiB:.0f} | {percentile(lat, 50) * 1000:.1f} | "
            f"{percentile(lat, 99) * 1000:.1f} | {max(lat) * 1000:.1f} | {len(lat)} |"
        )
    print(f"\nnormal producer: {normal.seq} sent, {count} read back, in order: {ordered}, errors: {len(normal.errors)}")
    return 0 if count == normal.seq and ordered and not normal.errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
