"""Quota fidelity: the rate a byte-rate quota actually allows, measured from what the cluster received or served,
through the proxy and with the same quota set on the brokers themselves (no proxy), in one run.

    .venv/bin/python -m bench.quota_fidelity [--quota-mib 3] [--seconds 30] [--repeats 1] [--output PATH]

How the rate is measured (never from the client's own report) is :mod:`tests.harness.measure`'s docstring: the
produce side from the partition's log on the leader's disk, the fetch side from the group's committed offset
mapped to batch bytes, the slope over the steady part of the run (the padded window's first burst excluded),
~70 B per Produce request added back for the "charged" column. The clients are :mod:`tests.harness.traffic`'s.

The other half of issue 5's benchmark, all quotas configured but none binding (throughput ≥ 0.90 of direct),
is the ``quotas`` side of ``bench.run``: measured there next to the plain proxy, same warm brokers, same rounds.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import KafkaCluster
from tests.harness.measure import (
    MIB,
    Rate,
    Sampler,
    batch_index,
    committed_sampler,
    create_topic,
    log_bytes,
    produce_rate,
    steady_rate,
    topic_dirs,
)
from tests.harness.traffic import (
    RECORD,
    check_sequence,
    fill_topic,
    java_consume,
    java_produce,
    rdkafka_consume,
    rdkafka_produce,
)
from tests.support import REPO, ProxyProcess


# ------------------------------------------------------------------------------------------ benchmark
@dataclass
class Row:
    label: str
    quota: float
    results: list[Rate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _set_broker_quota(cluster: KafkaCluster, client_id: str, key: str, value: int) -> None:
    cluster.tool(
        "configs",
        "--bootstrap-server",
        cluster.bootstrap,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        client_id,
        "--add-config",
        f"{key}={value}",
        check=True,
    )


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quota-mib", type=float, default=3.0, help="byte-rate quota in MiB/s (default 3)")
    ap.add_argument("--seconds", type=float, default=30.0, help="steady seconds per run (default 30)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per row (default 1)")
    ap.add_argument("--records", type=int, default=100_000, help="records per broker warm-up run")
    ap.add_argument("--output", default=str(REPO / "bench" / "QUOTA_FIDELITY.md"))
    return ap.parse_args(argv)


def _warm_up(cluster: KafkaCluster, n: int) -> None:
    """Fresh brokers are slow: three unmeasured Java producer runs of ``n`` records first."""
    from bench.run import java_produce as bench_java_produce

    cluster.tool(
        "topics",
        "--bootstrap-server",
        cluster.bootstrap,
        "--create",
        "--topic",
        "bench",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
        check=True,
    )
    print("warming up the brokers", flush=True)
    for _ in range(3):
        bench_java_produce(cluster, cluster.bootstrap, n, -1)


_CLIENTS = (("jp", "producer"), ("rp", "producer"), ("jc", "consumer"), ("rc", "consumer"))
"""The four clients' short names and the byte rate each is held to."""


def _quota_proxy(workdir: Path, cluster: KafkaCluster, q: int) -> ProxyProcess:
    """A proxy holding client ids ``proxy-<k>`` to ``q`` B/s, and the same quota on the brokers for ``broker-<k>``."""
    proxy = ProxyProcess(
        workdir,
        cluster.bootstrap,
        {
            "quotas.entities": [
                {"entity": {"client-id": f"proxy-{k}"}, "quotas": {f"{kind}_byte_rate": q}} for k, kind in _CLIENTS
            ]
        },
        name="quota-proxy",
    ).start()
    for k, kind in _CLIENTS:
        _set_broker_quota(cluster, f"broker-{k}", f"{kind}_byte_rate", q)
    time.sleep(2)  # let the brokers apply the new client quotas
    return proxy


Measured = Callable[[str, str], tuple[Rate, list[str]]]
"""One workload: (where, bootstrap) -> the rate the cluster saw and notes."""


def _workloads(
    cluster: KafkaCluster, q: int, n_run: int, steady: float, src: str, src_index: tuple[list[int], list[int]]
) -> list[tuple[str, Measured]]:
    """The four workloads (Java and librdkafka, producing and consuming ``src``), each as a label and a run."""

    def produce_java(where: str, bs: str) -> tuple[Rate, list[str]]:
        topic = f"q-{where}-jp-{uuid.uuid4().hex[:6]}"
        create_topic(cluster, topic, [2])
        d = topic_dirs(cluster, topic)
        with Sampler(lambda: log_bytes(d)) as s:
            res = java_produce(cluster, bs, topic, n_run, f"{where}-jp")
        m = res["metrics"]
        notes = [
            f"throttle-time-max {m.get('producer-metrics:produce-throttle-time-max', 0):.0f} ms",
            f"errors {res['metrics'].get('producer-metrics:record-error-total', -1):.0f}",
        ]
        if res["errors"] or res["sent"] != n_run:
            notes.append(f"PROBLEM sent {res['sent']}/{n_run}: {res['errors'][:2]}")
        return produce_rate(s.samples, q, d[0]), notes

    def produce_rdk(where: str, bs: str) -> tuple[Rate, list[str]]:
        topic = f"q-{where}-rp-{uuid.uuid4().hex[:6]}"
        create_topic(cluster, topic, [3])
        d = topic_dirs(cluster, topic)
        with Sampler(lambda: log_bytes(d)) as s:
            res = rdkafka_produce(bs, topic, f"{where}-rp", 13 + steady)
        notes = [f"{res['delivered']:,} delivered"]
        if res["errors"] or res["undelivered"]:
            notes.append(f"PROBLEM {res['errors'][:2]} undelivered {res['undelivered']}")
        problems = check_sequence(cluster.bootstrap, topic, 0, res["produced"])
        notes.append("sequence ok" if not problems else f"PROBLEM {problems[:2]}")
        return produce_rate(s.samples, q, d[0]), notes

    def consume_java(where: str, bs: str) -> tuple[Rate, list[str]]:
        group = f"q-{where}-jc-{uuid.uuid4().hex[:6]}"
        with committed_sampler(cluster, group, src, src_index) as s:
            res = java_consume(cluster, bs, src, n_run, group, f"{where}-jc")
        m = res["metrics"]
        tmax = m.get("consumer-fetch-manager-metrics:fetch-throttle-time-max", 0)
        notes = [f"throttle-time-max {tmax:.0f} ms"]
        if res["errors"] or res["consumed"] < n_run:
            notes.append(f"PROBLEM consumed {res['consumed']}/{n_run}: {res['errors'][:2]}")
        return steady_rate(s.samples, q), notes

    def consume_rdk(where: str, bs: str) -> tuple[Rate, list[str]]:
        group = f"q-{where}-rc-{uuid.uuid4().hex[:6]}"
        with committed_sampler(cluster, group, src, src_index) as s:
            res = rdkafka_consume(bs, src, group, f"{where}-rc", n_run)
        notes = (
            []
            if not res["errors"] and res["consumed"] >= n_run
            else [f"PROBLEM consumed {res['consumed']}/{n_run}: {res['errors'][:2]}"]
        )
        return steady_rate(s.samples, q), notes

    return [
        ("Produce, Java producer-perf-test", produce_java),
        ("Produce, librdkafka (confluent-kafka)", produce_rdk),
        ("Fetch, Java consumer-perf-test", consume_java),
        ("Fetch, librdkafka (confluent-kafka)", consume_rdk),
    ]


def _measure(
    workloads: list[tuple[str, Measured]], repeats: int, proxy: ProxyProcess, cluster: KafkaCluster, q: int
) -> dict[str, Row]:
    """Each workload through the proxy and against the brokers' own quota, the order swapped every round."""
    rows: dict[str, Row] = {}
    for r in range(repeats):
        for label, fn in workloads:
            for where in ("proxy", "broker") if r % 2 == 0 else ("broker", "proxy"):
                bs = proxy.bootstrap if where == "proxy" else cluster.bootstrap
                row = rows.setdefault(f"{label}|{where}", Row(f"{label}, quota on the {where}", q))
                rate, notes = fn(where, bs)
                row.results.append(rate)
                row.notes += notes
                print(
                    f"[{r + 1}/{repeats}] {row.label:60} {rate.rate / MIB:.3f} MiB/s "
                    f"(charged {rate.charged / MIB:.3f}) error {100 * rate.error(q):+.2f}% over "
                    f"{rate.seconds:.1f}s, burst {rate.burst_bytes / MIB:.1f} MiB; {'; '.join(notes)}",
                    flush=True,
                )
    return rows


def _table(rows: dict[str, Row], q: int) -> list[str]:
    table = [
        "| workload | quota MiB/s | achieved MiB/s (median) | error | charged-equivalent error | "
        "5 s slices MiB/s (min–max) | steady s | initial burst MiB | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows.values():
        med = statistics.median(x.rate for x in row.results)
        chg = statistics.median(x.charged for x in row.results)
        sl = [s for x in row.results for s in x.windows]
        table.append(
            f"| {row.label} | {q / MIB:.2f} | {med / MIB:.3f} | {100 * (med / q - 1):+.2f}% | "
            f"{100 * (chg / q - 1):+.2f}% | {min(sl) / MIB:.2f}–{max(sl) / MIB:.2f} | "
            f"{statistics.median(x.seconds for x in row.results):.0f} | "
            f"{statistics.median(x.burst_bytes for x in row.results) / MIB:.1f} | "
            f"{'; '.join(dict.fromkeys(row.notes))} |"
        )
    return table


def _document(
    args: argparse.Namespace,
    q: int,
    table: list[str],
    info: list[str],
    warnings: int,
    minutes: float,
    started: datetime.datetime,
) -> list[str]:
    """The report: how it was measured, then the table."""
    command = shlex.join([".venv/bin/python", "-m", "bench.quota_fidelity", *sys.argv[1:]])
    return [
        "# Quota fidelity: byte-rate quotas through the proxy vs on the brokers",
        "",
        f"- Command: `{command}` ({minutes:.0f} min in total); date {started:%Y-%m-%d %H:%M %Z}.",
        *info,
        f"- Quota {q:,} B/s ({q / MIB:g} MiB/s), one per client id (`proxy-jp`, `proxy-rp`, … in the proxy's config; "
        "`broker-jp`, … set with `kafka-configs --alter --entity-type clients --add-config` on the cluster, no "
        "proxy). Produce topics: 1 partition, RF 1; consume: one pre-filled 1-partition topic (16 KiB batches), "
        f"a fresh group per run. Records 1 KiB. {args.repeats} run(s) per row; ≥ {args.seconds:.0f} s steady each.",
        "- Achieved rate = least-squares slope of the bytes the cluster stored (produce: partition segment file "
        "sizes on the leader's disk) or served (consume: the group's committed offset read from the cluster, "
        "auto-commit every 200 ms, mapped to batch bytes) over the steady part of the run; the initial burst "
        "that Kafka's padded 10 s window allows a fresh client is excluded (column 'initial burst'). "
        "'charged-equivalent' adds ~70 B per produce request (one batch per request) to compare with what "
        "Kafka charges, the request size; fetch response overhead is < 0.1 % and not added. See the module "
        "docstring for details.",
        f"- Proxy log: {warnings} WARNING/ERROR lines.",
        "",
        "## Binding quota: achieved rate vs quota",
        "",
        *table,
        "",
        "All quotas configured but none binding: see the `quotas` side in BENCHMARKS.md (`bench.run`).",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    q = int(args.quota_mib * MIB)
    steady = args.seconds
    started = datetime.datetime.now().astimezone()
    from bench.run import machine_info, proxy_code_version

    code = proxy_code_version()
    workdir = Path(tempfile.mkdtemp(prefix="ktp-bench-"))
    t_start = time.monotonic()
    # Records a run needs: the padded-window burst (~10 s of quota) + 3 s to settle + the steady part.
    n_run = int((10 + 3 + steady + 2) * q / (RECORD + 10))
    try:
        with KafkaCluster(3, workdir=workdir / "kafka") as cluster:
            _warm_up(cluster, args.records)
            src = f"fill-{uuid.uuid4().hex[:6]}"
            create_topic(cluster, src, [1])
            print(f"filling {src} with {n_run:,} records", flush=True)
            fill_topic(cluster.bootstrap, src, n_run)
            src_index = batch_index(topic_dirs(cluster, src)[0])
            proxy = _quota_proxy(workdir, cluster, q)
            try:
                rows = _measure(_workloads(cluster, q, n_run, steady, src, src_index), args.repeats, proxy, cluster, q)
            except BaseException:
                proxy.terminate()  # else it outlives the run (its log stays in workdir)
                raise
            if proxy.terminate() != 0:
                raise RuntimeError(f"proxy exited badly:\n{proxy.log()[-3000:]}")
            warnings = [ln for ln in proxy.log().splitlines() if " WARNING " in ln or " ERROR " in ln]
            info = machine_info(cluster, code)
        shutil.rmtree(workdir, ignore_errors=True)
    except BaseException:
        print(f"failed; kept {workdir} for the proxy and broker logs (delete it when done)", file=sys.stderr)
        raise
    minutes = (time.monotonic() - t_start) / 60
    table = _table(rows, q)
    print("\n".join(table))
    doc = _document(args, q, table, info, len(warnings), minutes, started)
    out = Path(args.output)
    kept = out.read_text().partition("\n## Notes")[2] if out.exists() else ""  # the hand-written notes
    out.write_text("\n".join(doc).rstrip() + "\n" + (f"\n## Notes{kept}" if kept else ""))
    print(f"total {minutes:.1f} min; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
