"""The proxy's own cost per byte on the consume path, without Kafka: a fake broker answers pipelined
Fetch requests with ready-made responses, and the proxy's CPU seconds per GiB are measured.

    .venv/bin/python -m bench.passthrough [--version 11] [--size-kib 1024] [--seconds 8] [--inflight 4]

Why: on a shared 2-core machine the real benchmark (``bench.run``) swings with other load, while
CPU time of the proxy process per byte forwarded is what a change to the hot path moves, and it is
far less sensitive to neighbours. Fetch responses stream through the proxy; from v16 their closing
tagged section (KIP-951 node_endpoints) is found on the way and held back (``protocol.tail_watch``).

A third phase runs the same client through a *bare relay*: a uvloop process that copies bytes
between two sockets and does nothing else. Its CPU per GiB is the floor for any proxy that relays
over TCP (the kernel's receive and send paths), so proxy/relay says what the proxy's own work costs.

A fourth phase, "splice", runs a relay that moves broker->client bytes with ``os.splice`` through a
pipe (``bench.splice_relay``), never copying them into user space: how far below the copying floor a
proxy could go if it handed Fetch response bodies to the kernel. The client checks every response's
size and correlation id (in order), so lost, duplicated or reordered bytes fail the run; ``--verify``
also has the broker send patterned records instead of zeros and compares every byte the client
receives with them (costs client CPU, so not for the figures).
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
from typing import Any

import psutil

from tests.support import ProxyProcess

_I32 = struct.Struct(">i")


def fetch_response(version: int, size: int, pattern: bool = False) -> bytes:
    """One Fetch response body (no header), ``size`` bytes of records in one partition: zeros, or with
    ``pattern`` a sequence of period 251 (a prime), so that a lost or moved byte shows."""
    from kafka.protocol.consumer import FetchResponse

    R = FetchResponse.FetchableTopicResponse
    P = R.PartitionData
    part = P(
        partition_index=0,
        error_code=0,
        high_watermark=1,
        last_stable_offset=1,
        log_start_offset=0,
        diverging_epoch=None,
        current_leader=None,
        snapshot_id=None,
        aborted_transactions=[],
        preferred_read_replica=-1,
        records=(bytes(range(251)) * (size // 251 + 1))[:size] if pattern else b"\x00" * size,
    )
    resp = FetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[R(topic="t", topic_id=uuid.UUID(int=1), partitions=[part])],
        node_endpoints=[],
    )
    return resp.encode(version=version)


async def _broker(port_file: Path, version: int, size: int, pattern: bool) -> None:
    body = fetch_response(version, size, pattern)
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


async def _relay(port_file: Path, upstream: str) -> None:
    """Copy bytes both ways between each client and the upstream, with flow control, nothing else."""
    host, port = upstream.rsplit(":", 1)
    loop = asyncio.get_running_loop()

    class Pump(asyncio.Protocol):
        def __init__(self) -> None:
            self.peer: Pump | None = None
            self.transport: Any = None
            """The loop's transport, once connected (Any: uvloop's transports are no asyncio classes)."""
            self.early: list[bytes] = []  # what arrived before the upstream connection was up

        def connection_made(self, transport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if self.peer is None:
                self.early.append(data)
            else:
                self.peer.transport.write(data)

        def pause_writing(self) -> None:  # only once written to, so only with a peer
            if self.peer is not None:
                self.peer.transport.pause_reading()

        def resume_writing(self) -> None:
            if self.peer is not None:
                self.peer.transport.resume_reading()

        def connection_lost(self, exc) -> None:
            if self.peer is not None and self.peer.transport is not None:
                self.peer.transport.close()

    class Downstream(Pump):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            transport.pause_reading()
            loop.create_task(self._connect())

        async def _connect(self) -> None:
            up = Pump()
            await loop.create_connection(lambda: up, host, int(port))
            up.peer, self.peer = self, up
            up.transport.writelines(self.early)
            self.transport.resume_reading()

    server = await loop.create_server(Downstream, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await server.serve_forever()


def _request(version: int, corr: int) -> bytes:
    flexible = version >= 12
    client = b"bench"
    hdr = struct.pack(">hhih", 1, version, corr, len(client)) + client + (b"\x00" if flexible else b"")
    frame = hdr + b"\x00" * 64  # the proxy reads Fetch request headers only
    return _I32.pack(len(frame)) + frame


def _client(
    address: str, version: int, seconds: float, inflight: int, expect: bytes | None = None
) -> tuple[int, float]:
    """Pipeline ``inflight`` Fetch requests for ``seconds``; return (bytes received, wall seconds).

    Each response must have the first one's size and the next correlation id; with ``expect`` (the
    broker's response after its correlation id) every byte is compared too."""
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
    pos = 0  # where in the response (after its correlation id) the next byte goes
    answered = 0  # responses read
    size = None  # every response's size (the first one's)
    while True:
        if left == 0:
            n = 0
            while n < 8:
                got_now = sock.recv_into(view[n:8], 8 - n)
                if got_now == 0:
                    raise ConnectionError(f"{address} closed the connection")
                n += got_now
            this_size, this_corr = struct.unpack_from(">ii", buf)
            size = this_size if size is None else size
            answered += 1
            if this_size != size or this_corr != answered:
                raise AssertionError(
                    f"response {answered}: size {this_size} correlation id {this_corr}, expected {size} and {answered}"
                )
            left, pos = this_size - 4, 0
            got += 8
        n = sock.recv_into(view, min(left, len(buf)))
        if n == 0:
            raise ConnectionError("proxy closed the connection")
        if expect is not None and bytes(view[:n]) != expect[pos : pos + n]:
            raise AssertionError(f"response {answered}: bytes {pos}..{pos + n} differ from the broker's")
        pos += n
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


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", type=int, default=11)
    ap.add_argument("--size-kib", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--log-level", default="WARNING", help="the proxy's (DEBUG: receive buffers per connection)")
    ap.add_argument("--serve-broker", help=argparse.SUPPRESS)
    ap.add_argument("--pipe-kib", type=int, default=1024, help="splice phase: pipe size (F_SETPIPE_SZ)")
    ap.add_argument("--verify", action="store_true", help="compare every byte received (costs client CPU)")
    ap.add_argument("--serve-relay", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--serve-splice", nargs=2, help=argparse.SUPPRESS)
    return ap.parse_args()


def _serve(args: argparse.Namespace) -> bool:
    """Run as one of the processes the benchmark starts (the fake broker, the bare relay, the splice relay), if
    asked to; False when this is the benchmark itself."""
    if not (args.serve_broker or args.serve_relay or args.serve_splice):
        return False
    import uvloop

    if args.serve_broker:
        uvloop.run(_broker(Path(args.serve_broker), args.version, args.size_kib * 1024, args.verify))
    elif args.serve_relay:
        uvloop.run(_relay(Path(args.serve_relay[0]), args.serve_relay[1]))
    else:
        from bench.splice_relay import serve

        uvloop.run(serve(Path(args.serve_splice[0]), args.serve_splice[1], args.pipe_kib * 1024))
    return True


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    """This module again, as one of its serving processes."""
    return subprocess.Popen([sys.executable, "-m", "bench.passthrough", *args], env={**os.environ})


def _start_relays(tmp: Path, upstream: str, pipe_kib: int) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The bare relay and the splice relay in front of ``upstream``, once both listen (their ports in files)."""
    relay = _spawn("--serve-relay", str(tmp / "relay-port"), upstream)
    splice = _spawn("--serve-splice", str(tmp / "splice-port"), upstream, "--pipe-kib", str(pipe_kib))
    try:
        while not all(f.exists() and f.read_text() for f in (tmp / "relay-port", tmp / "splice-port")):
            if relay.poll() is not None or splice.poll() is not None:
                raise RuntimeError("a relay process did not start (see its error above)")
            time.sleep(0.05)
    except BaseException:
        for child in (relay, splice):
            child.terminate()
            child.wait(10)
        raise
    return relay, splice


def _phases(
    args: argparse.Namespace, upstream: str, middle: dict[str, tuple[str, psutil.Process]], expect: bytes | None
) -> None:
    """The same client direct and through each process in the middle; prints MiB/s and that process's CPU per GiB."""
    per_gib, rate = {}, {}
    for phase in ("direct", "relay", "splice", "proxy"):
        address, ps = middle.get(phase, (upstream, None))
        _client(address, args.version, 1, args.inflight, expect)  # warm-up
        cpu0 = sum(ps.cpu_times()[:2]) if ps else 0.0
        got, wall = _client(address, args.version, args.seconds, args.inflight, expect)
        cpu = sum(ps.cpu_times()[:2]) - cpu0 if ps else 0.0
        per_gib[phase] = cpu / (got / (1 << 30))
        rate[phase] = got / wall / (1 << 20)
        print(
            f"{phase:6} Fetch v{args.version} {args.size_kib} KiB: {rate[phase]:8.1f} MiB/s, "
            f"CPU of the process in the middle {per_gib[phase]:.3f} s/GiB ({cpu / wall:.0%} of a core)"
        )
    print(
        f"proxy/relay CPU per GiB: {per_gib['proxy'] / per_gib['relay']:.2f}, "
        f"splice/relay: {per_gib['splice'] / per_gib['relay']:.2f}; MiB/s over direct: "
        + ", ".join(f"{p} {rate[p] / rate['direct']:.2f}" for p in ("relay", "splice", "proxy"))
    )


def main() -> None:
    args = _arguments()
    if _serve(args):
        return
    expect = None
    if args.verify:
        expect = (b"\x00" if args.version >= 12 else b"") + fetch_response(args.version, args.size_kib * 1024, True)
    with tempfile.TemporaryDirectory(prefix="ktp-passthrough-") as tmp:
        port_file = Path(tmp) / "port"
        broker = _spawn(
            "--serve-broker", str(port_file), "--version", str(args.version), "--size-kib", str(args.size_kib),
            *(["--verify"] if args.verify else []),
        )  # fmt: skip
        proxy = None
        relays: tuple[subprocess.Popen[bytes], ...] = ()
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            upstream = f"127.0.0.1:{port_file.read_text()}"
            relay, splice = relays = _start_relays(Path(tmp), upstream, args.pipe_kib)
            proxy = ProxyProcess(Path(tmp), upstream, {"log_level": args.log_level}).start()
            middle = {"relay": (f"127.0.0.1:{(Path(tmp) / 'relay-port').read_text()}", psutil.Process(relay.pid)),
                      "splice": (f"127.0.0.1:{(Path(tmp) / 'splice-port').read_text()}", psutil.Process(splice.pid)),
                      "proxy": (proxy.bootstrap, psutil.Process(proxy.process.pid))}  # fmt: skip
            _phases(args, upstream, middle, expect)
        finally:
            if proxy is not None:
                proxy.process.terminate()
                proxy.process.wait(10)
            for child in relays:
                child.terminate()
                child.wait(10)
            broker.terminate()
            broker.wait(10)
            if args.log_level == "DEBUG":
                print(
                    "".join(
                        line
                        for line in (Path(tmp) / "proxy.log").read_text().splitlines(True)
                        if "receive buffer" in line
                    )
                )


if __name__ == "__main__":
    main()
