"""Run Kafka's Java transactional producer and read_committed consumer (``java/TxnProbe.java``).

Why Java: the transactional read-process-write loop (``sendOffsetsToTransaction`` with the consumer's group
metadata, aborts, ``read_committed``) is what Kafka's own clients and Kafka Streams do; it exercises
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn and the transaction markers the
way production code does. The probe is compiled with ``javac`` against the broker release's kafka-clients
(the ``libs_dir`` of ``ensure_kafka()``, as AdminProbe's "new" client), once per source/jar hash, into the
harness cache; it runs with an AppCDS archive after the first run (JVM start dominates on 2 cores).

``JavaApp``/``compile_app`` are shared with ``streams_app.py``.

Usage::

    from tests.harness import txn_probe as tp
    probe = tp.process_popen(proxy.bootstrap, input="in", output="out", group="g", transactional_id="tx",
                             expect=500, abort_every=4)
    rows = tp.result(probe)
    rows.done  # {"done": True, "committed": 500, "aborted": ..., "produce_throttle_time_max": ...}
    records = tp.consume(proxy.bootstrap, "out")  # read_committed; [{"p", "o", "k", "v"}, ...]
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .admin_probe import AdminProbeError, BackgroundProbe, ProbeResults
from .cluster import _LOG4J_TOOLS
from .kafka_dist import CdsDump, _jdk_key, cache_root, cds_enabled, ensure_kafka, java_executable, javac_jar

JAVA_DIR = Path(__file__).with_name("java")
JVM_OPTS: tuple[str, ...] = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


@dataclass(frozen=True)
class JavaApp:
    """A compiled Java program (``jar``) and the jar directories it runs with."""

    main: str
    jar: Path
    libs: tuple[Path, ...]
    jvm_opts: tuple[str, ...] = JVM_OPTS
    java_bin: str = field(default_factory=java_executable)

    @property
    def cds_archive(self) -> Path:
        return self.jar.parent / f"{self.main}-{_jdk_key(self.java_bin)}.jsa"

    def cds_dump(self) -> CdsDump | None:
        """An archive to write at the next JVM's exit, if none exists yet (``KTP_CDS=0`` disables)."""
        final = self.cds_archive
        if not cds_enabled() or final.exists():
            return None
        return CdsDump(final.with_name(f"{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"), final)

    def command(
        self, args: Sequence[str], *, cds_dump: CdsDump | None = None, sys_props: Mapping[str, str] | None = None
    ) -> list[str]:
        cds: list[str] = []
        if cds_dump is not None:
            cds = [f"-XX:ArchiveClassesAtExit={cds_dump.tmp}"]
        elif cds_enabled() and self.cds_archive.exists():
            cds = [f"-XX:SharedArchiveFile={self.cds_archive}"]
        log4j = self.jar.with_name("log4j2.properties")
        if not log4j.exists():
            log4j.write_text(_LOG4J_TOOLS)
        props = {"log4j2.configurationFile": str(log4j), **(sys_props or {})}
        cp = os.pathsep.join([str(self.jar), *(str(d / "*") for d in self.libs)])
        return [
            self.java_bin, "-Xlog:disable", "-Xlog:all=warning:stderr", *self.jvm_opts, *cds,
            "-Djava.awt.headless=true", *(f"-D{k}={v}" for k, v in props.items()), "-cp", cp, self.main, *args,
        ]  # fmt: skip

    def start(self, args: Sequence[str], *, write_cds: bool = True) -> BackgroundProbe:
        """Start the program in its own process group; ``BackgroundProbe`` collects its JSON lines.
        ``write_cds=False`` for a run that will be killed (an archive is only kept from a clean exit)."""
        dump = self.cds_dump() if write_cds else None
        return BackgroundProbe(self.command(args, cds_dump=dump), cds_dump=dump)


def compile_app(main: str, sources: Iterable[Path], libs: Sequence[Path], *, cache_name: str) -> JavaApp:
    """Compile ``sources`` against the jars in ``libs`` into a cached jar (rebuilt when a source or jar changes)."""
    sources = list(sources)
    jars = sorted(j for d in libs for j in d.glob("*.jar"))
    h = hashlib.sha256()
    for src in sources:
        h.update(src.read_bytes())
    for j in jars:
        h.update(f"{j.name}:{j.stat().st_size}".encode())
    base = cache_root() / cache_name / h.hexdigest()[:16]
    jar = base / f"{main}.jar"
    app = JavaApp(main, jar, tuple(libs))
    javac_jar(sources, os.pathsep.join(str(d / "*") for d in libs), jar, what=main, java_bin=app.java_bin)
    return app


def txn_app() -> JavaApp:
    """TxnProbe compiled against the broker release's kafka-clients."""
    return compile_app("TxnProbe", [JAVA_DIR / "TxnProbe.java"], [ensure_kafka().libs_dir], cache_name="txn-probe")


class TxnResults(ProbeResults):
    """The probe's JSON rows; ``done`` is its closing summary line."""

    @property
    def done(self) -> dict[str, Any]:
        rows = [r for r in self if r.get("done")]
        if not rows:
            raise AdminProbeError(f"TxnProbe printed no summary\nstderr:\n{self.stderr[-4000:]}")
        return rows[-1]


def _args(mode: str, bootstrap: str, opts: Mapping[str, Any], props: Mapping[str, Any] | None) -> list[str]:
    out = [mode, "--bootstrap", bootstrap]
    for k, v in opts.items():
        if v is not None:
            out += [f"--{k.replace('_', '-')}", str(v)]
    for k, v in (props or {}).items():
        out += ["--property", f"{k}={v}"]
    return out


def process_popen(
    bootstrap: str,
    *,
    input: str,
    output: str,
    group: str,
    transactional_id: str,
    expect: int,
    client_id: str = "txn-rw",
    abort_every: int = 0,
    max_poll_records: int = 100,
    transaction_timeout_ms: int = 30_000,
    timeout_ms: int = 150_000,
    props: Mapping[str, Any] | None = None,
) -> BackgroundProbe:
    """Start the read-process-write loop (see ``TxnProbe.java``) in the background."""
    opts = {
        "input": input,
        "output": output,
        "group": group,
        "transactional_id": transactional_id,
        "expect": expect,
        "client_id": client_id,
        "abort_every": abort_every,
        "max_poll_records": max_poll_records,
        "transaction_timeout_ms": transaction_timeout_ms,
        "timeout_ms": timeout_ms,
    }
    return txn_app().start(_args("process", bootstrap, opts, props))


def result(probe: BackgroundProbe, timeout: float = 180) -> TxnResults:
    res = probe.result(timeout)
    return TxnResults(res, res.stderr, res.wall_s, res.cmd)


def consume_popen(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    client_id: str = "txn-verify",
    timeout_ms: int = 60_000,
    props: Mapping[str, Any] | None = None,
) -> BackgroundProbe:
    """Start reading every record of ``topic`` up to its end offset at ``isolation`` (read_committed: the last
    stable offset); ``result()`` gives ``[{"p", "o", "k", "v"}, ..., {"done": True, "count"}]``."""
    opts = {"topic": topic, "isolation": isolation, "client_id": client_id, "timeout_ms": timeout_ms}
    return txn_app().start(_args("consume", bootstrap, opts, props))


def consume(bootstrap: str, topic: str, **kw: Any) -> TxnResults:
    """``consume_popen`` and wait for its result."""
    return result(consume_popen(bootstrap, topic, **kw), kw.get("timeout_ms", 60_000) / 1000 + 60)
