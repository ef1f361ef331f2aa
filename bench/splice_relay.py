"""A zero-copy relay for ``bench.passthrough``: broker->client bytes go socket -> pipe -> socket with
``os.splice``, so they never enter user space; client->broker bytes (small Fetch requests) are copied.

Why: the bare copying relay (``bench.passthrough._relay``) is the floor for a proxy that reads what it
forwards. This one measures how far below that floor a proxy could go on the consume path if it handed
Fetch response bodies to the kernel instead of reading them, i.e. whether such a path is worth building.

Everything runs on the event loop with raw non-blocking sockets: ``loop.add_reader`` on the upstream
socket, ``loop.add_writer`` on the client socket only while the client cannot take more. A splice that
would block raises ``BlockingIOError`` (EAGAIN); note that EAGAIN when splicing *into* the pipe can mean
either "socket empty" or "pipe full" (the pipe counts slots, one per socket buffer fragment, not bytes),
so reading stops whenever writing to the client is blocked and resumes once the client drains the pipe.

Measured over loopback (2-core VM, kernel 6.18, 1 MiB pipe): no gain. The relay's own CPU per GiB is
the same as the copying relay's (the copies it saves are replaced by loopback TCP send/softirq work),
the broker and the client each spend more per GiB, and throughput is lower (~0.7x the copying relay).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from pathlib import Path

_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class _Connection:
    """One client and its upstream connection; closes both (and the pipe) when either side ends."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, client: socket.socket, upstream: socket.socket, pipe_size: int
    ) -> None:
        self.loop = loop
        self.client, self.upstream = client, upstream
        self.cfd, self.ufd = client.fileno(), upstream.fileno()
        self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.pipe_size = fcntl.fcntl(self.pipe_w, fcntl.F_SETPIPE_SZ, pipe_size)
        self.pending = 0  # bytes in the pipe, not yet spliced to the client
        self.upstream_eof = False
        self.requests = bytearray()  # client->broker bytes the upstream socket did not take yet
        self.closed = False
        loop.add_reader(self.ufd, self._upstream_readable)  # broker -> client: splice
        loop.add_reader(self.cfd, self._client_readable)  # client -> broker: copy

    # broker -> client --------------------------------------------------------------------------------

    def _upstream_readable(self) -> None:
        try:
            n = os.splice(self.ufd, self.pipe_w, self.pipe_size, flags=_SPLICE)
        except BlockingIOError:
            n = -1  # nothing to read, or the pipe is full: flushing below settles which
        except OSError:
            self.close()
            return
        if n == 0:
            self.upstream_eof = True
            self.loop.remove_reader(self.ufd)
        elif n > 0:
            self.pending += n
        self._flush()

    def _flush(self) -> None:
        while self.pending:
            try:
                n = os.splice(self.pipe_r, self.cfd, self.pending, flags=_SPLICE)
            except BlockingIOError:
                # the client is not reading: stop reading upstream (TCP backpressure), wait for it
                self.loop.remove_reader(self.ufd)
                self.loop.add_writer(self.cfd, self._client_writable)
                return
            except OSError:
                self.close()
                return
            self.pending -= n
        if self.upstream_eof:
            self.close()

    def _client_writable(self) -> None:
        self._flush()
        if not self.pending and not self.closed:
            self.loop.remove_writer(self.cfd)
            self.loop.add_reader(self.ufd, self._upstream_readable)

    # client -> broker --------------------------------------------------------------------------------

    def _client_readable(self) -> None:
        try:
            data = self.client.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        if self.requests:
            self.requests += data
            return
        try:
            sent = self.upstream.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            return
        if sent < len(data):
            self.requests += data[sent:]
            self.loop.remove_reader(self.cfd)  # one buffer's worth at most, then backpressure
            self.loop.add_writer(self.ufd, self._upstream_writable)

    def _upstream_writable(self) -> None:
        try:
            sent = self.upstream.send(self.requests)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        del self.requests[:sent]
        if not self.requests:
            self.loop.remove_writer(self.ufd)
            self.loop.add_reader(self.cfd, self._client_readable)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.cfd, self.ufd):
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
        for s in (self.client, self.upstream):
            s.close()
        for fd in (self.pipe_r, self.pipe_w):
            with contextlib.suppress(OSError):
                os.close(fd)


async def serve(port_file: Path, upstream: str, pipe_size: int = 1 << 20) -> None:
    """Listen on an ephemeral port (written to ``port_file``), relay each client to ``upstream``."""
    host, port = upstream.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    try:  # fail here, not per connection: above /proc/sys/fs/pipe-max-size needs CAP_SYS_RESOURCE
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, pipe_size)
    finally:
        os.close(r)
        os.close(w)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port_file.write_text(str(listener.getsockname()[1]))

    async def connect(client: socket.socket) -> None:
        upstream_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream_sock.setblocking(False)
        try:
            await loop.sock_connect(upstream_sock, (host, int(port)))
            for s in (client, upstream_sock):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvloop's transports do
            _Connection(loop, client, upstream_sock, pipe_size)
        except BaseException:
            client.close()  # so that the client sees the failure instead of waiting
            upstream_sock.close()
            raise

    tasks: set[asyncio.Task[None]] = set()
    while True:
        client, _ = await loop.sock_accept(listener)
        client.setblocking(False)
        task = loop.create_task(connect(client))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
