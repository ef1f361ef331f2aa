"""What the brokers themselves time per request: bench.request_quota's workloads against a cluster whose
``kafka.request.logger`` is at DEBUG, summarised from the brokers' own log lines.

    flock /work/cluster.lock .venv/bin/python -m bench.broker_request_log --workloads rdk-produce,consumer-tail
        [--p rdk-produce=7 ...] [--warmup 4] [--seconds 12]

A diagnostic for issue 36, not a fidelity measurement: logging every request costs the brokers CPU (a JSON line
each, hundreds of MB a minute under a Produce flood), so rates here are lower than bench.request_quota's. What it
shows that nothing else does:

- per client id and API, the brokers' handler time (``localTimeMs``: dequeue to the end of ``KafkaApis.handle``,
  what the request quota charges besides the network thread's time) as p50, mean, p99 and maximum, and the
  records bytes of Fetch answers: is a charge in the typical request, or in a tail of descheduled threads?
- per client id, requests a second as the brokers completed them: with ``request_percentage`` set (``broker``
  phases) the cycle in which brokers hold a flooder (a burst at full speed, then one request a second at the 1-s
  throttle cap until the burst leaves the 11-s window), which is why bench.request_quota measures 48 s a phase.

Each workload runs ``free`` (no quota) then ``broker`` (``request_percentage`` = P on the brokers), twice.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.harness.request_log import LOG_NAME, parse_lines, summary


def main(argv: list[str] | None = None) -> int:
    from bench import request_quota as rq
    from tests.harness import KafkaCluster

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="rdk-produce,consumer-tail")
    ap.add_argument("--p", action="append", default=[], help="name=P (%%) for the broker phases; default 5")
    ap.add_argument("--warmup", type=float, default=4)
    ap.add_argument("--seconds", type=float, default=12)
    args = ap.parse_args(argv)
    fixed = {k: float(v) for k, v in (x.split("=") for x in args.p)}
    names = [n for n in args.workloads.split(",") if n]
    prefix = f"rl{uuid.uuid4().hex[:4]}-"
    with (
        tempfile.TemporaryDirectory(prefix="ktp-rl-") as tmp,
        KafkaCluster(2, workdir=Path(tmp) / "kafka", request_log=True) as cluster,
    ):
        kafka_bin = json.dumps(cluster.tool_cmd("producer_perf", jvm_opts=("-Xmx512m",)))
        for name in names:
            for phase in ("free", "broker", "free", "broker"):
                tag = uuid.uuid4().hex[:6]
                topic = client_id = f"{prefix}{name}-{phase}-{tag}"
                rq._create_topic(cluster.bootstrap, topic, rq.WORKLOADS[name], 2)
                time.sleep(1)
                if phase == "broker":
                    rq.set_brokers_quota(cluster, client_id, fixed.get(name, 5.0))
                bootstrap = rq.worker_bootstrap(name, cluster.bootstrap, cluster.bootstrap, topic)
                stats = rq.run_worker(name, bootstrap, topic, client_id, args.warmup, args.seconds, kafka_bin)
                print(f"{client_id}: client-side rate {stats['rate']:.0f}/s", flush=True)
        time.sleep(2)
        with open(cluster.brokers[0].log_path, errors="replace") as log:
            calls = parse_lines(log, prefix)
    apis = {LOG_NAME[rq.API_OF[n]] for n in names}
    print("\n".join(summary(calls, apis)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
