"""The share-group (KIP-932) message classes, and how the proxy skims, rewrites and streams their responses.

The golden bytes were written by Kafka 4.4's own generated classes (kafka-clients 4.4.0,
``MessageUtil.toByteBufferAccessor``): if a field, its type or its version range in
``protocol/share_schemas/*.json`` were wrong, a decode would fail or re-encode differently.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.share_messages as sm
from protocol.addresses import decode_addressed, rewrite_endpoints_tail, tail_watch_class
from protocol.api_versions import WITHDRAWN, cap_api_versions
from protocol.apis import API_NAMES, Api, api_name, request_class, request_is_flexible, response_class
from protocol.endpoint_apis import ADDRESS_APIS, carries_endpoints_tail, may_carry_addresses
from protocol.session import needs_whole_body
from protocol.skim import layout
from protocol.tail_watch import TailWatch
from protocol.throttle_field import raise_in_body, throttle_offset
from proxy.wire.brokers import BrokerDirectory
from proxy.wire.responses import StreamedTail
from quotas.kinds import CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, charged_at

GOLDEN = {
    ("ShareFetchResponse", 1): (
        "0000000700000000007530020123456789abcdef1122334455667788020000000200060b6e6f74206c65616465720000"
        "000000000300000009005b00000000000000000000004effffffff02aa39dcef0000000000010000018bcfe568000000"
        "018bcfe56801ffffffffffffffffffffffffffff000000021c000000026b0e76616c75652d31001a000202010e76616c"
        "75652d32000200000000000000000000000000000001000100000003000000031162726f6b6572332e696e7465726e61"
        "6c00002387037231000000000103623100002385000000"
    ),
    ("ShareFetchRequest", 1): (
        "0267046d2d3100000003000001f40000000103200000000001f4000001f4020123456789abcdef112233445566778802"
        "000000020200000000000000000000000000000001030102000000020123456789abcdef112233445566778803000000"
        "00000000010000"
    ),
    ("ShareAcknowledgeResponse", 1): (
        "00000004000000020123456789abcdef1122334455667788020000000200060000000001000000040000000200000001"
        "03623100002385000000"
    ),
    ("ShareAcknowledgeRequest", 1): (
        "0267046d2d3100000004020123456789abcdef112233445566778802000000020200000000000000050000000000000007020100000000"
    ),
    ("ShareFetchResponse", 2): (
        "0000000700000000007530020123456789abcdef1122334455667788020000000200060b6e6f74206c65616465720000"
        "000000000300000009005b00000000000000000000004effffffff02aa39dcef0000000000010000018bcfe568000000"
        "018bcfe56801ffffffffffffffffffffffffffff000000021c000000026b0e76616c75652d31001a000202010e76616c"
        "75652d32000200000000000000000000000000000001000100000003000000031162726f6b6572332e696e7465726e61"
        "6c00002387037231000000000103623100002385000000"
    ),
    ("ShareFetchRequest", 2): (
        "0267046d2d3100000003000001f40000000103200000000001f4000001f40101020123456789abcdef11223344556677"
        "8802000000020200000000000000000000000000000001030102000000020123456789abcdef11223344556677880300"
        "000000000000010000"
    ),
    ("ShareAcknowledgeResponse", 2): (
        "0000000400000000003a98020123456789abcdef11223344556677880200000002000600000000010000000400000002"
        "0000000103623100002385000000"
    ),
    ("ShareAcknowledgeRequest", 2): (
        "0267046d2d310000000401020123456789abcdef11223344556677880200000002020000000000000005000000000000"
        "0007020100000000"
    ),
    ("ShareGroupHeartbeatRequest", 1): ("0267046d2d31000000000372310303743103743200"),
    ("ShareGroupHeartbeatResponse", 1): (
        "00000003000000046d2d31000000020000138801020123456789abcdef112233445566778804000000000000000100000002000000"
    ),
    ("ShareGroupDescribeRequest", 1): ("0202670100"),
    ("ShareGroupDescribeResponse", 1): (
        "0000000202000000026707537461626c6500000005000000050773696d706c6502046d2d31000000000502630a2f3130"
        "2e302e302e3102037431020123456789abcdef11223344556677880374310200000000000000800000000000"
    ),
}
"""Kafka 4.4's own encoding of one message per (name, version), hex."""


@pytest.mark.parametrize(("name", "version"), sorted(GOLDEN))
def test_kafkas_own_bytes_decode_and_reencode_identically(name, version):
    cls = getattr(sm, name)
    data = bytes.fromhex(GOLDEN[(name, version)])
    msg = cls.decode(data, version=version)
    assert bytes(msg.encode()) == data
    # Every top-level field is skimmed to exactly the end of the body (the walker the proxy uses).
    assert layout(cls, version, data).end == len(data)


def test_decoded_values_are_kafkas():
    fetch = sm.ShareFetchResponse.decode(bytes.fromhex(GOLDEN[("ShareFetchResponse", 2)]), version=2)
    assert (fetch.throttle_time_ms, fetch.acquisition_lock_timeout_ms) == (7, 30000)
    part = fetch.responses[0].partitions[0]
    assert (part.partition_index, part.error_code, part.error_message) == (2, 6, "not leader")
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (3, 9)
    assert b"value-1" in part.records and b"value-2" in part.records
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [(0, 1, 1)]
    assert [(e.node_id, e.host, e.port, e.rack) for e in fetch.node_endpoints] == [
        (3, "broker3.internal", 9095, "r1"),
        (1, "b1", 9093, None),
    ]
    req = sm.ShareFetchRequest.decode(bytes.fromhex(GOLDEN[("ShareFetchRequest", 2)]), version=2)
    assert (req.group_id, req.member_id, req.share_session_epoch, req.max_records, req.batch_size) == (
        "g",
        "m-1",
        3,
        500,
        500,
    )
    assert (req.share_acquire_mode, req.is_renew_ack) == (1, True)
    assert req.topics[0].partitions[0].acknowledgement_batches[0].acknowledge_types == [1, 2]
    ack = sm.ShareAcknowledgeResponse.decode(bytes.fromhex(GOLDEN[("ShareAcknowledgeResponse", 2)]), version=2)
    assert ack.acquisition_lock_timeout_ms == 15000
    hb = sm.ShareGroupHeartbeatResponse.decode(bytes.fromhex(GOLDEN[("ShareGroupHeartbeatResponse", 1)]), version=1)
    assert (hb.member_id, hb.member_epoch, hb.assignment.topic_partitions[0].partitions) == ("m-1", 2, [0, 1, 2])


@pytest.mark.parametrize("key", [76, 77, 78, 79])
def test_share_apis_are_known_like_any_other(key):
    assert request_class(key).API_KEY == response_class(key).API_KEY == key
    assert api_name(key) == API_NAMES[key].title().replace("_", "")
    assert request_is_flexible(key, 1)
    body = bytearray(response_class(key)().encode(version=1))
    assert throttle_offset(key, 1, body) == 0
    assert raise_in_body(key, 1, body, 250) == 250 and body[:4] == struct.pack(">i", 250)


def test_share_fetch_and_acknowledge_are_address_apis_streamed_with_their_tail():
    assert {Api.SHARE_FETCH, Api.SHARE_ACKNOWLEDGE} <= ADDRESS_APIS
    for key in (Api.SHARE_FETCH, Api.SHARE_ACKNOWLEDGE):
        for version in (1, 2):
            assert may_carry_addresses(key, version) and carries_endpoints_tail(key, version)
            assert not needs_whole_body(key, version)
    assert not may_carry_addresses(Api.SHARE_GROUP_HEARTBEAT, 1)


def test_api_versions_offers_share_apis_capped_at_the_schemas():
    assert Api.SHARE_FETCH not in WITHDRAWN and Api.SHARE_ACKNOWLEDGE not in WITHDRAWN
    from kafka.protocol.metadata import ApiVersionsResponse

    K = ApiVersionsResponse.ApiVersion
    msg = ApiVersionsResponse(
        error_code=0,
        api_keys=[K(api_key=78, min_version=1, max_version=3), K(api_key=79, min_version=1, max_version=2)],
        throttle_time_ms=0,
        version=3,
    )
    caps = {78: response_class(78).max_version, 79: response_class(79).max_version}
    out = ApiVersionsResponse.decode(cap_api_versions(msg.encode(), 3, caps), version=3)
    assert [(k.api_key, k.min_version, k.max_version) for k in out.api_keys] == [(78, 1, 2), (79, 1, 2)]


def _to_proxy(ep):
    return "proxy", 20000 + ep.node_id


def _share_fetch(version: int, records: list[bytes | None], endpoints) -> bytes:
    R = sm.ShareFetchResponse
    topic = R._struct.fields["responses"].array_of.data_class
    part = topic._struct.fields["partitions"].array_of.data_class
    leader = part._struct.fields["current_leader"].data_class
    node = R._struct.fields["node_endpoints"].array_of.data_class
    msg = R(
        throttle_time_ms=0,
        error_code=0,
        acquisition_lock_timeout_ms=30000,
        responses=[
            topic(
                topic_id=None,
                partitions=[
                    part(
                        partition_index=i,
                        error_code=0,
                        acknowledge_error_code=0,
                        current_leader=leader(leader_id=1, leader_epoch=0),
                        records=r,
                        acquired_records=[],
                    )
                    for i, r in enumerate(records)
                ],
            )
        ],
        node_endpoints=[node(node_id=n, host=h, port=p, rack=None) for n, h, p in endpoints],
    )
    return bytes(msg.encode(version=version))


@pytest.mark.parametrize("key", [Api.SHARE_FETCH, Api.SHARE_ACKNOWLEDGE])
def test_whole_body_rewrite_only_when_endpoints_present(key):
    name = "ShareFetchResponse" if key == Api.SHARE_FETCH else "ShareAcknowledgeResponse"
    cls = getattr(sm, name)
    empty = bytes(cls().encode(version=2))
    assert decode_addressed(key, 2, empty) is None
    decoded = decode_addressed(key, 2, bytes.fromhex(GOLDEN[(name, 2)]))
    assert decoded is not None
    out = cls.decode(decoded.encode(_to_proxy), version=2)
    assert all(e.host == "proxy" and e.port == 20000 + e.node_id for e in out.node_endpoints)
    assert len(out.node_endpoints) == len(decoded.endpoints()) > 0


def test_tail_watch_stops_where_node_endpoints_begins():
    body = bytes.fromhex(GOLDEN[("ShareFetchResponse", 2)])
    start = layout(sm.ShareFetchResponse, 2, body).fields["node_endpoints"][0]
    watch = TailWatch(tail_watch_class(Api.SHARE_FETCH), 2)
    at = None
    for i in range(len(body)):  # byte by byte: every split of every field
        at = watch.feed(body[i : i + 1])
        if at is not None:
            assert i + at == start
            break
    assert at is not None


@pytest.mark.parametrize(("proxy_host", "kept"), [("p", 2), ("proxy.example.com", 1), ("x" * 40, 0)])
def test_tail_rewrite_keeps_the_length(proxy_host, kept):
    body = bytes.fromhex(GOLDEN[("ShareFetchResponse", 1)])
    start = layout(sm.ShareFetchResponse, 1, body).fields["node_endpoints"][0]
    section = body[start:]
    new, seen = rewrite_endpoints_tail(Api.SHARE_FETCH, 1, section, lambda ep: (proxy_host, 30000 + ep.node_id))
    assert len(new) == len(section)
    assert [e.host for e in seen] == ["broker3.internal", "b1"]
    out = sm.ShareFetchResponse.decode(body[:start] + new, version=1)
    assert [(e.node_id, e.host, e.port) for e in out.node_endpoints] == [
        (3, proxy_host, 30003),
        (1, proxy_host, 30001),
    ][:kept]
    assert out.responses == sm.ShareFetchResponse.decode(body, version=1).responses
    assert rewrite_endpoints_tail(Api.SHARE_FETCH, 1, b"\x01\x00", _to_proxy) is None


async def _no_listener(node_id: int, port: int) -> int:
    raise AssertionError("StreamedTail must not start listeners itself")


def _directory(known):
    d = BrokerDirectory("proxy.example", None, _no_listener)
    for node in known:
        d.upstream[node] = ("127.0.0.1", 9000 + node)
        d.ports[node] = 40000 + node
    return d


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(st.one_of(st.none(), st.binary(max_size=500)), max_size=4),
    endpoints=st.lists(
        st.sampled_from([(1, "broker-1.internal", 9092), (2, "broker-2.internal", 9092), (5, "b5", 9)]),
        max_size=3,
        unique=True,
    ),
    version=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_streamed_share_fetch_comes_out_whole_with_addresses_rewritten(records, endpoints, version, data):
    body = _share_fetch(version, records, endpoints)
    frame = struct.pack(">i", len(body) + 5) + struct.pack(">i", 7) + b"\x00" + body
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(frame) - 1), max_size=8))))
    pieces = [memoryview(frame)[a:b] for a, b in zip([0, *cuts], [*cuts, len(frame)], strict=True)]
    tail = StreamedTail(Api.SHARE_FETCH, version, 9, _directory(known=[1, 2]))
    tail_at = 9 + layout(sm.ShareFetchResponse, version, body).fields["node_endpoints"][0]
    out: list = []
    for i, piece in enumerate(pieces):
        tail.pass_on([piece], i == len(pieces) - 1, out)
        if i < len(pieces) - 1:  # nothing but node_endpoints and the tagged section is ever held back
            assert sum(map(len, out)) == min(tail_at, sum(map(len, pieces[: i + 1])))
    result = b"".join(bytes(p) for p in out)
    assert len(result) == len(frame) and result[:9] == frame[:9]
    decoded = sm.ShareFetchResponse.decode(result[9:], version=version)
    assert [r.records for r in decoded.responses[0].partitions] == records
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [
        (n, "proxy.example", 40000 + n) for n, _, _ in endpoints if n in (1, 2)
    ][: len(decoded.node_endpoints)]
    assert [(e.node_id, e.host) for e in tail.missing] == [(n, h) for n, h, _ in endpoints if n == 5]
    assert all(b"internal" not in bytes(p) for p in out)


def test_share_fetch_charges_consumer_byte_rate_without_replica_exemption():
    active = frozenset({CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE})
    share = {k.key: k for k in charged_at(Api.SHARE_FETCH, "response", active)}
    fetch = {k.key: k for k in charged_at(Api.FETCH, "response", active)}
    assert set(share) == set(fetch) == {CONSUMER_BYTE_RATE}
    assert {k.key for k in charged_at(Api.SHARE_FETCH, "request", active)} == {REQUEST_PERCENTAGE}  # on arrival
    assert fetch[CONSUMER_BYTE_RATE].exempt_replicas
    assert not share[CONSUMER_BYTE_RATE].exempt_replicas  # a ShareFetch's group id is no replica id
    assert CONSUMER_BYTE_RATE not in {k.key for k in charged_at(Api.SHARE_ACKNOWLEDGE, "response", active)}
