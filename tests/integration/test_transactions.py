"""Kafka transactions through the proxy: Java read-process-write with ``sendOffsetsToTransaction``, aborted and
committed transactions, and ``read_committed`` consumers, all on the proxy's listeners.

What "exactly once" means here, checked record by record: the processor writes each input record to the same
partition number of the output topic, so a ``read_committed`` read of output partition p must be input partition
p, transformed, in order — nothing lost, duplicated or reordered — while a ``read_uncommitted`` read of the same
partitions also shows the aborted copies (proof that aborts really wrote data that read_committed then hid), and
the group's committed offsets (``sendOffsetsToTransaction``) end exactly at the input's end.
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import free_port
from tests.harness import txn_probe as tp
from tests.integration.conftest import broker_ports
from tests.support import ConnectionWatcher

pytestmark = pytest.mark.cluster

PARTITIONS = 3
VALUE_BYTES = 1000
RW_CLIENT = "txn-rw"  # the transactional producer's client.id (its consumer is RW_CLIENT + "-consumer")
TXN_TIMEOUT_MS = 30_000
MIB = 1 << 20

# Every quota kind, on the entities every client here matches, far above what the test uses.
ALL_KINDS_LOOSE = [
    {
        "entity": {"client-id": "<default>"},
        "quotas": {
            "producer_byte_rate": 512 * MIB,
            "consumer_byte_rate": 512 * MIB,
            "request_percentage": 10_000,
            "controller_mutation_rate": 10_000,
        },
    },
    # producer_ids_rate exists only for users (KIP-936); on a plain listener everyone is user ANONYMOUS.
    {"entity": {"user": "<default>"}, "quotas": {"producer_ids_rate": 10_000}},
]
KINDS = (
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
    "producer_ids_rate",
)


def _value(i: int) -> str:
    head = f"{i:06d}:"
    return head + "x" * (VALUE_BYTES - len(head))


def _seed(bootstrap: str, topic: str, n: int) -> dict[int, list[str]]:
    """``n`` records round-robin over the partitions (librdkafka, idempotent); partition -> values in order."""
    p = Producer({"bootstrap.servers": bootstrap, "client.id": "txn-seed", "enable.idempotence": True, "linger.ms": 20})
    sent: dict[int, list[str]] = defaultdict(list)
    try:
        for i in range(n):
            part = i % PARTITIONS
            p.produce(topic, value=_value(i), key=f"k{i % 7}", partition=part)
            sent[part].append(_value(i))
            if i % 500 == 499:
                p.poll(0)
        assert p.flush(60) == 0
    finally:
        p.close()
    return sent


def _decisions(port: int) -> dict[tuple[str, str], float]:
    """The proxy's ``ktp_quota_decisions`` counters: (quota key, action) -> count."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[tuple[str, str], float] = defaultdict(float)
    for m in re.finditer(r"^ktp_quota_decisions_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out[(labels["quota"], labels["action"])] += float(m.group(2))
    return out


def _run_read_process_write(cluster, proxy, n: int, *, abort_every: int) -> dict:
    """Create the topics and seed the input (librdkafka), run the Java read-process-write loop and both verifying
    reads, all through ``proxy``; check that no Java client connected to a broker port (the JVMs are watched, not
    this process: it is shared with other tests' clients). Returns what the checks need."""
    run = uuid.uuid4().hex[:6]
    src, dst, group = f"txn-in-{run}", f"txn-out-{run}", f"txn-g-{run}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    for f in admin.create_topics([NewTopic(t, PARTITIONS, 3) for t in (src, dst)]).values():
        f.result(30)
    sent = _seed(proxy.bootstrap, src, n)
    with ConnectionWatcher([], interval=0.05) as w:
        t0 = time.monotonic()
        probe = tp.process_popen(
            proxy.bootstrap,
            input=src,
            output=dst,
            group=group,
            transactional_id=f"tx-{run}",
            expect=n,
            client_id=RW_CLIENT,
            abort_every=abort_every,
            transaction_timeout_ms=TXN_TIMEOUT_MS,
        )
        w.add(probe.pid)
        rows = tp.result(probe, 240)
        wall = time.monotonic() - t0
        reads = {}
        for iso in ("read_committed", "read_uncommitted"):
            c = tp.consume_popen(proxy.bootstrap, dst, isolation=iso)
            w.add(c.pid)
            reads[iso] = tp.result(c, 120)
    leaked = w.remote_ports & broker_ports(cluster)
    assert not leaked, f"a client connected straight to broker ports {leaked}"
    assert w.remote_ports & proxy.listening_ports(), "no client connected to the proxy at all"
    log = proxy.log()
    for bad in ("ERROR", "Traceback"):
        assert bad not in log, [ln for ln in log.splitlines() if bad in ln][:5]
    # Checked straight on the cluster, not through the proxy under test: the group's committed offsets.
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(src, p) for p in range(PARTITIONS)], 30)
    finally:
        consumer.close()
    committed = {t.partition: t.offset for t in tps}
    return {"sent": sent, "rows": rows, "wall": wall, "reads": reads, "committed_offsets": committed}


def _by_partition(rows) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        if "p" in r:
            out[r["p"]].append(r["v"])
    return out


def _assert_exactly_once(res: dict, n: int) -> None:
    sent, rows = res["sent"], res["rows"]
    done = rows.done
    assert done["committed"] == n
    outcomes = [r["outcome"] for r in rows if "txn" in r]
    assert "abort" in outcomes and "commit" in outcomes, outcomes
    assert done["aborted"] > 0
    assert done["max_txn_ms"] < TXN_TIMEOUT_MS / 2, f"a transaction took {done['max_txn_ms']} ms"
    committed = _by_partition(res["reads"]["read_committed"])
    assert res["reads"]["read_committed"].done["count"] == n
    for p in range(PARTITIONS):
        want = ["rw:" + v for v in sent[p]]
        got = committed[p]
        assert len(got) == len(want), f"partition {p}: {len(got)} records, {len(want)} expected"
        if got != want:
            first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            pytest.fail(f"partition {p}: record {first} is {got[first][:12]!r}, expected {want[first][:12]!r}")
    raw = _by_partition(res["reads"]["read_uncommitted"])
    assert sum(map(len, raw.values())) > n, "no aborted record reached the log: read_committed filtered nothing"
    for p in range(PARTITIONS):
        assert set(raw[p]) == set(committed[p]), f"partition {p}: an aborted record that was never committed"
    assert res["committed_offsets"] == {p: len(sent[p]) for p in range(PARTITIONS)}, "offsets sent in transactions"


def test_read_process_write_every_quota_kind_configured_none_binding(cluster, fresh_proxy):
    n = 1500
    port = free_port()
    proxy = fresh_proxy(**{"metrics.port": port, "quotas.entities": ALL_KINDS_LOOSE})
    res = _run_read_process_write(cluster, proxy, n, abort_every=4)
    _assert_exactly_once(res, n)
    assert res["rows"].done["produce_throttle_time_max"] == 0
    decisions = _decisions(port)
    for kind in KINDS:
        assert decisions[(kind, "pass")] > 0, f"{kind} never applied to a request: {dict(decisions)}"
        assert decisions[(kind, "throttle")] == decisions[(kind, "reject")] == 0, dict(decisions)
    print(f"\nloose quotas: {n} records, {res['rows'].done['txns']} transactions in {res['wall']:.1f} s")


def test_read_process_write_under_a_binding_producer_byte_rate(cluster, fresh_proxy):
    """The transactional producer's client id is held to 128 KiB/s (one bucket across the brokers,
    ``quotas.scope: cluster``): the proxy throttles its Produce requests (the producer sees throttle times), yet
    every transaction completes well inside its timeout and the committed output is still exactly the input."""
    n = 1500
    quota = 128 * 1024
    window_s, samples = 0.2, 11
    port = free_port()
    entities = [*ALL_KINDS_LOOSE, {"entity": {"client-id": RW_CLIENT}, "quotas": {"producer_byte_rate": quota}}]
    proxy = fresh_proxy(
        **{
            "metrics.port": port,
            "quotas.entities": entities,
            "quotas.scope": "cluster",
            "quotas.window_size_seconds": window_s,
            "quotas.window_num": samples,
        }
    )
    res = _run_read_process_write(cluster, proxy, n, abort_every=4)
    _assert_exactly_once(res, n)
    done = res["rows"].done
    assert done["produce_throttle_time_max"] > 0, "the producer was never told to back off"
    decisions = _decisions(port)
    assert decisions[("producer_byte_rate", "throttle")] > 0, dict(decisions)
    # The rate held. Counted: the committed records only (an abort drops records the producer had not sent yet)
    # and the time spent inside transactions (not JVM start or the group join). A fresh client may burst about
    # (samples - 1) windows' worth of quota first.
    in_txns = sum(r["ms"] for r in res["rows"] if "txn" in r) / 1000
    floor = (n * VALUE_BYTES - (samples - 1) * window_s * quota) / quota
    assert in_txns > 0.9 * floor, f"{n * VALUE_BYTES} B committed in {in_txns:.1f} s at a {quota} B/s quota"
    print(
        f"\nbinding quota: {n} records, {done['txns']} transactions in {res['wall']:.1f} s, {in_txns:.1f} s of it "
        f"in transactions (>= {floor:.1f} s by the quota), producer throttle max "
        f"{done['produce_throttle_time_max']:.0f} ms, slowest transaction {done['max_txn_ms']} ms"
    )
