"""The proxy streams a big response only when nothing in it can be rewritten but its closing tagged
section: whatever ``protocol.session.needs_whole_body`` lets through must be a response ``inspect_response`` leaves
alone, or one (Fetch v16+, Produce v10+) whose addresses all lie in that section."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.apis import REQUESTS, Api, response_header_is_flexible
from protocol.endpoint_apis import carries_endpoints_tail
from protocol.headers import RequestHeader
from protocol.inflight import Pending
from protocol.session import needs_whole_body
from proxy.wire.brokers import BrokerDirectory
from proxy.wire.responses import TopicIds, inspect_response


async def _no_listener(node_id: int, port: int) -> int:
    raise AssertionError("a streamed response must never need a listener")


@pytest.mark.parametrize(
    ("api_key", "version", "whole"),
    [
        (Api.FETCH, 11, False),
        (Api.FETCH, 15, False),
        (Api.FETCH, 16, False),
        (Api.FETCH, 18, False),
        (Api.PRODUCE, 9, False),
        (Api.PRODUCE, 10, False),
        (Api.METADATA, 0, True),
        (Api.FIND_COORDINATOR, 4, True),
        (Api.DESCRIBE_CLUSTER, 0, True),
        (Api.API_VERSIONS, 3, True),
        (Api.SASL_HANDSHAKE, 0, True),
        (Api.SASL_HANDSHAKE, 1, False),
        (Api.SASL_AUTHENTICATE, 2, False),
        (12345, 0, False),
    ],
)
def test_which_responses_must_be_whole(api_key, version, whole):
    assert needs_whole_body(api_key, version) is whole


@settings(max_examples=300)
@given(st.sampled_from(sorted(REQUESTS)), st.integers(0, 20), st.binary(max_size=300))
def test_streamable_responses_are_never_rewritten(api_key, version, body):
    if needs_whole_body(api_key, version) or carries_endpoints_tail(api_key, version):
        return  # the tagged-section case is tests/unit/test_tail_watch.py
    directory = BrokerDirectory("127.0.0.1", None, _no_listener)
    pending = Pending(RequestHeader(api_key, version, 1, None, 0), 0.0)
    header = b"\x00\x00\x00\x01" + (b"\x00" if response_header_is_flexible(api_key, version) else b"")
    try:
        result = inspect_response(pending, header + body, directory, TopicIds(), {})
    except (ValueError, IndexError, struct.error):
        pytest.fail("the body of a streamable response was parsed")
    assert result is None
