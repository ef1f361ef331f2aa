"""Peer Kafka proxies measured beside ours in ``bench.run``: start, wait until they serve, measure, stop.

The peers are not part of this repository: ``bench.run`` is given where they are (flags or environment
variables) and skips a peer that is not given.

* ``kroxy``: Kroxylicious (Java/Netty), its binary distribution's ``bin/kroxylicious-start.sh``, with no
  filter and ``portIdentifiesNode`` networking (one bootstrap port, then one port per broker), so plain
  TCP clients work without SNI. The JVM runs with the distribution's defaults.
* ``goproxy``: grepplabs kafka-proxy (Go), ``kafka-proxy server`` with one ``--bootstrap-server-mapping``
  per broker, dynamic listeners and the HTTP endpoint off, every other option at its default.

Both rewrite the broker addresses in Metadata (and FindCoordinator etc.) responses to their own listeners,
as our proxy does. CPU is taken as user+system of the peer's process tree (the JVM itself for Kroxylicious:
its start script ``exec``s java), so a peer that forks is charged for its children too.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import yaml

from tests.harness import KafkaCluster, free_port, metadata_brokers

PEER_SIDES = ("kroxy", "goproxy")
PEER_ENV = {"kroxy": "BENCH_KROXYLICIOUS", "goproxy": "BENCH_KAFKA_PROXY"}
"""Environment variables naming each peer's launcher when the flag is not given."""
PEER_NAMES = {"kroxy": "Kroxylicious", "goproxy": "grepplabs kafka-proxy"}


def _free_block(count: int, host: str = "127.0.0.1") -> int:
    """First port of ``count`` consecutive bindable ports below the ephemeral range (Kroxylicious' layout)."""
    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    start, end = (10000, lo - count) if lo > 11000 else (lo, 65536 - count)
    for _ in range(1000):
        base = random.randint(start, end)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


class PeerProcess:
    """A peer proxy in a subprocess, logging to a file; same surface as ``tests.support.ProxyProcess``."""

    def __init__(self, side: str, workdir: Path, cmd: list[str], bootstrap: str, brokers: int,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.side = side
        self.cmd = cmd
        self.bootstrap = bootstrap
        self.brokers = brokers
        self.env = env or {}
        self.log_path = workdir / f"{side}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""
        self.ports: set[int] = set()
        """The peer's per-broker listener ports: Metadata through it must name these."""

    def start(self, timeout: float = 90) -> PeerProcess:
        """Start and wait until the first bootstrap address answers Metadata with every broker rewritten."""
        cmd = self.cmd
        if shutil.which("setpriv"):  # die with the benchmark if it is killed -9 (setpriv execs: same pid)
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env})  # fmt: skip
        host, port = self.bootstrap.split(",")[0].rsplit(":", 1)
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.side} exited {self.proc.returncode} at start:\n{self.log()[-3000:]}")
            try:
                seen = metadata_brokers(host, int(port))
                ours = [hp for hp in seen.values() if hp[1] in self.ports]
                if len(seen) == self.brokers and len(ours) == self.brokers:
                    return self
                last = f"metadata says {seen}"
            except (OSError, ConnectionError, ValueError) as e:
                last = repr(e)
            time.sleep(0.5)
        self.terminate()
        raise RuntimeError(f"{self.side} not serving after {timeout:.0f} s ({last}):\n{self.log()[-3000:]}")

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The peer's process, once :meth:`start` has made it."""
        if self.proc is None:
            raise RuntimeError(f"{self.side} was not started")
        return self.proc

    @property
    def ps(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def warnings(self) -> list[str]:
        """Lines of the log at warning level or above (both peers' formats)."""
        return [ln for ln in self.log().splitlines() if _is_warning(ln)]

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM; a peer that exits on it with 0, 143 (JVM: 128+SIGTERM) or -15 counts as a clean stop."""
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else self._clean(self.proc.returncode)
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self._clean(self.proc.wait(timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    @staticmethod
    def _clean(rc: int) -> int:
        return 0 if rc in (0, 143, -signal.SIGTERM) else rc


def _is_warning(line: str) -> bool:
    return any(w in line for w in (" WARN ", " ERROR ", "level=warning", "level=error", "level=fatal"))


def kroxylicious(launcher: str, workdir: Path, cluster: KafkaCluster) -> PeerProcess:
    """Kroxylicious with no filter, ``portIdentifiesNode``: bootstrap port P, broker node ids 1..N on P+1..P+N."""
    ids = sorted(b.node_id for b in cluster.brokers)
    base = _free_block(len(ids) + 1)
    config = {
        "virtualClusters": [{
            "name": "bench",
            "targetCluster": {"bootstrapServers": cluster.bootstrap},
            "gateways": [{"name": "plain", "portIdentifiesNode": {
                "bootstrapAddress": f"127.0.0.1:{base}",
                "nodeStartPort": base + 1,
                "nodeIdRanges": [{"name": "brokers", "start": ids[0], "end": ids[-1]}],
            }}],
            "logNetwork": False,
            "logFrames": False,
        }],
    }  # fmt: skip
    if ids != list(range(ids[0], ids[-1] + 1)):
        raise RuntimeError(f"broker node ids {ids} are not contiguous")
    path = workdir / "kroxy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    peer = PeerProcess("kroxy", workdir, [launcher, "--config", str(path)], f"127.0.0.1:{base}", len(ids),
                       env={"HIDE_CMD_LINE": "1"})  # fmt: skip
    peer.ports = set(range(base + 1, base + 1 + len(ids)))
    peer.version = _kroxylicious_version(launcher)
    return peer


def _kroxylicious_version(launcher: str) -> str:
    libs = Path(launcher).resolve().parent.parent / "libs"
    jars = sorted(p.name for p in libs.glob("kroxylicious-runtime-*.jar"))
    return jars[0].removeprefix("kroxylicious-runtime-").removesuffix(".jar") if jars else "?"


def kafka_proxy(binary: str, workdir: Path, cluster: KafkaCluster) -> PeerProcess:
    """grepplabs kafka-proxy, one listener per broker on 127.0.0.1, no dynamic listeners, no HTTP endpoint."""
    mapping = {b.bootstrap: free_port() for b in cluster.brokers}
    cmd = [binary, "server", "--default-listener-ip", "127.0.0.1", "--dynamic-listeners-disable", "--http-disable",
           "--log-level", "warning"]  # fmt: skip
    for upstream, port in mapping.items():
        cmd += ["--bootstrap-server-mapping", f"{upstream},127.0.0.1:{port}"]
    peer = PeerProcess("goproxy", workdir, cmd, ",".join(f"127.0.0.1:{p}" for p in mapping.values()),
                       len(mapping))  # fmt: skip
    peer.ports = set(mapping.values())
    v = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=10)
    peer.version = v.stdout.strip() or "?"
    return peer


def start_peers(given: dict[str, str], workdir: Path, cluster: KafkaCluster) -> dict[str, PeerProcess]:
    """Start each peer whose launcher is given (side -> path); the others are skipped."""
    makers = {"kroxy": kroxylicious, "goproxy": kafka_proxy}
    peers: dict[str, PeerProcess] = {}
    try:
        for side in PEER_SIDES:
            if given.get(side):
                peers[side] = makers[side](given[side], workdir, cluster).start()
    except BaseException:
        for p in peers.values():
            p.terminate()
        raise
    return peers
