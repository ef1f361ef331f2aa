"""Fuzzed frames through a real proxy with every quota kind on, while an idempotent producer works.

    .venv/bin/python -m bench.fuzz_proxy [--seconds 180] [--workers 48] [--frames-per-connection 50]

Workers open connections to the proxy and pipeline frames built from real requests of every API the proxy
decodes (CreateTopics, DeleteTopics, CreatePartitions, Describe/AlterClientQuotas, Produce, SaslHandshake,
ApiVersions, Metadata) with random mutations (flipped, cut and inserted bytes, random api keys and versions);
a connection the proxy closes is replaced. Meanwhile an idempotent producer sends numbered records, read back
at the end. Printed: frames sent, frames per second, connections, tracebacks / ERROR lines in the proxy log,
records lost or out of order, proxy RSS at the start, peak and end. Traffic to 127.0.0.1 only; bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

from bench.attacks import Normal, Sampler
from tests.harness import KafkaCluster
from tests.harness.request_bodies import BODIES
from tests.support import ProxyProcess

MiB = 1 << 20
QUOTAS = {
    "quotas.entities": [
        {
            "entity": {"user": "<default>"},
            "quotas": {
                "producer_byte_rate": 10 * 1024 * MiB,
                "consumer_byte_rate": 10 * 1024 * MiB,
                "request_percentage": 10_000,
                "controller_mutation_rate": 100_000,
                "producer_ids_rate": 1_000_000,
            },
        }
    ],
    "log_level": "ERROR",
}  # one WARNING per closed connection would be millions of lines; errors still show


def _frame(rng: random.Random, n: int) -> bytes:
    from protocol.apis import request_is_flexible

    key, version, body = rng.choice(BODIES)
    b = bytearray(body)
    for _ in range(rng.randint(0, 3)):
        if b and rng.random() < 0.5:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif b and rng.random() < 0.5:
            del b[rng.randrange(len(b)) :]
        else:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
    if rng.random() < 0.1:
        key, version = rng.randrange(0, 100), rng.randrange(0, 20)
    head = struct.pack(">hhih", key, version, n & 0x7FFFFFFF, 4) + b"fuzz"
    if request_is_flexible(key, version):
        head += b"\x00"
    return struct.pack(">i", len(head) + len(b)) + head + bytes(b)


async def _worker(port: int, deadline: float, per_conn: int, seed: int, counts: dict[str, int]) -> None:
    rng = random.Random(seed)
    frames = [_frame(rng, i) for i in range(2000)]  # a pool, so building frames does not limit the rate
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        counts["connections"] += 1
        batch = [rng.choice(frames) for _ in range(per_conn)]
        try:
            writer.write(b"".join(batch))
            await writer.drain()
            counts["frames"] += len(batch)
            with_timeout = asyncio.wait_for(reader.read(65536), 0.2)
            with contextlib.suppress(TimeoutError):
                await with_timeout
        except OSError:
            pass
        finally:
            writer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--workers", type=int, default=48)
    ap.add_argument("--frames-per-connection", type=int, default=50)
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="ktp-fuzz-"))
    counts = {"frames": 0, "connections": 0}
    with KafkaCluster(3, workdir=workdir / "kafka", server_props={"auto.create.topics.enable": "true"}) as cluster:
        proxy = ProxyProcess(workdir, cluster.bootstrap, QUOTAS).start()
        try:
            normal = Normal(proxy.bootstrap, f"fuzz-{uuid.uuid4().hex[:6]}")
            normal.run(2)
            with Sampler(proxy.process.pid) as s:
                start = s.rss()
                t = threading.Thread(target=normal.run, args=(args.seconds,), daemon=True)
                t.start()
                t0 = time.monotonic()
                deadline = t0 + args.seconds

                async def run() -> None:
                    await asyncio.gather(
                        *(
                            _worker(proxy.port, deadline, args.frames_per_connection, i, counts)
                            for i in range(args.workers)
                        )
                    )

                asyncio.run(run())
                elapsed = time.monotonic() - t0
                t.join(args.seconds + 60)
                time.sleep(2)
                end = s.rss()
            count, ordered = normal.read_back()
            alive = psutil.pid_exists(proxy.process.pid) and proxy.alive()
        finally:
            proxy.terminate()
        log = proxy.log()
    tracebacks = log.count("Traceback")
    errors = sum(1 for ln in log.splitlines() if " ERROR " in ln)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"# bench.fuzz_proxy, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"`python -m bench.fuzz_proxy --seconds {args.seconds:g} --workers {args.workers} "
        f"--frames-per-connection {args.frames_per_connection}`, every quota kind on, none binding\n"
    )
    print("| figure | value |")
    print("|---|---|")
    print(f"| fuzzed frames sent / connections | {counts['frames']:,} / {counts['connections']:,} |")
    print(f"| frames per second | {counts['frames'] / elapsed:,.0f} |")
    print(f"| Traceback / ERROR lines in the proxy log | {tracebacks} / {errors} |")
    print(f"| idempotent producer: sent, read back, in order | {normal.seq}, {count}, {ordered} |")
    print(f"| proxy RSS MiB (start / peak / end) | {start / MiB:.0f} / {s.peak / MiB:.0f} / {end / MiB:.0f} |")
    print(f"| proxy alive at the end | {alive} |")
    return 0 if tracebacks == 0 and errors == 0 and count == normal.seq and ordered and alive else 1


if __name__ == "__main__":
    raise SystemExit(main())
