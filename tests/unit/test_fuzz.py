"""No byte string makes the parsers fail other than with the error family the proxy turns into a closed connection
(``protocol.errors.ProtocolError``): a struct.error or IndexError out of a walk is a traceback (issue #35)."""

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse

from protocol.addresses import decode_addressed
from protocol.errors import ProtocolError
from protocol.headers import parse_request_header
from protocol.inflight import expects_response
from protocol.skim import layout, top_level_tags

EXPECTED = (ProtocolError,)


@settings(max_examples=500)
@given(st.binary(max_size=64), st.sampled_from([0, 1, 3, 10, 18, 19, 36, 76]), st.integers(0, 20))
def test_request_header_and_acks(tail, api_key, version):
    frame = struct.pack(">hh", api_key, version) + tail
    try:
        header = parse_request_header(frame)
        expects_response(frame, header)
    except EXPECTED:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from([(FetchResponse, 16), (FetchResponse, 4), (ProduceResponse, 10)]))
def test_skim_random_bodies(body, cls_version):
    cls, version = cls_version
    try:
        lay = layout(cls, version, body)
        assert lay.end <= len(body)
    except EXPECTED:
        with pytest.raises(EXPECTED):
            top_level_tags(cls, version, body)
    else:
        assert top_level_tags(cls, version, body) == tuple(lay.tags)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from([(3, 12), (10, 4), (60, 1), (1, 16), (0, 11)]))
def test_address_decoding_random_bodies(body, key_version):
    key, version = key_version
    with contextlib.suppress(*EXPECTED):
        decode_addressed(key, version, body)
