"""The fleet's topics belong to the proxy (issue 29), against the real cluster.

Two members of one fleet, a tenant with no admin rights. Through a member, the tenant's unmodified librdkafka
producer tries what the issue found working: one record on the quota topic giving itself 1e12 B/s, one forged
usage report. Both are refused (TOPIC_AUTHORIZATION_FAILED) and change nothing at either member. The same
forged record written straight to the cluster (as a client that bypasses the proxy could) reaches the topic
but no member takes it in: it has no valid MAC, and each member counts it. Reading is refused as well: Metadata,
Fetch by name and by id, ListOffsets, OffsetFetch and DescribeConfigs, on the fleet's topics and the decision log's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid

import pytest
from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.consumer import ListOffsetsRequest, OffsetFetchRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from tests.harness.cluster import free_port
from tests.harness.request_bodies import fetch_request
from tests.support import KafkaWire, wait_until

pytestmark = pytest.mark.cluster

TOPIC_AUTHORIZATION_FAILED = 29
os.environ.setdefault("KTP_TEST_FLEET_SECRET", "fleet-test-secret-" + uuid.uuid4().hex)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        total = 0.0
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def _describe(proxy, client_id: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "quotas",
            "--bootstrap-server",
            proxy.bootstrap,
            "describe",
            "--client-id",
            client_id,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.replace(" ", "")


def _produce(bootstrap: str, topic: str, key: bytes | None, value: bytes, client_id: str) -> str | None:
    """One record with librdkafka; the delivery error's name, or None when it was written."""
    from confluent_kafka import Producer

    outcome: list = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "message.timeout.ms": 15_000,
            "allow.auto.create.topics": False,
        }
    )
    p.produce(topic, value, key, on_delivery=lambda err, msg: outcome.append(err))
    p.flush(30)
    assert outcome, "no delivery report"
    return None if outcome[0] is None else outcome[0].name()


@pytest.fixture
def fleet(cluster, fresh_proxy):
    name = f"g{uuid.uuid4().hex[:8]}"
    ports = [free_port() for _ in range(2)]
    tenant = f"tenant-{name}"
    members = [
        fresh_proxy(
            **{
                "quotas.scope": "fleet",
                "fleet.name": name,
                "fleet.member": f"m{i}",
                "fleet.secret_env": "KTP_TEST_FLEET_SECRET",
                "metrics.port": ports[i],
                "quotas.describers": ["ANONYMOUS"],
                "decision_log.topic": f"ktp-decisions-{name}",
                "quotas.entities": [{"entity": {"client-id": tenant}, "quotas": {"producer_byte_rate": 1048576}}],
            }
        )
        for i in range(2)
    ]
    wait_until(
        lambda: all(_metric(p, "ktp_fleet_connected") == 1 for p in ports),
        60,
        what="both members connected to the fleet's topics",
    )
    return name, members, ports, tenant


def test_a_tenant_cannot_give_itself_a_quota_through_the_fleet_topics(cluster, fleet):
    name, members, ports, tenant = fleet
    quota_topic, usage_topic = f"__ktp_fleet_{name}_quotas", f"__ktp_fleet_{name}"
    forged_key = json.dumps([None, tenant]).encode()
    forged = json.dumps({"v": 1, "quotas": {"producer_byte_rate": 1e12}}).encode()
    report = json.dumps({"v": 1, "m": "forger", "t": 0, "u": [["producer_byte_rate", "", "victim", 1e12]]}).encode()
    for member in members:
        assert "producer_byte_rate=1048576" in _describe(member, tenant)

    # Through a member: refused as a broker refuses an unauthorized topic, and counted.
    assert _produce(members[0].bootstrap, quota_topic, forged_key, forged, tenant) == "TOPIC_AUTHORIZATION_FAILED"
    assert _produce(members[1].bootstrap, usage_topic, None, report, tenant) == "TOPIC_AUTHORIZATION_FAILED"
    assert _metric(ports[0], "ktp_protected_topic_refusals_total") >= 1
    assert _metric(ports[1], "ktp_protected_topic_refusals_total") >= 1

    # Straight to the cluster (a client the proxy never sees): written, but no member takes it in.
    assert _produce(cluster.bootstrap, quota_topic, forged_key, forged, tenant) is None
    assert _produce(cluster.bootstrap, usage_topic, None, report, tenant) is None
    wait_until(
        lambda: all(_metric(p, "ktp_fleet_records_unauthenticated") >= 2 for p in ports),
        20,
        what="both members ignoring the two forged records",
    )
    for member in members:
        described = _describe(member, tenant)
        assert (
            "producer_byte_rate=1048576" in described and "1e+12" not in described and "1000000000000" not in described
        ), described
    assert all(_metric(p, "ktp_fleet_quota_alters_taken_in") == 0 for p in ports)


def _error_codes(value) -> list[int | None]:
    """Every error_code in a decoded response, however deep."""
    out: list[int | None] = []  # None: a field that is absent at this version
    if isinstance(value, list):
        for v in value:
            out += _error_codes(v)
    elif hasattr(type(value), "_struct"):
        for f in type(value)._struct.fields.values():
            v = getattr(value, f.name, None)
            if f.name in ("error_code", "partition_error_code"):
                out.append(v)
            else:
                out += _error_codes(v)
    return out


def _topic_id(cluster, topic: str) -> uuid.UUID:
    """The topic's id, asked of the cluster itself (what a client could have learned some other way)."""
    wire = KafkaWire(cluster.bootstrap.split(",")[0])
    try:
        T = MetadataRequest.MetadataRequestTopic
        wire.send(
            MetadataRequest(
                topics=[T(name=topic, topic_id=None)],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            12,
        )
        (t,) = wire.recv()[1].topics
        return t.topic_id
    finally:
        wire.close()


def test_a_tenant_cannot_read_or_describe_the_proxys_topics(cluster, fleet):
    name, members, ports, tenant = fleet
    own = [f"__ktp_fleet_{name}", f"__ktp_fleet_{name}_quotas"]
    wire = KafkaWire(members[0].bootstrap)
    try:

        def ask(request, version: int):
            wire.send(request, version, client_id=tenant)
            return wire.recv()[1]

        # Metadata for every topic leaves them out; by name they are unauthorized, as a broker answers.
        listed = ask(
            MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False), 12
        )
        assert not [t.name for t in listed.topics if t.name.startswith("__ktp_")]
        T = MetadataRequest.MetadataRequestTopic
        named = ask(
            MetadataRequest(
                topics=[T(name=n, topic_id=None) for n in own],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            12,
        )
        assert sorted((t.name, t.error_code, len(t.partitions)) for t in named.topics) == sorted(
            (n, TOPIC_AUTHORIZATION_FAILED, 0) for n in own
        )
        assert named.brokers  # the answer still lists the brokers (the request was forwarded without the topics)

        by_name = ask(fetch_request(own[1], max_wait_ms=100), 12)
        assert _error_codes(by_name.responses) == [TOPIC_AUTHORIZATION_FAILED]
        quota_id = _topic_id(cluster, own[1])
        by_id = ask(fetch_request((None, quota_id), max_wait_ms=100), 15)
        assert _error_codes(by_id.responses) == [TOPIC_AUTHORIZATION_FAILED]

        LT = ListOffsetsRequest.ListOffsetsTopic
        offsets = ask(
            ListOffsetsRequest(
                replica_id=-1,
                isolation_level=0,
                topics=[LT(name=own[0], partitions=[LT.ListOffsetsPartition(partition_index=0, timestamp=-1)])],
            ),
            7,
        )
        assert _error_codes(offsets.topics) == [TOPIC_AUTHORIZATION_FAILED]

        OT = OffsetFetchRequest.OffsetFetchRequestTopic
        committed = ask(OffsetFetchRequest(group_id="g", topics=[OT(name=own[0], partition_indexes=[0])]), 7)
        assert _error_codes(committed.topics) == [TOPIC_AUTHORIZATION_FAILED]

        DR = DescribeConfigsRequest.DescribeConfigsResource
        configs = ask(
            DescribeConfigsRequest(
                resources=[DR(resource_type=2, resource_name=n, configuration_keys=None) for n in own],
                include_synonyms=False,
            ),
            1,
        )
        assert [r.error_code for r in configs.results] == [TOPIC_AUTHORIZATION_FAILED] * 2

        # The decision log's topic is the proxy's too, whatever its name.
        TD = ProduceRequest.TopicProduceData
        wrote = ask(
            ProduceRequest(
                transactional_id=None,
                acks=1,
                timeout_ms=5000,
                topic_data=[
                    TD(name=f"ktp-decisions-{name}", partition_data=[TD.PartitionProduceData(index=0, records=b"")])
                ],
            ),
            7,
        )
        assert _error_codes(wrote.responses) == [TOPIC_AUTHORIZATION_FAILED]
    finally:
        wire.close()
    assert _metric(ports[0], "ktp_protected_topic_refusals_total") >= 7  # every request above but the listing
