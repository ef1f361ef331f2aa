"""Run unmodified Java ``KafkaShareConsumer`` members (KIP-932 share groups) and get what they received.

Why Java: Kafka's own client is the reference implementation of share groups (ShareGroupHeartbeat,
ShareFetch, ShareAcknowledge); librdkafka and kafka-python do not speak them. ``java/ShareProbe.java``
is compiled (``txn_probe.compile_app``) against the broker release's jars (``ensure_kafka()``),
cached by source + jars, and run with the broker's ``libs/`` on the classpath. See the Java file for
its arguments and the JSON lines it prints.

Usage::

    from tests.harness.share_probe import share_probe
    res = share_probe(proxy.bootstrap, topic="t", group="g", members=2, expect=300)
    res.records    # [{"member": 0, "partition": 1, "offset": 7, "delivery": 1, "bytes": 1000, "t_ms": 812}, ...]
    res.offsets    # {0: {"start": 0, "lag": 0, "end": 100}, ...}  lag: records not yet acknowledged
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kafka_dist import KafkaDist, ensure_kafka
from .txn_probe import JavaApp, compile_app

SOURCE = Path(__file__).with_name("java") / "ShareProbe.java"


class ShareProbeError(RuntimeError):
    """The probe JVM failed to compile, crashed, timed out or printed something that is not JSON."""


@dataclass
class ShareProbeResult:
    rows: list[dict[str, Any]]
    stderr: str
    wall_s: float
    records: list[dict[str, Any]] = field(init=False)
    acks: list[dict[str, Any]] = field(init=False)
    metrics: dict[str, float | None] = field(init=False)
    offsets: dict[int, dict[str, int | None]] = field(init=False)
    done: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.records = [r for r in self.rows if "offset" in r and "partition" in r]
        self.acks = [r for r in self.rows if "ack_partition" in r]
        self.metrics = {r["metric"]: r["value"] for r in self.rows if "metric" in r}
        offsets: dict[str, dict[str, int | None]] = next((r["offsets"] for r in self.rows if "offsets" in r), {})
        self.offsets = {int(p): v for p, v in offsets.items()}
        self.done = next((r for r in self.rows if r.get("done")), {})

    def failures(self) -> list[str]:
        return [r["failure"] for r in self.rows if "failure" in r]


def compile_probe(dist: KafkaDist | None = None) -> JavaApp:
    """``ShareProbe`` compiled against the release's jars (cached by source and jars; ``txn_probe.compile_app``)."""
    return compile_app("ShareProbe", [SOURCE], [(dist or ensure_kafka()).libs_dir], cache_name="share-probe")


def share_probe_popen(
    bootstrap: str,
    *,
    topic: str,
    group: str,
    members: int = 1,
    expect: int | None = None,
    timeout_ms: int = 60_000,
    client_id: str = "share-probe",
    ack: str = "explicit",
    props: Mapping[str, Any] | None = None,
    dist: KafkaDist | None = None,
) -> subprocess.Popen[str]:
    """Start the probe (own process group) and return the process; ``share_probe_result`` collects it."""
    app = compile_probe(dist)
    args = [
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--members",
        str(members),
        "--timeout-ms",
        str(timeout_ms),
        "--client-id",
        client_id,
        "--ack",
        ack,
    ]
    if expect is not None:
        args += ["--expect", str(expect)]
    for k, v in (props or {}).items():
        args += ["--property", f"{k}={v}"]
    return subprocess.Popen(
        app.command(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def share_probe_result(proc: subprocess.Popen[str], started: float, timeout: float) -> ShareProbeResult:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise ShareProbeError(
            f"ShareProbe timed out after {timeout}s\nstdout tail:\n{out[-3000:]}\nstderr:\n{err[-6000:]}"
        ) from None
    if proc.returncode != 0:
        raise ShareProbeError(
            f"ShareProbe exited {proc.returncode}\nstdout tail:\n{out[-3000:]}\nstderr:\n{err[-6000:]}"
        )
    rows = []
    for line in out.splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ShareProbeError(f"non-JSON line from ShareProbe: {line!r}\nstderr:\n{err[-4000:]}") from e
    return ShareProbeResult(rows, err, time.monotonic() - started)


def share_probe(bootstrap: str, *, timeout: float = 180, **kw: Any) -> ShareProbeResult:
    """Run the probe to completion (keyword arguments as ``share_probe_popen``)."""
    started = time.monotonic()
    return share_probe_result(share_probe_popen(bootstrap, **kw), started, timeout)
