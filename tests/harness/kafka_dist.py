"""Fetch an Apache Kafka runtime (broker + CLI tools) from Maven Central.

Why Maven: the test machines reach package registries only, so the usual
``kafka_2.13-X.tgz`` from downloads.apache.org is unavailable.  The same jars are
on Maven Central; ``pom.xml`` next to this file lists them and
``mvn dependency:copy-dependencies`` copies the resolved runtime classpath into a
cache directory that is reused across runs (a marker file records completion).

Versions (checked against Central):
  * 4.4.0 (default): broker jars are published, but ``kafka-tools`` 4.4.0 is
    not.  So the broker side (``kafka.Kafka``, ``StorageTool``) runs from a
    4.4.0 classpath and the CLI tools from a separate, complete 4.3.1 classpath
    (``TOOLS_VERSION_FALLBACK``).  Mixing both on one classpath fails:
    tools 4.3.1 need ``org.apache.kafka.common.utils.Exit``, gone in 4.4.0
    clients.  4.4.0 also moved ConfigCommand out of ``kafka_2.13``.
  * 4.3.1: complete; ``ensure_kafka("4.3.1")`` uses one classpath for everything.

Main classes: Kafka 4.x moved most Scala tools (``kafka.tools.*``,
``kafka.admin.TopicCommand``) to ``org.apache.kafka.tools``; ConfigCommand stayed
``kafka.admin.ConfigCommand`` up to 4.3.  ``KafkaDist.main_class()`` picks the
name present in the jars; ``MAIN`` holds the names used by the default version.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_KAFKA_VERSION = "4.4.0"
#: Kafka versions whose kafka-tools artifact is missing on Central -> tools release to use.
TOOLS_VERSION_FALLBACK: dict[str, str] = {"4.4.0": "4.3.1"}
POM = Path(__file__).with_name("pom.xml")

#: Short name -> candidate main classes, newest layout first.
MAIN_CANDIDATES: dict[str, tuple[str, ...]] = {
    "broker": ("kafka.Kafka",),
    "storage": ("kafka.tools.StorageTool",),
    "console_producer": ("org.apache.kafka.tools.ConsoleProducer", "kafka.tools.ConsoleProducer"),
    "console_consumer": ("org.apache.kafka.tools.consumer.ConsoleConsumer", "kafka.tools.ConsoleConsumer"),
    "producer_perf": ("org.apache.kafka.tools.ProducerPerformance",),
    "consumer_perf": ("org.apache.kafka.tools.ConsumerPerformance", "kafka.tools.ConsumerPerformance"),
    "topics": ("org.apache.kafka.tools.TopicCommand", "kafka.admin.TopicCommand"),
    "configs": ("org.apache.kafka.tools.ConfigCommand", "kafka.admin.ConfigCommand"),
}
#: Resolved names for the default version (4.4.0 broker + 4.3.1 tools).
MAIN: dict[str, str] = {
    "broker": "kafka.Kafka",
    "storage": "kafka.tools.StorageTool",
    "console_producer": "org.apache.kafka.tools.ConsoleProducer",
    "console_consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "producer_perf": "org.apache.kafka.tools.ProducerPerformance",
    "consumer_perf": "org.apache.kafka.tools.ConsumerPerformance",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "configs": "kafka.admin.ConfigCommand",
}
#: Main classes that run on the broker classpath; everything else uses the tools one.
BROKER_SIDE = frozenset({"kafka.Kafka", "kafka.tools.StorageTool"})


def cache_root() -> Path:
    """``$KTP_CACHE`` or ``~/.cache/kafka-throttle-proxy``."""
    env = os.environ.get("KTP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kafka-throttle-proxy"


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise RuntimeError("java not found (set JAVA_HOME or put java on PATH)")
    return found


@functools.cache
def _classes_in(libs_dir: Path) -> frozenset[str]:
    """Class names in the Kafka jars of a libs dir (to pick main class names)."""
    names: set[str] = set()
    for jar in libs_dir.glob("kafka*.jar"):
        with zipfile.ZipFile(jar) as z:
            names.update(n[:-6].replace("/", ".") for n in z.namelist() if n.endswith(".class") and "$" not in n)
    return frozenset(names)


@functools.cache
def _jdk_key(java_bin: str) -> str:
    """Identifies the JDK build (CDS archives only work with the JVM that wrote them)."""
    real = Path(os.path.realpath(java_bin))
    parts = []
    for f in (real, real.parent.parent / "lib" / "server" / "libjvm.so"):
        with contextlib.suppress(OSError):
            st = f.stat()
            parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def cds_enabled() -> bool:
    """AppCDS archives on unless ``KTP_CDS=0``."""
    return os.environ.get("KTP_CDS", "1") != "0"


@dataclass(frozen=True)
class CdsDump:
    """A pending AppCDS archive: the JVM writes ``tmp`` at exit; ``commit`` moves it to ``final``.

    Why: class-data sharing cuts JVM start time by about a third (3-node cluster
    start ~16.5 s -> ~11.5 s, a CLI tool ~2.5 s -> ~1.5 s on 2 cores).  JDK 17 has
    no -XX:+AutoCreateSharedArchive, so the first run of each classpath dumps one.
    """

    tmp: Path
    final: Path

    def commit(self, ok: bool) -> None:
        """Keep the archive if the JVM exited normally (a killed JVM may leave half a file)."""
        try:
            if ok and self.tmp.exists() and self.tmp.stat().st_size > 0 and not self.final.exists():
                os.replace(self.tmp, self.final)
        finally:
            self.tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class KafkaDist:
    """A resolved Kafka runtime: jar directories and a way to run them.

    ``libs_dir`` runs the broker and StorageTool; ``tools_libs_dir`` the CLI
    tools (the same directory unless the tools come from another release).
    """

    version: str
    tools_version: str
    libs_dir: Path
    tools_libs_dir: Path
    java_bin: str = field(default_factory=java_executable)

    @property
    def classpath(self) -> str:
        # A JVM classpath wildcard keeps command lines short (the JVM expands it).
        return str(self.libs_dir / "*")

    @property
    def tools_classpath(self) -> str:
        return str(self.tools_libs_dir / "*")

    @property
    def jars(self) -> list[Path]:
        return sorted(self.libs_dir.glob("*.jar"))

    def main_class(self, name: str) -> str:
        """Resolve a ``MAIN_CANDIDATES`` key (or pass a class name through)."""
        if name not in MAIN_CANDIDATES:
            return name
        cands = MAIN_CANDIDATES[name]
        libs = self.libs_dir if cands[0] in BROKER_SIDE else self.tools_libs_dir
        present = _classes_in(libs)
        return next((c for c in cands if c in present), cands[0])

    def cds_archive(self, main_class: str) -> Path:
        """Where the AppCDS archive for ``main_class``'s classpath lives (one per classpath and JDK)."""
        broker = self.main_class(main_class) in BROKER_SIDE
        base = (self.libs_dir if broker else self.tools_libs_dir).parent / "cds"
        return base / f"{'broker' if broker else 'tools'}-{_jdk_key(self.java_bin)}.jsa"

    def cds_dump(self, main_class: str) -> CdsDump | None:
        """A ``CdsDump`` to pass to ``java()`` if no archive exists yet for this classpath."""
        final = self.cds_archive(main_class)
        if not cds_enabled() or final.exists():
            return None
        final.parent.mkdir(parents=True, exist_ok=True)
        return CdsDump(final.with_name(f"{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"), final)

    def java(
        self,
        main_class: str,
        *args: str,
        jvm_opts: Sequence[str] = ("-Xmx512m",),
        sys_props: Mapping[str, str] | None = None,
        cds_dump: CdsDump | None = None,
    ) -> list[str]:
        """Command line running ``main_class`` (or a ``MAIN`` key) on the right classpath.

        Uses the classpath's AppCDS archive when present, or writes one at JVM exit
        when ``cds_dump`` is given.  JVM warnings go to stderr, never stdout.
        """
        main_class = self.main_class(main_class)
        cp = self.classpath if main_class in BROKER_SIDE else self.tools_classpath
        cds: list[str] = []
        if cds_dump is not None:
            cds = [f"-XX:ArchiveClassesAtExit={cds_dump.tmp}"]
        elif cds_enabled() and (archive := self.cds_archive(main_class)).exists():
            cds = [f"-XX:SharedArchiveFile={archive}"]
        props = [f"-D{k}={v}" for k, v in (sys_props or {}).items()]
        return [
            self.java_bin, "-Xlog:disable", "-Xlog:all=warning:stderr", *jvm_opts, *cds, "-Djava.awt.headless=true",
            *props, "-cp", cp, main_class, *map(str, args),
        ]  # fmt: skip


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Inter-process lock so parallel test workers don't run mvn concurrently."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def maven_libs(
    base: Path,
    pom: Path,
    *,
    what: str,
    expect: str,
    key: str = "",
    define: Mapping[str, str] | None = None,
    flags: Sequence[str] = (),
    pom_text: str | None = None,
    timeout: float = 900,
    mvn: str = "mvn",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The runtime jars ``pom`` resolves, copied by ``mvn dependency:copy-dependencies`` into ``base/libs`` once.

    The one Maven fetcher of the harness (Kafka's broker and tools, the old kafka-clients, Kafka Streams).
    ``what`` names the download in messages; ``expect`` is a glob that must match a jar of a complete copy;
    ``define`` are ``-Dk=v`` properties and ``flags`` further arguments of mvn; ``pom_text``, when given, is
    written to ``pom`` first. The marker stores a hash of the pom and ``key`` (the caller's options), so
    editing the pom invalidates the cache. Jars go to a temp dir that is renamed into place, so an interrupted
    run never leaves a half-filled ``libs`` dir behind; an inter-process lock keeps parallel test workers from
    running mvn at once. ``progress`` is told (once) when a download starts: only then is there a wait worth
    explaining to a person.
    """
    libs, marker = base / "libs", base / ".complete"
    stamp = hashlib.sha256((pom.read_bytes() if pom_text is None else pom_text.encode()) + key.encode()).hexdigest()

    def ready() -> bool:
        return marker.exists() and marker.read_text().strip() == stamp and any(libs.glob(expect))

    if ready():
        return libs
    with _locked(base.with_name(base.name + ".lock")):
        if ready():
            return libs
        base.mkdir(parents=True, exist_ok=True)
        if pom_text is not None:
            pom.write_text(pom_text)
        tmp = Path(tempfile.mkdtemp(prefix="libs.", dir=base))
        cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
               *(f"-D{k}={v}" for k, v in (define or {}).items()), f"-DoutputDirectory={tmp}", *flags]  # fmt: skip
        if progress is not None:
            progress(f"fetching {what}'s jars from Maven Central into {base} (once)")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"mvn failed ({proc.returncode}) fetching {what}:\n{(proc.stdout + proc.stderr)[-4000:]}"
                )
            shutil.rmtree(libs, ignore_errors=True)
            shutil.rmtree(base / "cds", ignore_errors=True)  # AppCDS archives are tied to the jars
            tmp.rename(libs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        marker.write_text(stamp + "\n")
        (base / "fetch-seconds").write_text(f"{time.monotonic() - t0:.1f}\n")
    return libs


def _fetch(
    version: str, *, broker_only: bool, timeout: float, mvn: str, progress: Callable[[str], None] | None = None
) -> Path:
    """The runtime jars of one Kafka release (``pom.xml``; ``broker_only`` leaves out kafka-tools)."""
    return maven_libs(
        cache_root() / (f"kafka-{version}-broker" if broker_only else f"kafka-{version}"),
        POM,
        what=f"Apache Kafka {version}",
        expect="kafka_2.13-*.jar",
        key=f"{version}/{broker_only}",
        define={"kafka.version": version},
        flags=["-Dbroker-only"] if broker_only else [],
        timeout=timeout,
        mvn=mvn,
        progress=progress,
    )


def javac_jar(sources: Sequence[Path], classpath: str, jar: Path, *, what: str, java_bin: str) -> Path:
    """Compile ``sources`` against ``classpath`` into ``jar`` unless it exists (the harness's one javac step).

    A jar, not a classes dir: AppCDS rejects non-empty directories on the classpath. Classes are compiled into
    a temp dir beside ``jar`` under an inter-process lock and the jar is renamed into place, so a reader never
    sees half of one. ``what`` names the program in the error."""
    if jar.exists():
        return jar
    base = jar.parent
    with _locked(base.with_name(base.name + ".lock")):
        if jar.exists():
            return jar
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="classes.", dir=base))
        javac = shutil.which("javac") or str(Path(java_bin).with_name("javac"))
        cmd = [javac, "-nowarn", "-encoding", "UTF-8", "-d", str(tmp), "-cp", classpath, *map(str, sources)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            if proc.returncode != 0:
                raise RuntimeError(f"javac failed for {what}:\n{proc.stdout}{proc.stderr}")
            part = base / f"{jar.name}.part"
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(tmp.rglob("*.class")):
                    z.write(f, f.relative_to(tmp).as_posix())
            os.replace(part, jar)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return jar


def ensure_kafka(
    version: str = DEFAULT_KAFKA_VERSION,
    *,
    tools_version: str | None = None,
    timeout: float = 900,
    mvn: str = "mvn",
    tools_only: bool = False,
    progress: Callable[[str], None] | None = None,
) -> KafkaDist:
    """Return a cached Kafka runtime, downloading it with Maven on first use.

    ``tools_version`` defaults to ``version`` (or ``TOOLS_VERSION_FALLBACK``);
    when it differs, the broker and the tools get separate classpaths.
    ``tools_only``: just the CLI tools' classpath (``scripts/kafka-tool`` needs no
    broker, so it does not download one); ``progress``: see ``_fetch``.
    """
    tools_version = tools_version or TOOLS_VERSION_FALLBACK.get(version, version)
    if tools_only:
        version = tools_version  # the one release on the classpath
    fetch = functools.partial(_fetch, timeout=timeout, mvn=mvn, progress=progress)
    if tools_version == version:
        libs = tools_libs = fetch(tools_version, broker_only=False)
    else:
        libs = fetch(version, broker_only=True)
        tools_libs = fetch(tools_version, broker_only=False)
    return KafkaDist(version=version, tools_version=tools_version, libs_dir=libs, tools_libs_dir=tools_libs)


if __name__ == "__main__":
    import sys

    t = time.monotonic()
    d = ensure_kafka(*sys.argv[1:2])
    print(f"Kafka {d.version} (tools {d.tools_version}) in {time.monotonic() - t:.1f}s")
    print(f"  broker libs: {d.libs_dir}\n  tools libs:  {d.tools_libs_dir}")
    for key in MAIN_CANDIDATES:
        print(f"  {key:17} {d.main_class(key)}")
