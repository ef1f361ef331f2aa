"""A real multi-broker Apache Kafka (KRaft) cluster on 127.0.0.1 for tests.

Design choices (2-core CI machine):
  * Combined mode: every node runs ``process.roles=broker,controller`` with a
    static voter set, so N nodes cost N JVMs.  With 3 nodes, stopping one keeps
    the controller quorum (2/3); stopping two loses it.
  * Listeners per node: PLAINTEXT (also inter-broker), SASL_PLAINTEXT (PLAIN
    and SCRAM-SHA-512) and CONTROLLER.  PLAIN users come from the JAAS config;
    SCRAM users are written at format time (``--add-scram``) so they exist
    before the first start.  All users in ``USERS``.
  * Ports are picked below the kernel's ephemeral range, so a stopped broker's
    ports are not grabbed by client sockets before it is restarted.
  * Readiness is a raw Metadata v4 request sent to every node (no client lib,
    no log noise): ready when each node lists all running nodes as brokers.
  * Processes live in their own process group; they are killed at interpreter
    exit (atexit) and, when started from the main thread, also if this process
    dies abruptly (``setpriv --pdeathsig KILL``; PDEATHSIG follows the thread
    that forked, so clusters started from other threads rely on atexit only).
  * JVM start dominates on 2 cores, so the first cluster/tool run per Kafka cache
    writes an AppCDS archive (see ``kafka_dist.CdsDump``; ``KTP_CDS=0`` disables).
    The cluster that writes the broker archive stops node 1 cleanly first (a few
    seconds, once); afterwards ``stop()`` just SIGKILLs (data is throwaway).

Run ``python -m tests.harness.cluster`` for a self-check.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kafka_dist import DEFAULT_KAFKA_VERSION, CdsDump, KafkaDist, ensure_kafka

USERS: dict[str, str] = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
BROKER_JVM_OPTS: tuple[str, ...] = (
    "-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:+ExplicitGCInvokesConcurrent",
)  # fmt: skip
# Short-lived CLI tools: C1-only JIT + serial GC start faster on 2 cores; the
# *Performance tools get the full JIT (PERF_TOOL_JVM_OPTS) unless jvm_opts is given.
TOOL_JVM_OPTS: tuple[str, ...] = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
PERF_TOOL_JVM_OPTS: tuple[str, ...] = ("-Xmx512m",)

_LOG4J_BROKER = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.req.name = kafka.request.logger
logger.req.level = WARN
"""
_LOG4J_TOOLS = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
"""

_LIVE: set[KafkaCluster] = set()  # started, not yet stopped (killed at exit)
_USED_PORTS: set[int] = set()
_PORT_LOCK = threading.Lock()


@atexit.register
def _kill_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop(timeout=0)


def free_port(host: str = "127.0.0.1") -> int:
    """A bindable port below the kernel's ephemeral range, unique within this process.

    Ports from bind(0) come from the ephemeral range, where a client socket may
    take a stopped broker's port before ``start_broker`` rebinds it.
    """
    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    start, end = (10000, lo - 1) if lo > 11000 else (lo, 65535)
    with _PORT_LOCK:
        for _ in range(1000):
            port = random.randint(start, end)
            if port in _USED_PORTS:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _USED_PORTS.add(port)
            return port
    raise RuntimeError("no free port found")


def _cluster_id() -> str:
    """Random Kafka Uuid string (base64url, 22 chars, never starting with '-')."""
    while True:
        s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not s.startswith("-"):
            return s


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"


def metadata_brokers(host: str, port: int, timeout: float = 3.0) -> dict[int, tuple[str, int]]:
    """Send a Metadata v4 request (no topics) and return {node_id: (host, port)}.

    Raises OSError/ConnectionError if the listener is not serving yet.
    """
    client_id = b"ktp-harness"
    header = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id
    body = struct.pack(">ib", 0, 0)  # topics=[] (not null => no topics), auto_create=false
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            buf += chunk
    pos = 4 + 4 + 4  # size, correlation id, throttle_time_ms
    (count,) = struct.unpack_from(">i", buf, pos)
    pos += 4
    out: dict[int, tuple[str, int]] = {}
    for _ in range(count):
        node_id, hlen = struct.unpack_from(">ih", buf, pos)
        pos += 6
        bhost = buf[pos : pos + hlen].decode()
        pos += hlen
        bport, rlen = struct.unpack_from(">ih", buf, pos)
        pos += 6 + max(rlen, 0)
        out[node_id] = (bhost, bport)
    return out


@dataclass
class BrokerInfo:
    """One combined broker+controller node."""

    node_id: int
    host: str
    port: int  # PLAINTEXT
    sasl_port: int  # SASL_PLAINTEXT (PLAIN, SCRAM-SHA-512)
    controller_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"{self.host}:{self.sasl_port}"

    @property
    def config_path(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KafkaCluster:
    """KRaft cluster of ``num_brokers`` combined nodes on 127.0.0.1.

    ``server_props`` are added to (and override) every node's server.properties,
    e.g. ``{"broker.session.timeout.ms": 6000}``.  ``workdir`` defaults to a temp
    dir that is deleted by ``stop()`` unless ``keep_workdir`` (or env
    ``KTP_KEEP_WORKDIR=1``) is set.
    """

    def __init__(
        self,
        num_brokers: int = 3,
        *,
        version: str = DEFAULT_KAFKA_VERSION,
        workdir: str | Path | None = None,
        server_props: Mapping[str, Any] | None = None,
        users: Mapping[str, str] = USERS,
        host: str = "127.0.0.1",
        jvm_opts: Sequence[str] = BROKER_JVM_OPTS,
        keep_workdir: bool = False,
        dist: KafkaDist | None = None,
        request_log: bool = False,
    ) -> None:
        if num_brokers < 1:
            raise ValueError("num_brokers must be >= 1")
        self.num_brokers = num_brokers
        self.version = version
        self.server_props = {k: str(v) for k, v in (server_props or {}).items()}
        self.users = dict(users)
        self.host = host
        self.jvm_opts = tuple(jvm_opts)
        self.keep_workdir = keep_workdir or os.environ.get("KTP_KEEP_WORKDIR") == "1"
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ktp-kafka-"))
        self.dist = dist
        # Every request the brokers complete, as one JSON line in server.log (kafka.request.logger at DEBUG): their
        # own handler time per request, for bench/broker_request_log.py. It costs the brokers CPU and disk.
        self.request_log = request_log
        self.cluster_id = _cluster_id()
        self.brokers: list[BrokerInfo] = []
        self._cds: tuple[int, CdsDump] | None = None  # node writing the broker AppCDS archive

    # ------------------------------------------------------------------ info
    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def sasl_bootstrap(self) -> str:
        return ",".join(b.sasl_bootstrap for b in self.brokers)

    def broker(self, node_id: int) -> BrokerInfo:
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise KeyError(node_id)

    def client_config(self, user: str | None = None, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """confluent-kafka/librdkafka config; ``user=None`` -> PLAINTEXT."""
        if user is None:
            return {"bootstrap.servers": self.bootstrap}
        return {
            "bootstrap.servers": self.sasl_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": self.users[user],
        }

    def java_client_props(self, user: str | None = None, mechanism: str = "SCRAM-SHA-512") -> Path:
        """Write a Java client .properties file (for --command-config / --producer.config)."""
        path = self.workdir / f"client-{user or 'plaintext'}-{mechanism}.properties"
        lines: list[str] = []
        if user is not None:
            module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
            lines = [
                "security.protocol=SASL_PLAINTEXT",
                f"sasl.mechanism={mechanism}",
                f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
                f'username="{user}" password="{self.users[user]}";',
            ]
        path.write_text("\n".join(lines) + "\n")
        return path

    # ----------------------------------------------------------- lifecycle
    def _node_props(self, b: BrokerInfo) -> dict[str, str]:
        n = self.num_brokers
        rf, isr = min(n, 3), min(n, 2)
        voters = ",".join(f"{x.node_id}@{x.host}:{x.controller_port}" for x in self.brokers)
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        admin = next(iter(self.users))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(b.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SASL_PLAINTEXT://{b.host}:{b.sasl_port},"
            f"CONTROLLER://{b.host}:{b.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{b.host}:{b.port},SASL_PLAINTEXT://{b.host}:{b.sasl_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{admin}" password="{self.users[admin]}" {plain_users};',
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "log.dirs": str(b.dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(isr),
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": str(rf),
            "share.coordinator.state.topic.min.isr": str(isr),
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "log.retention.check.interval.ms": "300000",
        }  # fmt: skip
        props.update(self.server_props)
        return props

    def _write_config(self, b: BrokerInfo) -> None:
        b.dir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in self._node_props(b).items())
        b.config_path.write_text(text)

    def _popen(self, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        # Own process group (killpg on stop); die with us if we're killed -9.
        if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        return subprocess.Popen(cmd, start_new_session=True, **kw)

    def _format(self) -> None:
        scram = [a for u, p in self.users.items() for a in ("--add-scram", f"SCRAM-SHA-512=[name={u},password={p}]")]
        assert self.dist is not None
        log4j = {"log4j2.configurationFile": str(self.workdir / "log4j2-tools.properties")}
        procs = []
        for b in self.brokers:
            cmd = self.dist.java(
                "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(b.config_path), *scram,
                jvm_opts=TOOL_JVM_OPTS, sys_props=log4j,
            )  # fmt: skip
            procs.append((b, self._popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        for b, p in procs:
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"kafka-storage format failed for node {b.node_id}:\n{out.decode()[-4000:]}")

    def _spawn(self, b: BrokerInfo, cds_dump: CdsDump | None = None) -> None:
        assert self.dist is not None
        cmd = self.dist.java(
            "kafka.Kafka", str(b.config_path), jvm_opts=self.jvm_opts, cds_dump=cds_dump,
            sys_props={"log4j2.configurationFile": str(self.workdir / "log4j2.properties")},
        )  # fmt: skip
        with open(b.log_path, "ab") as log:
            b.proc = self._popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=b.dir)

    def start(self, timeout: float = 120) -> KafkaCluster:
        """Format storage, start all nodes and wait until every node serves metadata."""
        if self.brokers:
            raise RuntimeError("cluster already started")
        self.dist = self.dist or ensure_kafka(self.version)
        self.workdir.mkdir(parents=True, exist_ok=True)
        logged = _LOG4J_BROKER.replace("logger.req.level = WARN", "logger.req.level = DEBUG")
        (self.workdir / "log4j2.properties").write_text(logged if self.request_log else _LOG4J_BROKER)
        (self.workdir / "log4j2-tools.properties").write_text(_LOG4J_TOOLS)
        self.brokers = [
            BrokerInfo(i, self.host, free_port(self.host), free_port(self.host), free_port(self.host),
                       self.workdir / f"node-{i}")
            for i in range(1, self.num_brokers + 1)
        ]  # fmt: skip
        _LIVE.add(self)
        try:
            for b in self.brokers:
                self._write_config(b)
            self._format()
            # No broker AppCDS archive yet: node 1 writes one when it exits cleanly (see _settle_cds).
            if dump := self.dist.cds_dump("kafka.Kafka"):
                self._cds = (self.brokers[0].node_id, dump)
            for b in self.brokers:
                self._spawn(b, dump if b is self.brokers[0] else None)
            self.wait_ready(timeout)
        except BaseException as e:
            logs = "\n".join(
                f"--- node {b.node_id} ({b.log_path}):\n{_tail(b.log_path)}"
                for b in self.brokers
                if b.log_path.exists()
            )
            keep = self.keep_workdir or not self._own_workdir
            self._settle_cds(graceful=False)
            self.stop(timeout=0)
            if isinstance(e, KeyboardInterrupt):
                raise
            where = f"workdir {self.workdir}" if keep else "set KTP_KEEP_WORKDIR=1 to keep the workdir"
            raise RuntimeError(f"Kafka cluster failed to start ({where}): {e}\n{logs}") from e
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until each running node lists exactly the running nodes as brokers."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            running = [b for b in self.brokers if b.proc is not None]
            for b in running:
                if not b.running:
                    raise RuntimeError(
                        f"node {b.node_id} exited with {b.proc.returncode if b.proc else None}:\n{_tail(b.log_path)}"
                    )
            want = {b.node_id for b in running}
            try:
                ok = True
                for b in running:
                    seen = set(metadata_brokers(b.host, b.port))
                    if seen != want:
                        ok, last = False, f"node {b.node_id} sees {sorted(seen)}, want {sorted(want)}"
                        break
                    with socket.create_connection((b.host, b.sasl_port), timeout=2):
                        pass
                if ok:
                    return
            except (OSError, struct.error) as e:
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ready after {timeout}s: {last}")
            time.sleep(0.25)

    def stop_broker(self, node_id: int, *, graceful: bool = True, timeout: float = 60) -> None:
        """Stop one node: SIGTERM (controlled shutdown) or SIGKILL if not graceful."""
        b = self.broker(node_id)
        if self._cds and self._cds[0] == node_id:
            self._settle_cds(graceful=graceful, timeout=timeout)
        if b.proc is not None:
            self._terminate([b.proc], timeout if graceful else 0)
            b.proc = None

    def _settle_cds(self, *, graceful: bool = True, timeout: float = 30) -> None:
        """Stop the node writing the broker AppCDS archive (cleanly, if graceful) and keep the archive.

        Done before the other nodes go, so its controlled shutdown is quick (~5 s,
        once per Kafka cache: later clusters start ~30% faster).
        """
        if self._cds is None:
            return
        node_id, dump = self._cds
        self._cds = None
        b = self.broker(node_id)
        ok = graceful and b.running
        if b.proc is not None:
            self._terminate([b.proc], timeout if ok else 0)
            ok = ok and b.proc.returncode != -signal.SIGKILL
            b.proc = None
        dump.commit(ok)

    def start_broker(self, node_id: int, *, timeout: float = 90) -> None:
        """Restart a stopped node (same config, ports and data) and wait until it serves."""
        b = self.broker(node_id)
        if b.running:
            return
        self._spawn(b)
        self.wait_ready(timeout)

    @staticmethod
    def _terminate(procs: Sequence[subprocess.Popen[Any]], timeout: float) -> None:
        sig = signal.SIGTERM if timeout > 0 else signal.SIGKILL
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def stop(self, timeout: float | None = None, *, keep_workdir: bool | None = None) -> None:
        """Stop all nodes: SIGTERM, then SIGKILL after ``timeout`` seconds (0 = kill now).

        ``timeout=None``: kill at once unless the workdir is kept (its data may be
        reused), where a clean 15 s shutdown is allowed.  Stopping all combined
        nodes gracefully is slow (~7 s: the last ones lose the quorum).
        """
        keep = self.keep_workdir if keep_workdir is None else keep_workdir
        if timeout is None:
            timeout = 15 if keep else 0
        self._settle_cds()
        procs = [b.proc for b in self.brokers if b.proc is not None]
        self._terminate(procs, timeout)
        for b in self.brokers:
            b.proc = None
        _LIVE.discard(self)
        if self._own_workdir and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------- tools
    def tool_cmd(
        self, main_class: str, *args: str, jvm_opts: Sequence[str] | None = None, cds_dump: CdsDump | None = None
    ) -> list[str]:
        """Command line for a Kafka Java tool (``MAIN`` key or class name) on the tools classpath."""
        self.dist = self.dist or ensure_kafka(self.version)
        if jvm_opts is None:
            perf = self.dist.main_class(main_class).endswith("Performance")
            jvm_opts = PERF_TOOL_JVM_OPTS if perf else TOOL_JVM_OPTS
        log4j = self.workdir / "log4j2-tools.properties"
        if not log4j.exists():
            log4j.parent.mkdir(parents=True, exist_ok=True)
            log4j.write_text(_LOG4J_TOOLS)
        props = {"log4j2.configurationFile": str(log4j)}
        return self.dist.java(main_class, *args, jvm_opts=jvm_opts, sys_props=props, cds_dump=cds_dump)

    def tool(
        self,
        main_class: str,
        *args: str,
        timeout: float = 120,
        input: str | None = None,
        check: bool = False,
        jvm_opts: Sequence[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a tool to completion (text mode, output captured).

        ``check=True`` raises CalledProcessError (with stdout/stderr) on failure.
        """
        self.dist = self.dist or ensure_kafka(self.version)
        dump = self.dist.cds_dump(main_class)  # first run of the tools classpath writes its AppCDS archive
        cmd = self.tool_cmd(main_class, *args, jvm_opts=jvm_opts, cds_dump=dump)
        ok = False
        try:
            proc = subprocess.run(
                cmd, input=input, capture_output=True, text=True, timeout=timeout,
                stdin=None if input is not None else subprocess.DEVNULL,
            )  # fmt: skip
            ok = proc.returncode == 0
        finally:
            if dump:
                dump.commit(ok)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def tool_popen(
        self, main_class: str, *args: str, jvm_opts: Sequence[str] | None = None, **popen_kw: Any
    ) -> subprocess.Popen[Any]:
        """Start a tool in the background (own process group; killed if we die)."""
        return self._popen(self.tool_cmd(main_class, *args, jvm_opts=jvm_opts), **popen_kw)


def _self_check() -> None:  # pragma: no cover - manual smoke test
    import argparse
    import sys

    from confluent_kafka import Consumer, Producer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--brokers", type=int, default=3)
    ap.add_argument("--version", default=DEFAULT_KAFKA_VERSION)
    ap.add_argument("--failover", action="store_true", help="also stop/restart node 1")
    ap.add_argument("--tools", action="store_true", help="also run every MAIN tool once")
    opts = ap.parse_args()

    def step(msg: str, t0: float) -> float:
        now = time.monotonic()
        print(f"  {msg}: {now - t0:.1f}s", flush=True)
        return now

    t = t_all = time.monotonic()
    dist = ensure_kafka(opts.version)
    t = step(f"ensure_kafka({dist.version}) -> {dist.libs_dir}", t)
    cluster = KafkaCluster(opts.brokers, version=opts.version, dist=dist)
    with cluster:
        t = step(f"start {opts.brokers} nodes, bootstrap={cluster.bootstrap} sasl={cluster.sasl_bootstrap}", t)
        rf = min(opts.brokers, 3)
        r = cluster.tool("topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", "smoke",
                         "--partitions", "3", "--replication-factor", str(rf))  # fmt: skip
        if r.returncode != 0:
            sys.exit(f"TopicCommand failed:\n{r.stdout}\n{r.stderr}")
        t = step("TopicCommand --create", t)
        for user, mech in (("alice", "SCRAM-SHA-512"), ("bob", "PLAIN")):
            conf = cluster.client_config(user, mech)
            p = Producer(conf)
            p.produce("smoke", key=user.encode(), value=f"hello from {user}".encode())
            if p.flush(30) != 0:
                sys.exit(f"produce as {user}/{mech} failed")
            del p  # destroy the client now (it would log disconnects at shutdown)
            c = Consumer({**conf, "group.id": f"g-{user}", "auto.offset.reset": "earliest"})
            c.subscribe(["smoke"])
            got = None
            deadline = time.monotonic() + 60
            while got is None and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is not None and m.error() is None and m.key() == user.encode():
                    got = m.value()
            c.close()
            if got is None:
                sys.exit(f"consume as {user}/{mech} failed")
            t = step(f"produce+consume as {user} over SASL {mech}: {got!r}", t)
        if opts.tools:
            bs, cfg = cluster.bootstrap, str(cluster.java_client_props("alice"))
            runs: list[tuple[str, tuple[str, ...], str | None]] = [
                ("console_producer", ("--bootstrap-server", cluster.sasl_bootstrap, "--topic", "smoke",
                                      "--command-config", cfg), "a\nb\n"),
                ("console_consumer", ("--bootstrap-server", bs, "--topic", "smoke", "--from-beginning",
                                      "--max-messages", "4", "--timeout-ms", "30000"), None),
                ("producer_perf", ("--topic", "perf", "--num-records", "1000", "--record-size", "100",
                                   "--throughput", "-1", "--producer-props", f"bootstrap.servers={bs}"), None),
                ("consumer_perf", ("--bootstrap-server", bs, "--topic", "perf", "--messages", "1000"), None),
                ("configs", ("--bootstrap-server", bs, "--alter", "--entity-type", "users", "--entity-name",
                             "alice", "--add-config", "producer_byte_rate=1048576"), None),
                ("configs", ("--bootstrap-server", bs, "--describe", "--entity-type", "users"), None),
            ]  # fmt: skip
            for name, args, stdin in runs:
                r = cluster.tool(name, *args, input=stdin)
                if r.returncode != 0:
                    sys.exit(f"{name} failed:\n{r.stdout}\n{r.stderr}")
                t = step(f"{name} -> {r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else ''}", t)
        if opts.failover and opts.brokers > 1:
            cluster.stop_broker(1)
            t = step("stop_broker(1) (controlled shutdown)", t)
            cluster.wait_ready(60)
            cluster.start_broker(1)
            t = step("start_broker(1)", t)
    step("stop", t)
    step("total", t_all)


if __name__ == "__main__":
    _self_check()
