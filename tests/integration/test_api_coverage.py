"""No API of the real cluster reaches clients unexamined: every API key and version the cluster's ApiVersions
advertises is rewritten by the proxy (``protocol.addresses.ADDRESS_APIS``), withdrawn
(``protocol.api_versions.WITHDRAWN``) or vouched for as carrying no broker address
(``protocol.address_free.ADDRESS_FREE``).

Why: the proxy forwards every other API as opaque bytes, at whatever version the broker offers. The next Kafka
release may add an API, or a version, whose response names brokers (as KIP-951 did for Produce and Fetch);
these tests fail then, instead of a bypass opening silently. The table's claims are re-checked against the
message specs inside the cluster's own ``kafka-clients`` jar, so the check moves with the Kafka version.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.admin.cluster import DescribeQuorumRequest
from kafka.protocol.metadata import ApiVersionsRequest

from protocol.address_free import ACL_HOST_APIS, ADDRESS_FREE, CHECKED_AGAINST, NOT_BROKER_ADDRESSES, address_free
from protocol.api_versions import WITHDRAWN
from protocol.apis import response_class
from protocol.endpoint_apis import ADDRESS_APIS, may_carry_addresses
from tests.support import KafkaWire

pytestmark = pytest.mark.cluster

DESCRIBE_QUORUM = 55
"""APIs the cluster speaks at versions that carry node addresses the proxy neither rewrites nor withdraws: a
defect, shown on the wire by ``test_describe_quorum_through_the_proxy_names_no_node_address``."""


def _api_versions(address: str) -> dict[int, tuple[int, int]]:
    wire = KafkaWire(address)
    try:
        wire.send(ApiVersionsRequest(client_software_name="ktp-test", client_software_version="1"), 3)
        _, resp = wire.recv()
    finally:
        wire.close()
    assert resp.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


@pytest.fixture(scope="module")
def cluster_apis(cluster) -> dict[int, tuple[int, int]]:
    """Every API key and version range the cluster's client listeners speak (the same on every broker)."""
    per_broker = [_api_versions(b.bootstrap) for b in cluster.brokers]
    assert all(v == per_broker[0] for v in per_broker), "the brokers disagree on their ApiVersions"
    assert len(per_broker[0]) > 50
    return per_broker[0]


def _spec_json(text: str) -> dict[str, Any]:
    return json.loads("\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("//")))


@pytest.fixture(scope="module")
def specs(cluster) -> dict[int, dict[str, Any]]:
    """API key -> response message spec, from ``common/message/*Response.json`` in the cluster's kafka-clients."""
    jars = sorted(cluster.dist.libs_dir.glob("kafka-clients-*.jar"))
    assert jars, f"no kafka-clients jar in {cluster.dist.libs_dir}"
    out = {}
    with zipfile.ZipFile(jars[-1]) as z:
        for name in z.namelist():
            if re.fullmatch(r"common/message/\w+Response\.json", name):
                spec = _spec_json(z.read(name).decode())
                out[spec["apiKey"]] = spec
    return out


def _in(versions: str | None, v: int) -> bool:
    """Kafka's version ranges: ``"3+"``, ``"1-4"``, ``"2"``, ``"none"``."""
    if versions is None or versions == "none":
        return False
    if versions.endswith("+"):
        return v >= int(versions[:-1])
    lo, _, hi = versions.partition("-")
    return int(lo) <= v <= int(hi or lo)


def _address_paths(spec: dict[str, Any], v: int) -> list[tuple[str, ...]]:
    """Fields holding a host or port at version ``v`` (any depth, common structs resolved), minus the ones the
    table's docstring accepted as not being broker addresses."""
    common = {c["name"]: c.get("fields", []) for c in spec.get("commonStructs", [])}

    def walk(fields: list[dict[str, Any]], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        for f in fields:
            if not (_in(f.get("versions"), v) or _in(f.get("taggedVersions"), v)):
                continue
            here = (*path, f["name"])
            if f["name"] in ("Host", "Port"):
                yield here
            sub = f.get("fields") or common.get(f["type"].removeprefix("[]"))
            if sub:
                yield from walk(sub, here)

    return [
        p
        for p in walk(spec.get("fields", []), ())
        if not NOT_BROKER_ADDRESSES & set(p) and not (spec["apiKey"] in ACL_HOST_APIS and p[-1] == "Host")
    ]


def _name(specs: dict[int, dict[str, Any]], key: int) -> str:
    return specs[key]["name"].removesuffix("Response") if key in specs else f"api {key}"


def test_every_api_the_cluster_speaks_is_rewritten_withdrawn_or_known_address_free(cluster_apis, specs):
    """Each API the cluster speaks is rewritten, withdrawn, or vouched for at some version its clients can use
    (the proxy caps it there: ``offered_caps``). A new API fails here until someone has read its response."""
    unexamined = {}
    for key, (lo, hi) in sorted(cluster_apis.items()):
        if key in ADDRESS_APIS or key in WITHDRAWN or address_free(key, lo):
            continue
        vouched = f"vouched for up to v{ADDRESS_FREE[key]}" if key in ADDRESS_FREE else "never examined"
        unexamined[key] = f"{_name(specs, key)} v{lo}-{hi}: {vouched}"
    assert not unexamined, (
        f"the cluster speaks APIs the proxy would forward unread with no one having checked their responses for "
        f"broker addresses (protocol/address_free.py was checked against Kafka {CHECKED_AGAINST}): {unexamined}"
    )


def test_the_proxy_advertises_nothing_unexamined(cluster_apis, proxy):
    """What clients may negotiate through the proxy: rewritten APIs capped at the schemas the proxy decodes them
    with, withdrawn ones absent, every other one capped at the version vouched for."""
    offered = _api_versions(proxy.bootstrap)
    assert not offered.keys() & WITHDRAWN
    assert offered.keys() == cluster_apis.keys() - WITHDRAWN
    for key, (_lo, hi) in offered.items():
        if key in ADDRESS_APIS:
            assert hi <= response_class(key).max_version, f"api {key} offered beyond the schema that rewrites it"
        else:
            assert address_free(key, hi), f"api {key} v{hi} offered unread and unexamined"
    assert cluster_apis[DESCRIBE_QUORUM][1] >= 2 and offered[DESCRIBE_QUORUM][1] == 1  # capped below KIP-853


def test_the_table_holds_against_the_clusters_own_specs(cluster_apis, specs):
    """Walk each response spec the cluster ships, at every version it speaks: nothing vouched for holds a host or
    port; the rewritten APIs hold one exactly where the proxy looks for it (which also shows the walk finds
    addresses when they are there); the withdrawn ones hold one."""
    for key, (lo, hi) in sorted(cluster_apis.items()):
        assert key in specs, f"no response spec for api {key} in the cluster's kafka-clients jar"
        spec = specs[key]
        for v in range(lo, hi + 1):
            found = _address_paths(spec, v)
            if address_free(key, v):
                assert found == [], f"{spec['name']} v{v} is vouched address-free but has {found}"
            if key in ADDRESS_APIS:
                assert bool(found) == may_carry_addresses(key, v), f"{spec['name']} v{v}: {found}"
        if key in WITHDRAWN:
            assert _address_paths(spec, hi), f"{spec['name']} is withdrawn for addresses it does not have"
    assert _address_paths(specs[DESCRIBE_QUORUM], 2) == [("Nodes", "Listeners", "Host"), ("Nodes", "Listeners", "Port")]


def test_describe_quorum_through_the_proxy_names_no_node_address(cluster, fresh_proxy, cluster_apis):
    """DescribeQuorum v2+ (KIP-853) names every controller's listeners: through the proxy a client gets v1 (no
    addresses), and a client that asks for v2 anyway, ignoring ApiVersions, is disconnected, not answered."""
    proxy = fresh_proxy()  # its own: the refused v2 leaves a WARNING line other tests' log counts must not see
    hi = cluster_apis[DESCRIBE_QUORUM][1]
    assert hi >= 2, "the cluster speaks DescribeQuorum v2 (KIP-853)"
    topic = DescribeQuorumRequest.TopicData(
        topic_name="__cluster_metadata", partitions=[DescribeQuorumRequest.TopicData.PartitionData(partition_index=0)]
    )
    wire = KafkaWire(proxy.bootstrap)
    try:
        wire.send(DescribeQuorumRequest(topics=[topic]), 1)
        _, resp = wire.recv()
        assert resp.error_code == 0 and resp.topics[0].partitions[0].current_voters  # v1 works, without Nodes
    finally:
        wire.close()
    wire = KafkaWire(proxy.bootstrap)
    try:
        wire.send(DescribeQuorumRequest(topics=[topic]), hi)
        assert wire.closed_by_peer(), f"DescribeQuorum v{hi} was answered through the proxy"
    finally:
        wire.close()
