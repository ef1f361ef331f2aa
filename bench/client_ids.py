"""100,000 client ids under a ``<default>`` client-id quota: what they cost the proxy, and what a scrape costs.

    .venv/bin/python -m bench.client_ids [--ids 100000] [--scrapes 5]

Each id sends one Metadata request (charged to ``request_percentage``, not binding) through a real proxy in front
of a real cluster, pipelined over a few connections. Printed: proxy RSS before and after, the /metrics page's
size and series count, the scrape's wall time (median and range of ``--scrapes``), and an ApiVersions round trip
measured while scrapes run (median and max), against one measured with no scrape. Traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from tests.harness import KafkaCluster, free_port
from tests.support import ProxyProcess

MiB = 1 << 20


def _metadata(corr: int, client_id: str) -> bytes:
    cid = client_id.encode()
    body = struct.pack(">hhih", 3, 1, corr, len(cid)) + cid + struct.pack(">i", 0)  # Metadata v1, no topics
    return struct.pack(">i", len(body)) + body


def _drain(sock: socket.socket, n: int) -> None:
    buf = b""
    got = 0
    while got < n:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("proxy closed the connection")
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            buf = buf[4 + int.from_bytes(buf[:4], "big") :]
            got += 1


def send_ids(port: int, ids: int, conns: int = 8) -> None:
    def one(k: int) -> None:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        mine = range(k, ids, conns)
        for start in range(0, len(mine), 500):
            batch = mine[start : start + 500]
            s.sendall(b"".join(_metadata(i, f"tenant-{i}") for i in batch))
            _drain(s, len(batch))
        s.close()

    threads = [threading.Thread(target=one, args=(k,)) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def api_versions_rtt(port: int, seconds: float) -> list[float]:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        s.sendall(struct.pack(">ihhih", 14, 18, 0, 1, 4) + b"ping")  # ApiVersions v0
        _drain(s, 1)
        out.append(time.monotonic() - t0)
        time.sleep(0.005)
    s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument("--scrapes", type=int, default=5)
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="ktp-client-ids-"))
    mport = free_port()
    with KafkaCluster(3, workdir=workdir / "kafka") as cluster:
        proxy = ProxyProcess(
            workdir,
            cluster.bootstrap,
            {
                "metrics.port": mport,
                "quotas.entities": [{"entity": {"client-id": "<default>"}, "quotas": {"request_percentage": 10_000}}],
            },
        ).start()
        try:
            proc = psutil.Process(proxy.process.pid)
            send_ids(proxy.port, 200)  # connections, listeners and first allocations settled
            before = proc.memory_info().rss
            t0 = time.monotonic()
            send_ids(proxy.port, args.ids)
            sent_s = time.monotonic() - t0
            after = proc.memory_info().rss
            quiet = api_versions_rtt(proxy.port, 2)
            scrapes: list[float] = []
            size = series = 0
            busy: list[float] = []
            probe = threading.Thread(target=lambda: busy.extend(api_versions_rtt(proxy.port, args.scrapes * 1.5)))
            probe.start()
            for _ in range(args.scrapes):
                t = time.monotonic()
                text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=60).read()
                scrapes.append(time.monotonic() - t)
                size = len(text)
                series = sum(1 for ln in text.splitlines() if ln and not ln.startswith(b"#"))
                time.sleep(1)
            probe.join()
        finally:
            proxy.terminate()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"# bench.client_ids, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"`python -m bench.client_ids --ids {args.ids} --scrapes {args.scrapes}`\n")
    print("| figure | value |")
    print("|---|---|")
    print(f"| client ids sent (one Metadata each) | {args.ids:,} in {sent_s:.1f} s |")
    print(
        f"| proxy RSS MiB before / after / added | {before / MiB:.0f} / {after / MiB:.0f} / "
        f"{(after - before) / MiB:.0f} |"
    )
    print(f"| /metrics page | {size / 1024:.0f} KiB, {series:,} series |")
    print(
        f"| scrape wall time ms (median; min-max) | {statistics.median(scrapes) * 1000:.0f}; "
        f"{min(scrapes) * 1000:.0f}-{max(scrapes) * 1000:.0f} |"
    )
    print(
        f"| ApiVersions RTT ms, no scrape (median / max) | {statistics.median(quiet) * 1000:.2f} / "
        f"{max(quiet) * 1000:.2f} |"
    )
    print(
        f"| ApiVersions RTT ms, while scraping (median / max) | {statistics.median(busy) * 1000:.2f} / "
        f"{max(busy) * 1000:.2f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
