"""Instructions per sequential Produce round trip of a *live* proxy: real broker, real client, real sockets.

Why: ``bench.instructions`` counts the per-request path in process, with stand-in transports; it leaves out what
uvloop does around it (protocol callbacks, ``get_buffer``, ``writelines``) and it sends Produce v11 from a
producer with an id. Here a 1-broker Apache Kafka (``tests.harness``) runs, the proxy runs under valgrind's
callgrind with instrumentation off, a confluent-kafka (librdkafka) producer warms it up with 200 acks=all round
trips, then ``callgrind_control`` turns counting on around ``--round-trips`` more and dumps. The count is the
proxy's alone (every instruction of its process while counting: the event loop, the kernel-call wrappers, our
code), divided by the round trips; it does not move with the machine's load. Slow: a minute or so per side.

``--java RECORDS`` counts instead one run of Kafka's producer-perf-test at 2,000 records/s (``bench.run``'s
``java-fixed`` workload: 1 KiB records, acks=all, idempotent, its own connection setup included, as there), after
one unmeasured run, and divides by the Produce requests the proxy saw (its ``_on_request`` calls).

    .venv/bin/python -m bench.live_instructions [--round-trips 400 | --java 6000] [--keep DIR]

``--keep DIR`` keeps each side's callgrind file (``callgrind_annotate --inclusive=yes DIR/<side>.cg.1``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.instructions import print_table
from tests.harness import KafkaCluster

REPO = Path(__file__).resolve().parent.parent
HUGE = {
    "producer_byte_rate": 10**15,
    "consumer_byte_rate": 10**15,
    "request_percentage": 10**6,
    "controller_mutation_rate": 10**9,
}
SIDES = {
    "no quota": None,
    "every quota, none binding": {
        "enforcement": "kafka",  # as bench/instructions-baseline.json was measured (smooth is the default since 37)
        "entities": [
            {"entity": {"user": "<default>"}, "quotas": {**HUGE, "producer_ids_rate": 10**9}},
            {"entity": {"client-id": "<default>"}, "quotas": HUGE},
        ],
    },
}
WARM_UP = 200


def _librdkafka(round_trips: int) -> Callable[[str, bool], None]:
    """Sequential acks=all round trips from one confluent-kafka producer (no producer id: librdkafka's default)."""
    from confluent_kafka import Producer

    producers: list = []
    value = os.urandom(1024)

    def load(bootstrap: str, measured: bool) -> None:
        if not producers:
            producers.append(
                Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "socket.nagle.disable": True})
            )
        for _ in range(round_trips if measured else WARM_UP):
            producers[0].produce("t", value, partition=0)
            if producers[0].flush(30) != 0:
                raise SystemExit("a record was not delivered within 30 s")
        if measured:
            producers.clear()  # before the proxy goes: librdkafka would keep reconnecting to it (and saying so)
            gc.collect()

    return load


def _java(cluster: KafkaCluster, records: int) -> Callable[[str, bool], None]:
    """One producer-perf-test run at 2,000 records/s, as ``bench.run``'s java-fixed workload."""

    def load(bootstrap: str, measured: bool) -> None:
        cmd = cluster.tool_cmd(
            "producer_perf",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            "t",
            "--num-records",
            str(records if measured else 2000),
            "--record-size",
            "1024",
            "--throughput",
            "2000",
            "--command-property",
            "acks=all",
            jvm_opts=("-Xmx512m",),
        )
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)

    return load


def _count(
    cluster: KafkaCluster, workdir: Path, name: str, quotas: dict | None, load: Callable[[str, bool], None]
) -> tuple[int, int]:
    """The proxy's instructions over the measured load, and the requests it handled meanwhile."""
    doc: dict = {
        "upstream": {"bootstrap_servers": cluster.bootstrap},
        "log_level": "INFO",
        "listen": {"host": "127.0.0.1", "bootstrap_port": 0, "broker_ports": "ephemeral"},
    }
    if quotas:
        doc["quotas"] = quotas
    config = workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump(doc))
    out = workdir / f"{name}.cg"
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "proxy.cli",
                "run",
                "-c",
                str(config),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0"},
        )
    try:
        assert proc.stdout is not None
        m = re.search(r"bootstrap\.servers=(\S+)", proc.stdout.readline().decode())
        if m is None:
            raise SystemExit(f"proxy under valgrind did not start; see {workdir / name}.log")
        load(m.group(1), False)
        control = ["callgrind_control"]
        subprocess.run([*control, "-i", "on", str(proc.pid)], check=True, capture_output=True)
        load(m.group(1), True)
        subprocess.run([*control, "-i", "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run([*control, "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(60)
    text = subprocess.run(
        ["callgrind_annotate", "--auto=no", f"{out}.1"], check=True, capture_output=True, text=True
    ).stdout
    m = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text)
    if m is None:
        raise SystemExit(f"no total in {out}.1")
    return int(m.group(1).replace(",", "")), _calls(Path(f"{out}.1"), "Connection____on_request")


def _calls(path: Path, function: str) -> int:
    """How often the counted run called the compiled function whose name ends with ``function`` (the sum of the
    ``calls=`` lines under each ``cfn=`` naming it; callgrind names a function once, then by its number)."""
    names: dict[str, str] = {}
    total, target = 0, False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("fn=", "cfn=")):
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                target = line.startswith("cfn=") and names.get(m.group(1), "").endswith(function)
        elif target and line.startswith("calls="):
            total += int(line[6:].split()[0])
            target = False
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=400)
    ap.add_argument(
        "--java",
        type=int,
        metavar="RECORDS",
        help="count a producer-perf-test run of RECORDS records at 2,000/s instead (per request)",
    )
    ap.add_argument("--keep", help="directory to keep the callgrind files in")
    ap.add_argument("--json", metavar="FILE", help="also write the per-request counts, by side, as JSON")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ktp-live-cg-"))
    results = {}
    try:
        with KafkaCluster(1, workdir=workdir / "kafka") as cluster:
            cluster.tool(
                "topics",
                "--bootstrap-server",
                cluster.bootstrap,
                "--create",
                "--topic",
                "t",
                "--partitions",
                "1",
                "--replication-factor",
                "1",
                check=True,
            )
            load = _java(cluster, args.java) if args.java else _librdkafka(args.round_trips)
            for i, (side, quotas) in enumerate(SIDES.items()):
                instructions, requests = _count(cluster, workdir, f"side{i}", quotas, load)
                print(f"{side}: {instructions:,} instructions, {requests:,} requests", flush=True)
                results[side] = instructions / (requests if args.java else args.round_trips)
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for f in workdir.glob("side*.cg.1"):
                shutil.copy(f, Path(args.keep) / f.name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(
        results,
        "instructions per request, Java producer at 2,000 records/s"
        if args.java
        else "instructions per live Produce round trip",
    )
    if args.json:
        Path(args.json).write_text(json.dumps({side: round(n) for side, n in results.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
