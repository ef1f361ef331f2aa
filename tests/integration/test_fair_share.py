"""Issue 48: with no quota anywhere, a tenant flooding the cluster must not take a neighbour's latency.

Against the real 3-broker cluster, through a proxy with the default configuration (fair share on, no quota): a
victim producer (200 records/s of 1 KiB, acks=all, on a topic with a leader on every broker) runs alone, then a
flooder joins (two librdkafka producers at full speed, 1 MB batches, acks=all, another client id, no quota). Before
issue 48 (``quotas.fair_share.enabled: false``, checked once: 2026-12-05, victim p99 over the flood 4.6 s and
rising, the flood's settled windows 4.6-7.3 s in bench.isolation) the victim's requests queued behind the flood
for seconds; with fair share the brokers' answers are watched, each broker saturates, the flooder is held to a
share and the victim is never held.

What is asserted does not move with the machine's load: the victim's p99 over the flood, after its first seconds,
against a bound far below what the flood costs it unheld (a second, against seconds) and above what a loaded
2-core machine adds to a held flood (tens of ms); the flood still gets through (it is shared, not starved); nothing
of the victim's is lost; the proxy says which brokers it limited and whom it held (log, metrics).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.harness.cluster import free_port
from tests.harness.measure import MIB, percentile
from tests.support import REPO

pytestmark = pytest.mark.cluster

ALONE_S = 5.0
FLOOD_S = 20.0
SETTLE_S = 5.0
"""The flood's first seconds are not in the bound: the flood reaches the brokers at full speed until their answers
slow down (within a tick or two) and the queue it built drains; bench.isolation reports that first window."""
BOUND_S = 1.0


def _topic(cluster) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    nodes = [b.node_id for b in cluster.brokers]
    topic = f"fair-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assignment = [nodes[i:] + nodes[:i] for i in range(len(nodes))]  # one leader per broker, every replica
    admin.create_topics([NewTopic(topic, num_partitions=len(nodes), replica_assignment=assignment)])[topic].result(30)
    return topic


def _warm(bootstrap: str, topic: str) -> None:
    """A hundred small records to every partition, acknowledged by all replicas: a few, not a flood of its own."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "client.id": "warm-up", "acks": "all"})
    partitions = len(p.list_topics(topic, timeout=15).topics[topic].partitions)
    for i in range(100):
        p.produce(topic, b"x" * 1024, partition=i % partitions)
    assert p.flush(60) == 0


SETTLED_P99_S = 0.1
"""The victim's own shape alone is quick on a warm cluster (p99 5-50 ms); a freshly started one answered it in
0.5-1.9 s for its first 10 s, straight to the brokers as through the proxy (2026-12-06, three runs), and the test
read that as the flood's doing."""


def _settle(bootstrap: str, topic: str, workdir: Path) -> str:
    """Run the victim's shape alone until its last seconds are quick: brokers warm up under sustained acks=all load
    (their JIT, the replicas' fetch sessions), not under a hundred records. Returns what each try measured."""
    tries = []
    for k in range(6):
        out = workdir / f"settle-{k}.json"
        assert _spawn("victim", bootstrap, topic, "6", str(out)).wait(240) == 0
        v = json.loads(out.read_text())
        late = [lat for sent, lat in v["rows"] if sent >= v["start"] + 3]
        tries.append(f"{percentile(late, 99) * 1000:.0f}")
        if late and percentile(late, 99) < SETTLED_P99_S:
            break
    return " ".join(tries)


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.harness.flood", *args], cwd=REPO)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_a_flood_with_no_quota_does_not_take_a_neighbours_latency(cluster, fresh_proxy, tmp_path):
    port = free_port()
    proxy = fresh_proxy(**{"metrics.port": port})  # every quota setting at its default: fair share on
    victim_topic, flood_topic = _topic(cluster), _topic(cluster)
    for topic in (victim_topic, flood_topic):  # leaders elected, metadata and connections warm before the clock
        _warm(proxy.bootstrap, topic)
    settle = _settle(proxy.bootstrap, victim_topic, tmp_path)
    victim_out, flood_out = tmp_path / "victim.json", tmp_path / "flood.json"
    victim = _spawn("victim", proxy.bootstrap, victim_topic, str(ALONE_S + FLOOD_S + 2), str(victim_out))
    time.sleep(ALONE_S)
    flood_start = time.monotonic()
    flooder = _spawn("flood", proxy.bootstrap, flood_topic, str(FLOOD_S), str(flood_out), "flooder", "2")
    held_text = ""
    try:
        time.sleep(FLOOD_S - 3)
        held_text = _metrics(port)  # while the flood is on
        assert flooder.wait(FLOOD_S + 120) == 0
        assert victim.wait(ALONE_S + FLOOD_S + 180) == 0
    finally:
        for p in (victim, flooder):
            if p.poll() is None:
                p.kill()
    v = json.loads(victim_out.read_text())
    f = json.loads(flood_out.read_text())
    alone = [lat for sent, lat in v["rows"] if sent < flood_start]
    flooded = [lat for sent, lat in v["rows"] if flood_start + SETTLE_S <= sent < flood_start + FLOOD_S]
    flood_mib_s = f["delivered_bytes"] / FLOOD_S / MIB
    log = proxy.log()
    seconds: dict[int, list[float]] = {}
    for sent, lat in v["rows"]:
        seconds.setdefault(int(sent - flood_start), []).append(lat)
    per_second = " ".join(f"{k}:{percentile(x, 99) * 1000:.0f}" for k, x in sorted(seconds.items()))
    summary = (
        f"warm-up p99s (ms) {settle}; victim alone p99 {percentile(alone, 99) * 1000:.1f} ms; beside the flood p50 "
        f"{percentile(flooded, 50) * 1000:.1f} p99 {percentile(flooded, 99) * 1000:.1f} max "
        f"{max(flooded) * 1000:.1f} ms ({len(flooded)} records); flood {flood_mib_s:.1f} MiB/s acknowledged; "
        f"victim errors {v['error_count']}, undelivered {v['undelivered']}; the victim's p99 (ms) per second from "
        f"the flood's start: {per_second}"
    )
    print(summary)
    assert v["error_count"] == 0 and v["undelivered"] == 0, summary  # the victim loses nothing
    assert len(flooded) >= 0.9 * (FLOOD_S - SETTLE_S) * 200, summary  # it kept its schedule: no stall hid a gap
    assert percentile(flooded, 99) < BOUND_S, summary
    assert flood_mib_s >= 1.0, summary  # held to a share, not starved
    assert "fair share: broker" in log and "saturated" in log, log[-3000:]
    # The metrics name whom it held: the flooder, on some broker, with a share; never the victim.
    held: dict[str, float] = {}
    for line in held_text.splitlines():
        if line.startswith("ktp_fair_share_tenant_held_total{"):
            client_id = line.split('client_id="')[1].split('"')[0]
            held[client_id] = held.get(client_id, 0.0) + float(line.rsplit(" ", 1)[1])
    assert held.get("flooder", 0) > 0, held_text[-3000:]
    assert held.get("victim", 0) == 0, held
