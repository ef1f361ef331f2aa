"""Test helpers shared by integration tests: the proxy as a real subprocess, and a watcher that
records every TCP connection a client process opens (to prove nobody bypasses the proxy)."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent


class ProxyProcess:
    """``kafka-throttle-proxy run`` in a subprocess, on free ports, logging to a file."""

    def __init__(
        self,
        workdir: Path,
        bootstrap_servers: str,
        extra: dict | None = None,
        name: str = "proxy",
        fd_limit: int | None = None,
    ):
        """``fd_limit``: the proxy's open-file limit (soft and hard, so it cannot raise it), else this process's."""
        self.workdir = workdir
        self.fd_limit = fd_limit
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        doc: dict[str, Any] = {
            "upstream": {"bootstrap_servers": bootstrap_servers},
            "listen": {"host": "127.0.0.1", "bootstrap_port": 0, "broker_ports": "ephemeral"},
            "shutdown_grace_ms": 5000,
            "log_level": "INFO",
            # Kafka's semantics (throttle_time_ms, the windowed saw-tooth) are what the tests written before smooth
            # became the default check; a test of smooth, or of the default, says so in ``extra``.
            "quotas": {"enforcement": "kafka"},
        }
        for key, value in (extra or {}).items():
            node = doc
            *parents, last = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        self.config_path.write_text(yaml.safe_dump(doc))
        self.proc: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""

    def start(self, timeout: float = 20) -> ProxyProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "run", "-c", str(self.config_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=None if self.fd_limit is None else self._limit_fds,
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        m = re.search(r"bootstrap\.servers=(\S+)", line)
        if not m or time.monotonic() > deadline:
            raise RuntimeError(f"proxy did not start: {line!r}\n{self.log()}")
        self.bootstrap = m.group(1)
        return self

    def _limit_fds(self) -> None:
        """In the child, before exec: lowering a hard limit needs no privilege, raising it back would."""
        if self.fd_limit is not None:  # always, when this runs (start passes it only then)
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.fd_limit, self.fd_limit))

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def listening_ports(self) -> set[int]:
        assert self.proc is not None
        return {
            c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN
        }

    def terminate(self, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The proxy's process, once :meth:`start` has made it."""
        if self.proc is None:
            raise RuntimeError("the proxy was not started")
        return self.proc


class ConnectionWatcher:
    """Polls the TCP connections of some processes in a background thread.

    Children are not followed by default: the test process is the parent of the brokers and the proxy.
    """

    def __init__(self, pids: Iterable[int], interval: float = 0.02, children: bool = False) -> None:
        self.pids = set(pids)
        self.children = children
        self.interval = interval
        self.remote_ports: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        for pid in list(self.pids):
            try:
                proc = psutil.Process(pid)
                procs = [proc, *proc.children(recursive=True)] if self.children else [proc]
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                try:
                    for c in p.net_connections("tcp"):
                        if c.raddr:
                            self.remote_ports.add(c.raddr.port)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass

    def add(self, pid: int) -> None:
        self.pids.add(pid)

    def __enter__(self) -> ConnectionWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, str]:
    """GET ``path`` from 127.0.0.1:``port`` (a proxy's metrics port: /metrics, /healthz, /readyz): the status and
    the body; an error status is an answer too, and nothing listening is (0, "")."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class KafkaWire:
    """A bare Kafka connection speaking kafka-python's message classes: for tests that need to
    control exactly which bytes go out and when (in-flight requests at shutdown, bad frames)."""

    def __init__(self, address: str, timeout: float = 30) -> None:
        import socket

        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._corr = 0
        self._pending: dict[int, type] = {}

    def send(self, request, version: int, client_id: str = "kafka-wire") -> int:
        self._corr += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self._corr, client_id=client_id)
        self.sock.sendall(request.encode(header=True, framed=True))
        self._pending[self._corr] = request.header.get_response_class()
        return self._corr

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed")
            buf += chunk
        return buf

    def read_frame(self) -> bytes:
        """The next response frame, raw, without its size prefix."""
        return self._read(int.from_bytes(self._read(4), "big"))

    def recv(self):
        frame = self.read_frame()
        corr = int.from_bytes(frame[:4], "big")
        cls = self._pending.pop(corr)
        return corr, cls.decode(frame, header=True)

    def closed_by_peer(self, timeout: float = 10) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.sock.close()
