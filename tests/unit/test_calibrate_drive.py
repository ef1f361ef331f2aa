"""proxy.cli.calibrate._drive: what one probe reports of its answers. A fake connection: the real brokers' throttled
Fetch answer (empty) cannot be made to come last on purpose, which is the corner this pins."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from proxy.cli.calibrate import ProbeSpec, _drive
from quotas.kinds import FETCH

FULL, EMPTY = 97, 21  # bytes of a Fetch answer of one empty partition, and of a throttled one (no partitions)


class _Conn:
    """Answers every probe Fetch, throttled and empty every other time, the last one throttled."""

    def __init__(self) -> None:
        self.sent = 0
        self.answered = 0
        self.last_request_bytes = 0
        self.last_response_bytes = 0

    def send(self, request: object, version: int) -> None:
        self.sent += 1
        self.last_request_bytes = 90

    async def receive(self, cls: object, version: int) -> SimpleNamespace:
        self.answered += 1
        throttled = self.answered % 2 == 0 or self.answered == self.sent
        self.last_response_bytes = EMPTY if throttled else FULL
        partitions = [] if throttled else [SimpleNamespace(error_code=0)]
        return SimpleNamespace(
            error_code=0, throttle_time_ms=5 if throttled else 0, responses=[SimpleNamespace(partitions=partitions)]
        )


def test_a_probe_reports_its_full_answer_not_the_last_throttled_one():
    """The base calibrate infers is the probe's cost less the size terms of its answer: read from the last answer,
    an empty throttled Fetch, it moved by half the Fetch base between two probes of one calibration (issue 50)."""
    conn = _Conn()
    rates, throttled, req_bytes, resp_bytes = asyncio.run(
        _drive(conn, ProbeSpec("Fetch", FETCH, "empty"), "t", 0.0, 0.05, lambda _line: None)  # type: ignore[arg-type]
    )
    assert conn.answered == conn.sent > 2
    assert conn.last_response_bytes == EMPTY  # the last answer was a throttled one
    assert resp_bytes == FULL and req_bytes == 90
    assert 0 < throttled < conn.answered and sum(rates) > 0
