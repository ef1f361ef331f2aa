"""Run a Kafka Streams application (``java/StreamsApp.java``: word count, exactly-once v2) for tests.

Why our own app and not ``kafka-streams-examples``' WordCountDemo: that artifact is not published for the
4.x releases on Maven Central. StreamsApp has the demo's topology (split, groupBy word, count, to) and
settings that make its committed output a pure function of the input (see the Java file's header), so two
runs, or a run killed and restarted, can be compared record for record.

The runtime (kafka-streams of the broker's release, with rocksdbjni, kafka-clients and a log4j2 binding) is
fetched from Maven Central once with ``pom-streams.xml`` into ``<cache>/kafka-streams-<version>/libs``
(``kafka_dist.maven_libs``, the harness's one Maven fetcher); the app is compiled by ``txn_probe.compile_app``.

Usage::

    from tests.harness import streams_app as sa
    run = sa.start(proxy.bootstrap, application_id="wc-1", input="lines", output="counts", state_dir=tmp / "s1")
    ...  # wait for the group's committed offsets to reach the input's end
    run.stop()           # clean close (commits), exit 0
    run.kill()           # SIGKILL: the crash case
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .admin_probe import BackgroundProbe, ProbeResults
from .kafka_dist import DEFAULT_KAFKA_VERSION, cache_root, maven_libs
from .txn_probe import JAVA_DIR, JavaApp, compile_app

POM = Path(__file__).with_name("pom-streams.xml")


def streams_libs(version: str = DEFAULT_KAFKA_VERSION, *, timeout: float = 900, mvn: str = "mvn") -> Path:
    """The Kafka Streams runtime jars of ``version`` (fetched with Maven on first use)."""
    return maven_libs(
        cache_root() / f"kafka-streams-{version}",
        POM,
        what=f"kafka-streams {version}",
        expect="kafka-streams-*.jar",
        key=version,
        define={"kafka.version": version},
        timeout=timeout,
        mvn=mvn,
    )


def streams_app(version: str = DEFAULT_KAFKA_VERSION) -> JavaApp:
    return compile_app("StreamsApp", [JAVA_DIR / "StreamsApp.java"], [streams_libs(version)], cache_name="streams-app")


class StreamsRun:
    """One Streams JVM: ``rows`` are its JSON lines as they arrive; ``stop()`` closes it cleanly, ``kill()``
    crashes it."""

    def __init__(self, probe: BackgroundProbe, stop_file: Path) -> None:
        self.probe = probe
        self.stop_file = stop_file

    @property
    def pid(self) -> int:
        return self.probe.pid

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.probe.rows

    def states(self) -> list[str]:
        return [r["state"] for r in self.probe.rows if "state" in r]

    def stop(self, timeout: float = 90) -> ProbeResults:
        """Close cleanly (the last transaction is committed) and return what it printed."""
        self.stop_file.touch()
        return self.probe.result(timeout)

    def kill(self) -> None:
        self.probe.kill()


def start(
    bootstrap: str,
    *,
    application_id: str,
    input: str,
    output: str,
    state_dir: Path,
    record_delay_ms: int = 0,
    count_delay_ms: int = 0,
    props: Mapping[str, Any] | None = None,
    write_cds: bool = True,
) -> StreamsRun:
    """Start StreamsApp in the background (see the Java file for what it does)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    stop_file = state_dir.with_name(f"{state_dir.name}.stop")
    stop_file.unlink(missing_ok=True)
    args = [
        "--bootstrap",
        bootstrap,
        "--application-id",
        application_id,
        "--input",
        input,
        "--output",
        output,
        "--state-dir",
        str(state_dir),
        "--stop-file",
        str(stop_file),
        "--record-delay-ms",
        str(record_delay_ms),
        "--count-delay-ms",
        str(count_delay_ms),
    ]
    for k, v in (props or {}).items():
        args += ["--property", f"{k}={v}"]
    return StreamsRun(streams_app().start(args, write_cds=write_cds), stop_file)
