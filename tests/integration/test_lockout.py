"""Issue 30, item 4: no host can lock out the others, with the default configuration.

One address (127.0.0.2) opens 10,000 idle TCP connections to the proxy and never says a word; a normal client
from 127.0.0.1 must then still produce and consume 1,000 records, and the proxy's memory must stay small. Before,
the connection cap (half the open-file limit) went to the flood, and the normal client was refused outright.

Run twice: with the open-file limit the proxy takes on this machine (it raises its soft limit to the hard one),
and with a hard limit of 1024, a common default, where 10,000 connections are far past every fd the proxy has
and room must be made by shedding the flood's silent connections.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import socket
import struct
import subprocess
import time
import uuid

import psutil
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.cluster

FLOOD = 10_000
RECORDS = 1_000
FLOOD_SOURCE = "127.0.0.2"  # loopback: the whole 127/8 is this machine
MiB = 1 << 20
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux 4.2; Python names it from 3.12


@contextlib.contextmanager
def _fd_limit(soft: int, hard: int):
    """This process's open-file limit set to (soft, hard) for the block, restored after (never the hard limit
    raised: that needs a privilege)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _accept_queue(port: int) -> int:
    """Connections the kernel has completed on the proxy's listener that the proxy has not accepted yet."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())


def _flood(port: int, n: int, batch: int = 96, timeout: float = 90) -> list[socket.socket]:
    """``n`` TCP connections from FLOOD_SOURCE to the proxy, opened ``batch`` at a time without blocking, each
    batch once the proxy has accepted the one before: past the listen backlog (100) the kernel would drop the
    handshake's last ACK, and a connection would reach the proxy only seconds later, or never."""
    socks: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    try:
        while len(socks) < n:
            pending: dict[int, socket.socket] = {}
            poller = select.poll()
            for _ in range(min(batch, n - len(socks))):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                # The port is picked at connect, by the whole address pair: bind's own pick skips every port
                # held on 127.0.0.2, and slows to seconds when earlier runs left thousands in TIME_WAIT.
                s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                s.bind((FLOOD_SOURCE, 0))
                s.setblocking(False)
                err = s.connect_ex(("127.0.0.1", port))
                assert err in (0, errno.EINPROGRESS), os.strerror(err)
                pending[s.fileno()] = s
                poller.register(s, select.POLLOUT)
            while pending:
                assert time.monotonic() < deadline, f"the flood's connections did not connect in {timeout} s"
                for fd, _ev in poller.poll(1000):
                    poller.unregister(fd)
                    pending.pop(fd)
            while _accept_queue(port):
                assert time.monotonic() < deadline, f"the proxy did not accept the flood in {timeout} s"
                time.sleep(0.005)
    except BaseException:
        _close(socks)
        raise
    return socks


def _close(socks: list[socket.socket]) -> None:
    """Reset, not closed: 10,000 sockets left in TIME_WAIT would hold the flood address's ports for a minute."""
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def _settled(proc: psutil.Process, quiet_s: float = 2.0, timeout: float = 60) -> int:
    """Wait until the proxy's open fds stop changing (it has accepted, and refused or shed, the flood)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = proc.num_fds()
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return n
        time.sleep(0.2)
    return last


def _closed_by_proxy(socks: list[socket.socket]) -> int:
    """How many of the flood's connections the proxy has closed (refused, or shed): a peek sees their end."""
    closed = 0
    for s in socks:
        try:
            closed += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            pass  # open, silent
        except OSError:
            closed += 1  # reset
    return closed


def _produce_and_consume(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records delivered to the broker, records consumed back) of RECORDS, for a normal client."""
    delivered = 0

    def on_delivery(err, _msg) -> None:
        nonlocal delivered
        delivered += err is None

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 30_000})
    for i in range(RECORDS):
        producer.produce(topic, value=f"r{i}".encode(), on_delivery=on_delivery)
    producer.flush(40)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: set[bytes | None] = set()
    deadline = time.monotonic() + 40
    while len(got) < RECORDS and time.monotonic() < deadline:
        got.update(m.value() for m in consumer.consume(500, 1.0) if not m.error())
    consumer.close()
    return delivered, len(got)


@pytest.mark.parametrize("proxy_fd_limit", ["machine", 1024])
def test_one_address_with_10000_idle_connections_locks_nobody_out(cluster, fresh_proxy, proxy_fd_limit):
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < FLOOD + 1000:
        pytest.skip(f"the flood needs {FLOOD + 1000} fds in this process; the hard limit is {hard}")
    topic = f"lockout-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # on the cluster: the proxy is under test
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)
    # Default configuration; on "machine" the proxy raises its soft open-file limit to the hard one itself.
    proxy = fresh_proxy(fd_limit=None if proxy_fd_limit == "machine" else proxy_fd_limit)
    proc = psutil.Process(proxy.proc.pid)
    proxy_fds = proc.rlimit(psutil.RLIMIT_NOFILE)[0]
    t0 = time.monotonic()
    with _fd_limit(hard, hard):
        flood = _flood(proxy.port, FLOOD)
        try:
            fds = _settled(proc)
            flooded_s = time.monotonic() - t0
            refused = _closed_by_proxy(flood)
            delivered, consumed = _produce_and_consume(proxy.bootstrap, topic)
            rss = proc.memory_info().rss
            shed = _closed_by_proxy(flood) - refused
        finally:
            _close(flood)
    print(
        f"proxy fd limit {proxy_fds}: flood of {FLOOD} in {flooded_s:.1f} s, proxy fds {fds}, {refused} of the "
        f"flood refused, {shed} shed, delivered {delivered}, consumed {consumed}, RSS {rss / MiB:.0f} MiB, "
        f"{time.monotonic() - t0:.1f} s"
    )
    assert delivered == RECORDS, f"{delivered} of {RECORDS} records delivered past {FLOOD} idle connections"
    assert consumed == RECORDS, f"{consumed} of {RECORDS} records consumed past {FLOOD} idle connections"
    assert rss <= 300 * MiB, f"proxy RSS {rss / MiB:.0f} MiB with {FLOOD} idle connections"
    log = proxy.log()
    assert "Traceback" not in log
    if proxy_fds - 200 < FLOOD + 100:  # the flood does not fit (200 fds kept back): room was made by shedding
        # The client holds a few connections (bootstrap, three brokers, the group coordinator), each at most two fds.
        assert 1 <= shed <= 40, f"{shed} of the flood's connections shed for one client"
        lines = [ln for ln in log.splitlines() if "shed a connection" in ln and FLOOD_SOURCE in ln]
        assert lines, "no line says which connections were shed"
        assert len(lines) <= 10, f"{len(lines)} shed lines: shedding must be logged rate-limited"
    else:  # they all fit, one fd each: nobody is shed, nobody refused
        assert shed == 0 and refused == 0, (shed, refused)
