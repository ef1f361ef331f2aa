"""Fetch an Apache Kafka runtime (broker + CLI tools) from Maven Central.

Why Maven: the test machines reach package registries only, so the usual
``kafka_2.13-X.tgz`` from downloads.apache.org is unavailable.  The same jars are
on Maven Central; ``pom.xml`` next to this file lists them and
``mvn dependency:copy-dependencies`` copies the resolved runtime classpath into a
cache directory that is reused across runs (a marker file records completion).

Version notes (checked against Central):
  * 4.4.0: ``kafka_2.13``/server jars are published but ``kafka-tools`` 4.4.0 is
    not, so ``ensure_kafka("4.4.0")`` pairs it with tools 4.3.1 (see
    ``TOOLS_VERSION_FALLBACK``).
  * 4.3.1: complete; the default.

Main classes (Kafka 4.x; the old ``kafka.tools.*`` / ``kafka.admin.TopicCommand``
Scala tools were moved to ``org.apache.kafka.tools``, except ConfigCommand and
StorageTool which are still Scala in ``kafka_2.13``) are in ``MAIN``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_KAFKA_VERSION = "4.3.1"
# Kafka versions whose kafka-tools artifact is missing on Central -> tools version to use.
TOOLS_VERSION_FALLBACK: dict[str, str] = {"4.4.0": "4.3.1"}
POM = Path(__file__).with_name("pom.xml")

#: Fully-qualified main classes for the Kafka 4.x runtime fetched here.
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


@dataclass(frozen=True)
class KafkaDist:
    """A resolved Kafka runtime: a directory of jars and a way to run them."""

    version: str
    tools_version: str
    libs_dir: Path
    java_bin: str = field(default_factory=java_executable)

    @property
    def classpath(self) -> str:
        # A JVM classpath wildcard keeps command lines short (the JVM expands it).
        return str(self.libs_dir / "*")

    @property
    def jars(self) -> list[Path]:
        return sorted(self.libs_dir.glob("*.jar"))

    def java(
        self,
        main_class: str,
        *args: str,
        jvm_opts: Sequence[str] = ("-Xmx512m",),
        sys_props: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Command line running ``main_class`` (or a ``MAIN`` key) on this classpath."""
        main_class = MAIN.get(main_class, main_class)
        props = [f"-D{k}={v}" for k, v in (sys_props or {}).items()]
        return [
            self.java_bin,
            *jvm_opts,
            "-Djava.awt.headless=true",
            *props,
            "-cp",
            self.classpath,
            main_class,
            *map(str, args),
        ]


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


def ensure_kafka(
    version: str = DEFAULT_KAFKA_VERSION,
    *,
    tools_version: str | None = None,
    timeout: float = 900,
    mvn: str = "mvn",
) -> KafkaDist:
    """Return a cached Kafka runtime, downloading it with Maven on first use.

    The marker stores a hash of the pom and versions, so editing ``pom.xml``
    invalidates the cache.  Download goes to a temp dir that is renamed into
    place, so an interrupted run never leaves a half-filled ``libs`` dir behind.
    """
    tools_version = tools_version or TOOLS_VERSION_FALLBACK.get(version, version)
    base = cache_root() / (f"kafka-{version}" if tools_version == version else f"kafka-{version}-tools-{tools_version}")
    libs, marker = base / "libs", base / ".complete"
    stamp = hashlib.sha256(POM.read_bytes() + f"{version}/{tools_version}".encode()).hexdigest()

    def ready() -> bool:
        return marker.exists() and marker.read_text().strip() == stamp and any(libs.glob("kafka_2.13-*.jar"))

    if not ready():
        with _locked(base.with_name(base.name + ".lock")):
            if not ready():
                base.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix="libs.", dir=base))
                cmd = [
                    mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                    f"-Dkafka.version={version}", f"-Dkafka.tools.version={tools_version}",
                    f"-DoutputDirectory={tmp}",
                ]  # fmt: skip
                t0 = time.monotonic()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                    if proc.returncode != 0:
                        raise RuntimeError(
                            f"mvn failed ({proc.returncode}) fetching Kafka {version}:\n"
                            f"{(proc.stdout + proc.stderr)[-4000:]}"
                        )
                    shutil.rmtree(libs, ignore_errors=True)
                    tmp.rename(libs)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                marker.write_text(stamp + "\n")
                (base / "fetch-seconds").write_text(f"{time.monotonic() - t0:.1f}\n")
    return KafkaDist(version=version, tools_version=tools_version, libs_dir=libs)


if __name__ == "__main__":
    import sys

    t = time.monotonic()
    d = ensure_kafka(*sys.argv[1:2])
    print(f"Kafka {d.version} (tools {d.tools_version}): {len(d.jars)} jars in {d.libs_dir} ({time.monotonic() - t:.1f}s)")
