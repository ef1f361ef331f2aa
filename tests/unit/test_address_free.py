"""``protocol.address_free`` agrees with the proxy's own tables and with kafka-python's copy of Kafka's specs.

Why: the table is written by hand from apache/kafka's message JSON; these checks catch it drifting from what the
proxy rewrites (``ADDRESS_APIS``), withdraws (``WITHDRAWN``) or decodes (``DECODED_APIS``), and cross-check
every claim against the second copy of the specs on the machine, kafka-python's schemas. The live cluster's own
specs and ApiVersions are checked in ``tests/integration/test_api_coverage.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol.address_free import ACL_HOST_APIS, ADDRESS_FREE, NOT_BROKER_ADDRESSES, address_free
from protocol.api_versions import WITHDRAWN, decode_caps
from protocol.apis import API_NAMES, RESPONSES, Api
from protocol.endpoint_apis import ADDRESS_APIS, may_carry_addresses
from proxy.server import DECODED_APIS


def _paths(fields, version: int, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Spec names (``("Brokers", "Host")``) of every field on the wire at ``version``, at any depth."""
    for f in fields:
        if not f.for_version_q(version):
            continue
        here = (*path, f._name)
        yield here
        if f.fields:
            yield from _paths(f.fields.values(), version, here)


def broker_address_fields(api_key: int, version: int) -> list[tuple[str, ...]]:
    """Fields of kafka-python's response schema that hold a host or port, minus the documented non-broker ones."""
    cls = RESPONSES[api_key]
    out = []
    for p in _paths(cls._struct.fields.values(), version):
        if p[-1] not in ("Host", "Port"):
            continue
        if NOT_BROKER_ADDRESSES & set(p) or (api_key in ACL_HOST_APIS and p[-1] == "Host"):
            continue
        out.append(p)
    return out


def _versions(api_key: int) -> range:
    cls = RESPONSES[api_key]
    return range(getattr(cls, "min_version", 0), cls.max_version + 1)


def test_address_free_is_disjoint_from_what_the_proxy_rewrites_or_withdraws():
    assert not set(ADDRESS_FREE) & ADDRESS_APIS
    assert not set(ADDRESS_FREE) & WITHDRAWN
    assert not ADDRESS_APIS & WITHDRAWN


def test_every_api_the_proxy_names_is_classified():
    unclassified = {name for key, name in API_NAMES.items() if key not in ADDRESS_APIS | WITHDRAWN | set(ADDRESS_FREE)}
    assert not unclassified


def test_every_version_the_proxy_lets_clients_negotiate_of_a_decoded_api_was_checked():
    """A decoded API is capped at kafka-python's schema (``decode_caps``); every version up to that cap that
    the proxy does not rewrite must be vouched for, or a kafka-python upgrade would open an unchecked one."""
    caps = decode_caps(DECODED_APIS)
    unchecked = {
        API_NAMES.get(k, str(k)): (cap, ADDRESS_FREE.get(k))
        for k, cap in caps.items()
        if k not in ADDRESS_APIS and not address_free(k, cap)
    }
    assert not unchecked


@pytest.mark.parametrize("api_key", sorted(k for k in RESPONSES if k in ADDRESS_FREE))
def test_kafka_pythons_schemas_show_no_broker_address_where_the_table_vouches(api_key):
    for v in _versions(api_key):
        if address_free(api_key, v):
            assert broker_address_fields(api_key, v) == [], f"api {api_key} v{v}"


@pytest.mark.parametrize("api_key", sorted(ADDRESS_APIS))
def test_kafka_pythons_schemas_put_addresses_exactly_where_the_proxy_rewrites(api_key):
    """The schema walk is the one used above; here it must find the addresses the proxy knows of, version by
    version (Produce only from v10, Fetch from v16), so an empty walk cannot pass the test above by accident."""
    seen = {v: bool(broker_address_fields(api_key, v)) for v in _versions(api_key)}
    assert seen == {v: may_carry_addresses(api_key, v) for v in seen}


def test_describe_quorum_is_vouched_for_only_before_its_listeners():
    """KIP-853 added ``Nodes[].Listeners`` (controller host and port) to DescribeQuorum v2."""
    assert broker_address_fields(55, 1) == []
    assert broker_address_fields(55, 2) == [("Nodes", "Listeners", "Host"), ("Nodes", "Listeners", "Port")]
    assert address_free(55, 1) and not address_free(55, 2)


def test_address_free_lookup():
    assert address_free(Api.CREATE_TOPICS, 7)
    assert not address_free(Api.CREATE_TOPICS, 8)  # newer than checked: unexamined, not address-free
    assert not address_free(Api.METADATA, 0)  # rewritten, never vouched for
    assert not address_free(10_000, 0)
