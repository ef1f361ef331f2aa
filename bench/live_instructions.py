"""Instructions per sequential Produce round trip of a *live* proxy: real broker, real client, real sockets.

Why: ``bench.instructions`` counts the per-request path in process, with stand-in transports; it leaves out what
uvloop does around it (protocol callbacks, ``get_buffer``, ``writelines``) and it sends Produce v11 from a
producer with an id. Here a 1-broker Apache Kafka (``tests.harness``) runs, the proxy runs under valgrind's
callgrind with instrumentation off, a confluent-kafka (librdkafka) producer warms it up with 200 acks=all round
trips, then ``callgrind_control`` turns counting on around ``--round-trips`` more and dumps. The count is the
proxy's alone (every instruction of its process while counting: the event loop, the kernel-call wrappers, our
code), divided by the round trips; it does not move with the machine's load. Slow: a minute or so per side.

    .venv/bin/python -m bench.live_instructions [--round-trips 400] [--keep DIR]

``--keep DIR`` keeps each side's callgrind file (``callgrind_annotate --inclusive=yes DIR/<side>.cg.1``).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.instructions import print_table
from tests.harness import KafkaCluster

REPO = Path(__file__).resolve().parent.parent
HUGE = {"producer_byte_rate": 10**15, "consumer_byte_rate": 10**15, "request_percentage": 10**6,
        "controller_mutation_rate": 10**9}
SIDES = {
    "no quota": None,
    "every quota, none binding": {"entities": [
        {"entity": {"user": "<default>"}, "quotas": {**HUGE, "producer_ids_rate": 10**9}},
        {"entity": {"client-id": "<default>"}, "quotas": HUGE},
    ]},
}
WARM_UP = 200


def _count(cluster: KafkaCluster, workdir: Path, name: str, quotas: dict | None, round_trips: int) -> int:
    from confluent_kafka import Producer

    doc: dict = {"upstream": {"bootstrap_servers": cluster.bootstrap}, "log_level": "INFO",
                 "listen": {"host": "127.0.0.1", "bootstrap_port": 0, "broker_ports": "ephemeral"}}
    if quotas:
        doc["quotas"] = quotas
    config = workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump(doc))
    out = workdir / f"{name}.cg"
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
             "-m", "proxy.cli", "run", "-c", str(config)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0"})
    try:
        assert proc.stdout is not None
        m = re.search(r"bootstrap\.servers=(\S+)", proc.stdout.readline().decode())
        if m is None:
            raise SystemExit(f"proxy under valgrind did not start; see {workdir / name}.log")
        producers = [Producer({"bootstrap.servers": m.group(1), "acks": "all", "linger.ms": 0,
                               "socket.nagle.disable": True})]
        value = os.urandom(1024)

        def produce(n: int) -> None:
            for _ in range(n):
                producers[0].produce("t", value, partition=0)
                if producers[0].flush(30) != 0:
                    raise SystemExit("a record was not delivered within 30 s")

        produce(WARM_UP)
        control = ["callgrind_control"]
        subprocess.run([*control, "-i", "on", str(proc.pid)], check=True, capture_output=True)
        produce(round_trips)
        subprocess.run([*control, "-i", "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run([*control, "-d", str(proc.pid)], check=True, capture_output=True)
        producers.clear()  # before the proxy goes: librdkafka would keep reconnecting to it (and saying so)
        gc.collect()
    finally:
        proc.terminate()
        proc.wait(60)
    text = subprocess.run(["callgrind_annotate", "--auto=no", f"{out}.1"], check=True, capture_output=True,
                          text=True).stdout
    m = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text)
    if m is None:
        raise SystemExit(f"no total in {out}.1")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=400)
    ap.add_argument("--keep", help="directory to keep the callgrind files in")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ktp-live-cg-"))
    results = {}
    try:
        with KafkaCluster(1, workdir=workdir / "kafka") as cluster:
            cluster.tool("topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", "t",
                         "--partitions", "1", "--replication-factor", "1", check=True)
            for i, (side, quotas) in enumerate(SIDES.items()):
                results[side] = _count(cluster, workdir, f"side{i}", quotas, args.round_trips) / args.round_trips
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for f in workdir.glob("side*.cg.1"):
                shutil.copy(f, Path(args.keep) / f.name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(results, "instructions per live Produce round trip")


if __name__ == "__main__":
    main()
