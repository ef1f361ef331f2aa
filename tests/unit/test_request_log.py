"""tests.harness.request_log, the reading of the brokers' request log that bench/broker_request_log.py summarises:
lines as Kafka 4.4's kafka.request.logger writes them (trimmed of fields the reader ignores), so a change in what
it picks out fails here, not in a bench."""

from __future__ import annotations

import json

from tests.harness.request_log import parse_lines, summary


def _line(ts: str, client_id: str, api: str, local_ms: float, records: list[int] | None = None) -> str:
    response: dict = {"throttleTimeMs": 0}
    if records is not None:
        parts = [{"partitionIndex": i, "errorCode": 0, "recordsSizeInBytes": n} for i, n in enumerate(records)]
        response["responses"] = [{"topicId": "rY2qTh0JS_iqysIKWwbo5Q", "partitions": parts}]
    record = {
        "isForwarded": False,
        "requestHeader": {"requestApiKey": 1, "requestApiVersion": 16, "correlationId": 3, "clientId": client_id,
                          "requestApiKeyName": api},
        "request": {"maxWaitMs": 500},
        "response": response,
        "totalTimeMs": 3.402, "requestQueueTimeMs": 0.866, "localTimeMs": local_ms, "remoteTimeMs": 0.363,
    }  # fmt: skip
    return f"[{ts}] DEBUG Completed request:{json.dumps(record, separators=(',', ':'))} (kafka.request.logger)\n"


def test_picks_the_prefixed_clients_calls_by_api_with_their_handler_time_and_records():
    lines = [
        _line("2026-11-28 13:26:22,648", "rl1-tail", "FETCH", 1.852, [84]),
        _line("2026-11-28 13:26:22,900", "rl1-tail", "FETCH", 0.021, [100, 16]),
        _line("2026-11-28 13:26:23,001", "rl1-tail", "FETCH", 0.030, []),
        _line("2026-11-28 13:26:23,002", "rl1-tail", "HEARTBEAT", 0.5),
        _line("2026-11-28 13:26:23,003", "rq-feeder", "PRODUCE", 9.0),
        "[2026-11-28 13:26:23,004] INFO [Broker id=1] something else (kafka.server.ReplicaManager)\n",
        _line("2026-11-28 13:26:23,005", "rl1-tail", "FETCH", 0.5)[:120] + "\n",  # truncated at rotation
    ]
    calls = parse_lines(lines, "rl1-")
    assert set(calls) == {("rl1-tail", "FETCH"), ("rl1-tail", "HEARTBEAT")}
    fetch = calls[("rl1-tail", "FETCH")]
    assert fetch.local_ms == [1.852, 0.021, 0.030]
    assert fetch.records_bytes == [84, 116, 0]
    assert dict(fetch.per_second) == {"2026-11-28 13:26:22": 2, "2026-11-28 13:26:23": 1}


def test_summary_gives_the_tail_beside_the_median_and_a_timeline_per_client():
    lines = [_line(f"2026-11-28 13:26:{20 + i // 3:02d},000", "rl1-p", "PRODUCE", 0.01) for i in range(9)]
    lines.append(_line("2026-11-28 13:26:23,000", "rl1-p", "PRODUCE", 20.0))
    text = "\n".join(summary(parse_lines(lines, "rl1-"), {"PRODUCE"}))
    assert "| rl1-p | PRODUCE | 10 | 0.010 | 2.009 |" in text
    assert "| 20.00 |" in text
    assert "- rl1-p PRODUCE, a second each: 3 3 3 1" in text
