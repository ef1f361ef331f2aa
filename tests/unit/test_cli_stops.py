"""What ends a cluster tool (``quotas``, ``calibrate``): one stderr line naming the address, the exit status by kind."""

from __future__ import annotations

import asyncio

import pytest

from proxy.cli.quota_admin import STOPS, Refused, Security, UsageError, stopped

SASL = Security(protocol="SASL_SSL")


@pytest.mark.parametrize(
    ("exc", "status", "says"),
    [
        (UsageError("--percent 0: expected a share"), 2, "tool: --percent 0: expected a share"),
        (KeyboardInterrupt(), 130, "tool: interrupted"),
        (Refused("CLUSTER_AUTHORIZATION_FAILED"), 1, "tool: h:9092: CLUSTER_AUTHORIZATION_FAILED"),
        (TimeoutError(), 1, "tool: h:9092: no answer within 35 s (is it a Kafka listener, and is its security protocol "
         "SASL_SSL?)"),
        (asyncio.IncompleteReadError(b"", 4), 1, "tool: h:9092: the connection was closed before an "
         "answer (this tool used SASL_SSL"),
        (ConnectionRefusedError(111, "Connection refused"), 1, "tool: h:9092: Connection refused"),
    ],
)  # fmt: skip
def test_each_stop_is_one_line_with_its_status(exc, status, says, capsys):
    assert isinstance(exc, STOPS)  # run() catches it: no traceback
    assert stopped("tool", "h:9092", exc, SASL, 35.0) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(says), err


def test_before_the_security_is_read_the_hint_names_plaintext(capsys):
    assert stopped("tool", "h:9092", ConnectionResetError(), None, 30.0) == 1
    assert "this tool used PLAINTEXT" in capsys.readouterr().err
