"""The proxy's own cost per byte on the consume path, without Kafka: a fake broker answers pipelined
Fetch requests with ready-made responses, and the proxy's CPU seconds per GiB are measured.

    .venv/bin/python -m bench.passthrough [--version 11] [--size-kib 1024] [--seconds 8] [--inflight 4]

Why: on a shared 2-core machine the real benchmark (``bench.run``) swings with other load, while
CPU time of the proxy process per byte forwarded is what a change to the hot path moves, and it is
far less sensitive to neighbours. Fetch v11 responses are streamed by the proxy (nothing in them is
ever rewritten); v16+ may carry KIP-951 node_endpoints and are assembled and skimmed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from tests.support import ProxyProcess

_I32 = struct.Struct(">i")


def fetch_response(version: int, size: int) -> bytes:
    """One Fetch response body (no header), ``size`` bytes of records in one partition."""
    from kafka.protocol.consumer import FetchResponse

    R = FetchResponse.FetchableTopicResponse
    P = R.PartitionData
    part = P(partition_index=0, error_code=0, high_watermark=1, last_stable_offset=1, log_start_offset=0,
             diverging_epoch=None, current_leader=None, snapshot_id=None, aborted_transactions=[],
             preferred_read_replica=-1, records=b"\x00" * size)
    resp = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[
        R(topic="t", topic_id=uuid.UUID(int=1), partitions=[part])], node_endpoints=[])
    return resp.encode(version=version)


async def _broker(port_file: Path, version: int, size: int) -> None:
    body = fetch_response(version, size)
    flexible = version >= 12
    head = b"\x00" if flexible else b""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (n,) = _I32.unpack(await reader.readexactly(4))
                frame = await reader.readexactly(n)
                api_key, api_version, corr = struct.unpack_from(">hhi", frame)
                if api_key != 1:
                    break  # the proxy's startup discovery (Metadata): refuse, it then learns lazily
                payload = _I32.pack(corr) + head
                writer.writelines([_I32.pack(len(payload) + len(body)), payload, body])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await server.serve_forever()


def _request(version: int, corr: int) -> bytes:
    flexible = version >= 12
    client = b"bench"
    hdr = struct.pack(">hhih", 1, version, corr, len(client)) + client + (b"\x00" if flexible else b"")
    frame = hdr + b"\x00" * 64  # the proxy reads Fetch request headers only
    return _I32.pack(len(frame)) + frame


def _client(address: str, version: int, seconds: float, inflight: int) -> tuple[int, float]:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    corr = 0
    for _ in range(inflight):
        corr += 1
        sock.sendall(_request(version, corr))
    got = 0
    t0 = time.perf_counter()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    left = 0  # bytes of the current response still to read
    while True:
        if left == 0:
            n = sock.recv_into(view[:4], 4)
            while n < 4:
                n += sock.recv_into(view[n:4], 4 - n)
            left = _I32.unpack_from(buf)[0]
            got += 4
        n = sock.recv_into(view, min(left, len(buf)))
        if n == 0:
            raise ConnectionError("proxy closed the connection")
        left -= n
        got += n
        if left == 0:
            if time.perf_counter() - t0 >= seconds:
                break
            corr += 1
            sock.sendall(_request(version, corr))
    wall = time.perf_counter() - t0
    sock.close()
    return got, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", type=int, default=11)
    ap.add_argument("--size-kib", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--log-level", default="WARNING", help="the proxy's (DEBUG: receive buffers per connection)")
    ap.add_argument("--serve-broker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_broker:
        import uvloop

        uvloop.run(_broker(Path(args.serve_broker), args.version, args.size_kib * 1024))
        return
    with tempfile.TemporaryDirectory(prefix="ktp-passthrough-") as tmp:
        port_file = Path(tmp) / "port"
        broker = subprocess.Popen([sys.executable, "-m", "bench.passthrough", "--serve-broker", str(port_file),
                                   "--version", str(args.version), "--size-kib", str(args.size_kib)],
                                  env={**os.environ})
        proxy = None
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            upstream = f"127.0.0.1:{port_file.read_text()}"
            proxy = ProxyProcess(Path(tmp), upstream, {"log_level": args.log_level}).start()
            ps = psutil.Process(proxy.proc.pid)
            for phase in ("direct", "proxy"):
                address = upstream if phase == "direct" else proxy.bootstrap
                _client(address, args.version, 1, args.inflight)  # warm-up
                cpu0 = sum(ps.cpu_times()[:2])
                got, wall = _client(address, args.version, args.seconds, args.inflight)
                cpu = sum(ps.cpu_times()[:2]) - cpu0
                gib = got / (1 << 30)
                print(f"{phase:6} Fetch v{args.version} {args.size_kib} KiB: {got / wall / (1 << 20):8.1f} MiB/s, "
                      f"proxy CPU {cpu / gib if phase == 'proxy' else 0:.3f} s/GiB ({cpu / wall:.0%} of a core)")
        finally:
            if proxy is not None:
                proxy.proc.terminate()
                proxy.proc.wait(10)
            broker.terminate()
            broker.wait(10)
            if args.log_level == "DEBUG":
                print("".join(line for line in (Path(tmp) / "proxy.log").read_text().splitlines(True)
                              if "receive buffer" in line))


if __name__ == "__main__":
    main()
