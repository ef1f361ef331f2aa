"""What a client sends never grows the proxy's state or label sets without bound, and never reaches a log line
unescaped; malformed bodies raise the one protocol error family (a WARNING and a close, not a traceback)."""

from __future__ import annotations

import random
import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.quota_sources import QuotaSources
from protocol import apis, mutations, throttle_field
from protocol.errors import MalformedRequest, ProtocolError
from protocol.frames import FrameError
from protocol.headers import HeaderError
from protocol.sasl_identity import SaslSequenceError
from protocol.text import printable
from proxy.rules import client_quota_api
from quotas.entities import QuotaStore
from tests.harness.request_bodies import BODIES
from tests.support import REPO

OPERATIONS = (REPO / "docs" / "operations.md").read_text()


def test_caches_keyed_on_client_headers_stay_bounded():
    rng = random.Random(7)
    for _ in range(100_000):
        key, version = rng.randrange(-32768, 32768), rng.randrange(-32768, 32768)
        apis.request_is_flexible(key, version)
        apis.response_header_is_flexible(key, version)
        apis.api_name(key)
        throttle_field.throttle_slot(key, version)
    for fn in (apis.request_is_flexible, apis.response_header_is_flexible, apis.api_name, throttle_field.throttle_slot):
        assert fn.cache_info().currsize <= 4096, fn


def test_metric_labels_come_from_a_fixed_vocabulary():
    assert apis.api_label(0) == "Produce" and apis.api_label(12345) == "unknown" and apis.api_label(-1) == "unknown"


# The ``reason`` vocabulary of ktp_connection_errors_total, as docs/operations.md lists it for operators.
_DOCUMENTED = re.search(r"`ktp_connection_errors_total\{reason\}` \(a fixed vocabulary:\s*(.*?)\)", OPERATIONS, re.S)


def _family(cls: type[ProtocolError]) -> list[type[ProtocolError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _family(sub)
    return out


def test_a_closed_connection_is_counted_by_the_error_class_not_its_message():
    """A message a client shaped (or a reworded one) cannot move a metric: the kind is the class's."""
    assert FrameError("malformed request: SASL").kind == "bad_frame"
    assert SaslSequenceError("request stream: malformed").kind == "sasl"
    assert MalformedRequest("SASL request stream").kind == "malformed_request"
    assert HeaderError("malformed request stream").kind == "protocol"


def test_every_connection_error_kind_is_one_the_operations_page_lists():
    assert _DOCUMENTED, "docs/operations.md no longer lists ktp_connection_errors_total's reasons"
    documented = set(re.findall(r"`(\w+)`", _DOCUMENTED.group(1)))
    raised = {cls.kind for cls in _family(ProtocolError)}
    closed = {
        kind
        for source in ("wire/connection.py", "wire/connection_life.py", "server.py")
        for kind in re.findall(r"\.close\(.*, \"(\w+)\"\)$", (REPO / "proxy" / source).read_text(), re.M)
    }
    assert {"bad_frame", "sasl", "malformed_request", "protocol"} <= raised
    assert {"internal", "bad_response", "tls", "broker_unreachable"} <= closed
    assert raised | closed | {"request_timeout", "broker_timeout"} <= documented


@given(st.text(max_size=400))
def test_printable_escapes_everything_a_client_could_use_to_forge_a_line(text):
    out = printable(text)
    assert out.isascii() and out.isprintable() and len(out) <= 200
    if text.isascii() and text.isprintable() and "\\" not in text and len(text) <= 200:
        assert out == text


def test_printable_examples():
    assert printable("PLAIN\n2026-01-01 ERROR forged") == "PLAIN\\n2026-01-01 ERROR forged"
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("x" * 500).endswith("...") and len(printable("x" * 500)) == 200


@pytest.mark.parametrize("seed", range(4))
def test_mutated_bodies_of_decoded_apis_raise_only_protocol_errors(seed):
    rng = random.Random(seed)
    for _ in range(5_000):
        key, version, body = rng.choice(BODIES)
        b = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            if op == 0 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 1 and b:
                del b[rng.randrange(len(b)) :]
            elif op == 2:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
            elif len(b) > 4 and rng.random() < 0.5:
                i = rng.randrange(len(b) - 3)
                b[i : i + 4] = struct.pack(">i", -1)  # a null array or string where the schema has none
            elif len(b) > 2:
                i = rng.randrange(len(b) - 1)
                b[i : i + 2] = struct.pack(">h", rng.choice([-1, 0x7FFF, -2, 1000]))
        try:
            if key in mutations.MUTATION_APIS:
                mutations.parse_request(key, version, bytes(b))
            elif key == 48:
                client_quota_api.describe(QuotaSources(QuotaStore(), None), bytes(b), version, "a", frozenset("a"))
            else:
                client_quota_api.alter(QuotaSources(QuotaStore(), None), bytes(b), version, "a", frozenset("a"))
        except ProtocolError:
            pass
