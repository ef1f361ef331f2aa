"""Run an unmodified Java ``Admin`` client (new or pre-KIP-599) and get its per-topic results.

``java/AdminProbe.java`` drives ``org.apache.kafka.clients.admin.Admin`` (createTopics,
createPartitions, deleteTopics, describeTopics, alterClientQuotas, describeClientQuotas)
and prints one JSON line per topic/entity.  It is compiled here with ``javac`` against
the chosen kafka-clients jar (output cached by source + jar hash) together with the
client's shim, ``java/compat/{new,old}/AdminCompat.java`` (the few API differences, so
no reflection).

Clients (``client=``):
  * ``"new"``: kafka-clients of the broker release (4.4.0, from ``ensure_kafka()``'s broker
    classpath).  Speaks CreateTopics v7, CreatePartitions v3, DeleteTopics v6: the
    KIP-599 "strict" versions (>= v6 / v3 / v5), so a controller mutation quota answers
    THROTTLING_QUOTA_EXCEEDED, which this client retries until its api timeout unless
    the op has ``retry_on_quota=False``.
  * ``"old"``: kafka-clients ``OLD_CLIENTS_VERSION`` (2.6.3, newest 2.6.x; fetched with mvn
    into the harness cache with its runtime deps lz4/snappy/zstd/slf4j, plus slf4j-simple
    for the request log).  Highest versions it speaks -- from the ``common/message/*Request.json``
    ``validVersions`` inside the jar, and confirmed on the wire by ``log_requests=True``
    (see tests/integration/test_admin_probe.py): CreateTopics v5, CreatePartitions v2,
    DeleteTopics v4 (all pre-strict: brokers delay the response instead of failing it),
    AlterClientQuotas v0, DescribeClientQuotas v0.

Usage::

    from tests.harness import admin_probe as ap
    rows = ap.admin_probe(cluster, ap.create(["t1", "t2"], 3), ap.delete(["t1", "t2"]), client="old")
    # [{"op": "create", "topic": "t1", "outcome": "ok", "message": None, "elapsed_ms": 812,
    #   "done_ms": 811, "client_version": "2.6.3/old"}, ...]
    bg = ap.admin_probe_popen(cluster, ap.create(["t3"], 1, retry_on_quota=False))
    ...; rows = bg.result(timeout=60)

Run ``python -m tests.harness.admin_probe`` to fetch the old client and compile both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .cluster import KafkaCluster
from .kafka_dist import (
    CdsDump,
    KafkaDist,
    _jdk_key,
    cache_root,
    cds_enabled,
    ensure_kafka,
    java_executable,
    javac_jar,
    maven_libs,
)

JAVA_DIR = Path(__file__).with_name("java")
SOURCE = JAVA_DIR / "AdminProbe.java"
#: Newest 2.6.x on Central: the last kafka-clients line before KIP-599 (2.7).
OLD_CLIENTS_VERSION = "2.6.3"
#: Highest request versions of the KIP-599 APIs, as verified for each client (see module doc).
REQUEST_VERSIONS: dict[str, dict[str, int]] = {
    "old": {"CREATE_TOPICS": 5, "CREATE_PARTITIONS": 2, "DELETE_TOPICS": 4},
    "new": {"CREATE_TOPICS": 7, "CREATE_PARTITIONS": 3, "DELETE_TOPICS": 6},
}
#: First "strict" version of each API (KIP-599): THROTTLING_QUOTA_EXCEEDED instead of a delayed response.
STRICT_VERSIONS: dict[str, int] = {"CREATE_TOPICS": 6, "CREATE_PARTITIONS": 3, "DELETE_TOPICS": 5}
JVM_OPTS: tuple[str, ...] = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
DEFAULT_ENTITY = "<default>"

Client = Literal["new", "old"]

_OLD_POM = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafka-throttle-proxy.tests</groupId>
  <artifactId>old-kafka-clients</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-clients</artifactId>
      <version>{version}</version></dependency>
    <!-- kafka-clients brings slf4j-api without a binding; slf4j-simple prints the request log to stderr. -->
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>1.7.30</version></dependency>
  </dependencies>
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.8.1</version>
    <configuration><includeScope>runtime</includeScope></configuration>
  </plugin></plugins></build>
</project>
"""

_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
logger.net.name = org.apache.kafka.clients.NetworkClient
logger.net.level = {net_level}
"""

# NetworkClient at DEBUG: "Sending CREATE_TOPICS request with header RequestHeader(apiKey=CREATE_TOPICS,
# apiVersion=7, ...)" (same text in 2.6 and 4.x).
_SENT_RE = re.compile(r"Sending \w+ request with header RequestHeader\(apiKey=(\w+), apiVersion=(\d+)")


class AdminProbeError(RuntimeError):
    """The probe JVM failed (usage error, crash, timeout) or printed something that is not JSON."""


# ---------------------------------------------------------------- jars + build
def old_client_libs(version: str = OLD_CLIENTS_VERSION, *, timeout: float = 600, mvn: str = "mvn") -> Path:
    """kafka-clients ``version`` + runtime deps in ``<cache>/kafka-clients-<version>/libs`` (fetched once)."""
    base = cache_root() / f"kafka-clients-{version}"
    return maven_libs(
        base,
        base / "pom.xml",
        pom_text=_OLD_POM.format(version=version),
        what=f"kafka-clients {version}",
        expect="kafka-clients-*.jar",
        timeout=timeout,
        mvn=mvn,
    )


@dataclass(frozen=True)
class ProbeRuntime:
    """A compiled probe for one client: classpath and logging setup."""

    client: Client
    probe_jar: Path  # AdminProbe + AdminCompat classes
    libs: Path
    log4j2: Path | None  # new client: log4j2 via log4j-slf4j-impl; old: slf4j-simple
    java_bin: str = field(default_factory=java_executable)

    @property
    def clients_jar(self) -> Path:
        return _clients_jar(self.libs)

    @property
    def cds_archive(self) -> Path:
        """AppCDS archive of this probe's classpath (JVM start is most of a probe run on 2 cores)."""
        return self.probe_jar.parent / f"probe-{_jdk_key(self.java_bin)}.jsa"

    def cds_dump(self) -> CdsDump | None:
        """A ``CdsDump`` for the next run if there is no archive yet (``KTP_CDS=0`` disables)."""
        final = self.cds_archive
        if not cds_enabled() or final.exists():
            return None
        return CdsDump(final.with_name(f"{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"), final)

    def command(self, args: Sequence[str], *, log_requests: bool = False, cds_dump: CdsDump | None = None) -> list[str]:
        cds: list[str] = []
        if cds_dump is not None:
            cds = [f"-XX:ArchiveClassesAtExit={cds_dump.tmp}"]
        elif cds_enabled() and self.cds_archive.exists():
            cds = [f"-XX:SharedArchiveFile={self.cds_archive}"]
        props: dict[str, str] = {}
        if self.log4j2 is not None:
            level = "DEBUG" if log_requests else "WARN"
            cfg = self.log4j2.with_name(f"log4j2-{level.lower()}.properties")
            if not cfg.exists():
                cfg.write_text(_LOG4J2.format(net_level=level))
            props["log4j2.configurationFile"] = str(cfg)
        else:
            props |= {
                "org.slf4j.simpleLogger.logFile": "System.err",
                "org.slf4j.simpleLogger.defaultLogLevel": "warn",
                "org.slf4j.simpleLogger.showDateTime": "true",
            }
            if log_requests:
                props["org.slf4j.simpleLogger.log.org.apache.kafka.clients.NetworkClient"] = "debug"
        cp = os.pathsep.join([str(self.probe_jar), str(self.libs / "*")])
        return [
            self.java_bin, "-Xlog:disable", "-Xlog:all=warning:stderr", *JVM_OPTS, *cds, "-Djava.awt.headless=true",
            *(f"-D{k}={v}" for k, v in props.items()), "-cp", cp, "AdminProbe", *args,
        ]  # fmt: skip


def _clients_jar(libs: Path) -> Path:
    jars = sorted(libs.glob("kafka-clients-*.jar"))
    if not jars:
        raise RuntimeError(f"no kafka-clients jar in {libs}")
    return jars[-1]


_RUNTIMES: dict[tuple[Client, str], ProbeRuntime] = {}
_RUNTIME_LOCK = threading.Lock()


def probe_runtime(client: Client = "new", *, dist: KafkaDist | None = None) -> ProbeRuntime:
    """Fetch (old client) and compile (if the source or jar changed) the probe for ``client``."""
    if client not in ("new", "old"):
        raise ValueError(f"client must be 'new' or 'old', not {client!r}")
    libs = (dist or ensure_kafka()).libs_dir if client == "new" else old_client_libs()
    key = (client, str(libs))
    with _RUNTIME_LOCK:
        if key not in _RUNTIMES:
            _RUNTIMES[key] = _compile(client, libs)
        return _RUNTIMES[key]


def _compile(client: Client, libs: Path) -> ProbeRuntime:
    jar = _clients_jar(libs)
    sources = [SOURCE, JAVA_DIR / "compat" / client / "AdminCompat.java"]
    h = hashlib.sha256()
    for src in sources:
        h.update(src.read_bytes())
    h.update(f"{jar.name}:{jar.stat().st_size}".encode())
    base = cache_root() / "admin-probe" / f"{client}-{h.hexdigest()[:16]}"
    probe_jar = base / "admin-probe.jar"
    log4j2 = base / "log4j2.properties" if client == "new" else None
    runtime = ProbeRuntime(client, probe_jar, libs, log4j2)
    javac_jar(sources, str(jar), probe_jar, what=f"AdminProbe against {jar.name}", java_bin=runtime.java_bin)
    return runtime


# ----------------------------------------------------------------- op builders
def _names(topics: str | Iterable[str]) -> str:
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or any(not t or "," in t for t in names):
        raise ValueError(f"bad topic list {topics!r}")
    return ",".join(names)


def _entity(entity: str | Mapping[str, str | None]) -> str:
    """``"user=alice"`` or ``{"user": "alice", "client-id": None}`` (None = default entity)."""
    if isinstance(entity, str):
        return entity
    return ",".join(f"{k}={DEFAULT_ENTITY if v is None else v}" for k, v in entity.items())


def create(
    topics: str | Iterable[str],
    partitions: int,
    *,
    replication_factor: int | None = None,
    validate_only: bool = False,
    retry_on_quota: bool = True,
) -> list[str]:
    """createTopics; ``retry_on_quota=False`` sets retryOnQuotaViolation(false) (no-op on the old client)."""
    args = ["--op", "create", "--topics", _names(topics), "--partitions", str(partitions)]
    if replication_factor is not None:
        args += ["--replication-factor", str(replication_factor)]
    return args + (["--validate-only"] if validate_only else []) + ([] if retry_on_quota else ["--no-retry-on-quota"])


def create_partitions(
    topics: str | Iterable[str], total: int, *, validate_only: bool = False, retry_on_quota: bool = True
) -> list[str]:
    """createPartitions: increase each topic to ``total`` partitions."""
    args = ["--op", "create-partitions", "--topics", _names(topics), "--total", str(total)]
    return args + (["--validate-only"] if validate_only else []) + ([] if retry_on_quota else ["--no-retry-on-quota"])


def delete(topics: str | Iterable[str], *, retry_on_quota: bool = True) -> list[str]:
    return ["--op", "delete", "--topics", _names(topics)] + ([] if retry_on_quota else ["--no-retry-on-quota"])


def describe(topics: str | Iterable[str]) -> list[str]:
    """describeTopics: rows get ``partitions`` (count)."""
    return ["--op", "describe", "--topics", _names(topics)]


def alter_quotas(
    entity: str | Mapping[str, str | None],
    set: Mapping[str, float] | None = None,
    remove: Iterable[str] = (),
    *,
    validate_only: bool = False,
) -> list[str]:
    """alterClientQuotas on one entity, e.g. ``alter_quotas("user=alice", {"consumer_byte_rate": 1024})``."""
    args = ["--op", "alter-quotas", "--entity", _entity(entity)]
    for k, v in (set or {}).items():
        args += ["--set", f"{k}={v}"]
    for k in remove:
        args += ["--remove", k]
    return args + (["--validate-only"] if validate_only else [])


def describe_quotas(entity: str | Mapping[str, str | None], *, strict: bool = False) -> list[str]:
    """describeClientQuotas with a contains (or ``strict``: containsOnly) filter; rows get ``quotas``."""
    return ["--op", "describe-quotas", "--entity", _entity(entity)] + (["--strict"] if strict else [])


def sleep(ms: int) -> list[str]:
    """Pause between ops inside the probe (same Admin client, connections stay open)."""
    return ["--op", "sleep", "--ms", str(int(ms))]


# --------------------------------------------------------------------- running
def java_props(conf: Mapping[str, Any]) -> dict[str, str]:
    """Java client properties from a Java or librdkafka-style config (``KafkaCluster.client_config``).

    ``sasl.username``/``sasl.password`` become ``sasl.jaas.config`` (PLAIN or SCRAM login module).
    """
    out = {k: str(v) for k, v in conf.items() if k not in ("sasl.username", "sasl.password")}
    if "sasl.username" in conf:
        mech = str(conf.get("sasl.mechanism", "PLAIN")).upper()
        module = "plain.PlainLoginModule" if mech == "PLAIN" else "scram.ScramLoginModule"
        user, pw = (str(conf[k]).replace('"', '\\"') for k in ("sasl.username", "sasl.password"))
        out["sasl.jaas.config"] = (
            f'org.apache.kafka.common.security.{module} required username="{user}" password="{pw}";'
        )
    return out


def _flatten(args: Iterable[str | Sequence[str]]) -> list[str]:
    out: list[str] = []
    for a in args:
        out.extend([a] if isinstance(a, str) else map(str, a))
    return out


def probe_args(
    target: KafkaCluster | str,
    *args: str | Sequence[str],
    props: Mapping[str, Any] | None = None,
    user: str | None = None,
    mechanism: str = "SCRAM-SHA-512",
    retries: int | None = None,
    api_timeout_ms: int | None = None,
    retry_backoff_ms: int | None = None,
    request_timeout_ms: int | None = None,
    client_id: str | None = None,
) -> list[str]:
    """AdminProbe's argv (without the JVM part): globals, then the ops in ``args``."""
    if isinstance(target, KafkaCluster):
        bootstrap = target.sasl_bootstrap if user else target.bootstrap
        conf = target.client_config(user, mechanism) if user else {}
    else:
        if user:
            raise ValueError("user= needs a KafkaCluster target (pass SASL settings in props= otherwise)")
        bootstrap, conf = target, {}
    conf = java_props({**conf, **(props or {})})
    out = ["--bootstrap", conf.pop("bootstrap.servers", bootstrap)]
    for flag, val in (("--retries", retries), ("--api-timeout-ms", api_timeout_ms),
                      ("--retry-backoff-ms", retry_backoff_ms), ("--request-timeout-ms", request_timeout_ms),
                      ("--client-id", client_id)):  # fmt: skip
        if val is not None:
            out += [flag, str(val)]
    for k, v in conf.items():
        out += ["--property", f"{k}={v}"]
    ops = _flatten(args)
    if "--op" not in ops:
        raise ValueError("no op given (use create(), delete(), ... or raw '--op' args)")
    return out + ops


class ProbeResults(list):  # list[dict[str, Any]]
    """The probe's JSON rows, plus ``stderr``, ``wall_s`` and (with ``log_requests``) ``requests``."""

    def __init__(self, rows: Iterable[dict[str, Any]], stderr: str, wall_s: float, cmd: list[str]) -> None:
        super().__init__(rows)
        self.stderr = stderr
        self.wall_s = wall_s
        self.cmd = cmd
        #: (API key name, version) of every request the client sent, in order (needs ``log_requests=True``).
        self.requests: list[tuple[str, int]] = [(m[1], int(m[2])) for m in _SENT_RE.finditer(stderr)]

    def versions(self) -> dict[str, set[int]]:
        """API key name -> request versions sent (needs ``log_requests=True``)."""
        out: dict[str, set[int]] = {}
        for api, v in self.requests:
            out.setdefault(api, set()).add(v)
        return out

    def by(self, key: str = "topic", op: str | None = None) -> dict[str, dict[str, Any]]:
        """Rows keyed by ``topic``/``entity`` (the last op's row wins unless ``op`` is given)."""
        return {r[key]: r for r in self if key in r and (op is None or r["op"] == op)}


def _parse(cmd: list[str], rc: int, stdout: str, stderr: str, wall_s: float) -> ProbeResults:
    if rc != 0:
        raise AdminProbeError(
            f"AdminProbe exited {rc}: {' '.join(cmd[-40:])}\nstdout:\n{stdout}\nstderr:\n{stderr[-6000:]}"
        )
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise AdminProbeError(f"non-JSON line from AdminProbe: {line!r}\nstderr:\n{stderr[-4000:]}") from e
    return ProbeResults(rows, stderr, wall_s, cmd)


def admin_probe(
    target: KafkaCluster | str,
    *args: str | Sequence[str],
    client: Client = "new",
    props: Mapping[str, Any] | None = None,
    user: str | None = None,
    mechanism: str = "SCRAM-SHA-512",
    retries: int | None = None,
    api_timeout_ms: int | None = None,
    retry_backoff_ms: int | None = None,
    request_timeout_ms: int | None = None,
    client_id: str | None = None,
    log_requests: bool = False,
    timeout: float = 180,
) -> ProbeResults:
    """Run the probe to completion and return its rows (one dict per topic/entity result).

    ``target``: a ``KafkaCluster`` (PLAINTEXT bootstrap, or SASL with ``user=``) or a bootstrap
    string (e.g. a proxy's).  ``args``: ops from ``create()``/``delete()``/... or raw CLI args.
    ``props``: extra client properties, Java or librdkafka style (``cluster.client_config(u)``).
    ``log_requests``: log every request the client sends (see ``ProbeResults.requests``).
    Raises ``AdminProbeError`` (with stderr) if the JVM fails or times out.
    """
    return admin_probe_popen(
        target, *args, client=client, props=props, user=user, mechanism=mechanism, retries=retries,
        api_timeout_ms=api_timeout_ms, retry_backoff_ms=retry_backoff_ms, request_timeout_ms=request_timeout_ms,
        client_id=client_id, log_requests=log_requests,
    ).result(timeout)  # fmt: skip


def admin_probe_popen(
    target: KafkaCluster | str,
    *args: str | Sequence[str],
    client: Client = "new",
    props: Mapping[str, Any] | None = None,
    user: str | None = None,
    mechanism: str = "SCRAM-SHA-512",
    retries: int | None = None,
    api_timeout_ms: int | None = None,
    retry_backoff_ms: int | None = None,
    request_timeout_ms: int | None = None,
    client_id: str | None = None,
    log_requests: bool = False,
) -> BackgroundProbe:
    """Start the probe in the background (same arguments as ``admin_probe``); see ``BackgroundProbe``."""
    dist = target.dist if isinstance(target, KafkaCluster) else None
    argv = probe_args(
        target, *args, props=props, user=user, mechanism=mechanism, retries=retries, api_timeout_ms=api_timeout_ms,
        retry_backoff_ms=retry_backoff_ms, request_timeout_ms=request_timeout_ms, client_id=client_id,
    )  # fmt: skip
    runtime = probe_runtime(client, dist=dist)
    dump = runtime.cds_dump()  # the first run of each compiled probe writes its AppCDS archive
    return BackgroundProbe(runtime.command(argv, log_requests=log_requests, cds_dump=dump), cds_dump=dump)


class BackgroundProbe:
    """A running probe JVM (own process group; killed if this process dies when started from the main thread).

    ``rows`` fills up as JSON lines arrive (each with ``recv_s``: seconds since ``started``, our clock);
    ``result(timeout)`` waits and returns ``ProbeResults``; ``kill()`` stops it.
    """

    def __init__(self, cmd: list[str], *, cds_dump: CdsDump | None = None) -> None:
        self.cmd = cmd
        self._cds_dump = cds_dump
        popen_cmd = cmd
        if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
            popen_cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            popen_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.rows: list[dict[str, Any]] = []
        self._out: list[str] = []
        self._err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, sink: list[str], parse: bool) -> None:
        for line in stream:
            sink.append(line)
            if parse and line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                row["recv_s"] = round(time.monotonic() - self.started, 3)
                self.rows.append(row)
        stream.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def result(self, timeout: float = 180) -> ProbeResults:
        """Wait for exit; kill and raise ``AdminProbeError`` after ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            for t in self._threads:
                t.join(5)
            raise AdminProbeError(
                f"AdminProbe timed out after {timeout}s\nstdout:\n{''.join(self._out)}\n"
                f"stderr:\n{''.join(self._err)[-6000:]}"
            ) from None
        for t in self._threads:
            t.join(10)
        self._settle_cds(self.proc.returncode == 0)
        wall = time.monotonic() - self.started
        res = _parse(self.cmd, self.proc.returncode, "".join(self._out), "".join(self._err), wall)
        for row, live in zip(res, self.rows, strict=False):
            row["recv_s"] = live.get("recv_s")
        return res

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()
        self._settle_cds(False)

    def _settle_cds(self, ok: bool) -> None:
        dump, self._cds_dump = self._cds_dump, None
        if dump is not None:
            dump.commit(ok)

    def __enter__(self) -> BackgroundProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


if __name__ == "__main__":
    for c in ("new", "old"):
        rt = probe_runtime(c)  # type: ignore[arg-type]
        print(f"{c}: {rt.clients_jar.name} -> {rt.probe_jar}")
