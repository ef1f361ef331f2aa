"""The brokers' request log (``kafka.request.logger`` at DEBUG: ``KafkaCluster(request_log=True)``) read back:
each completed request's client id, API, handler time and Fetch records bytes, as Kafka 4.4 writes them."""

from __future__ import annotations

import collections
import json
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

MARK = "Completed request:"
LOG_NAME = {"Produce": "PRODUCE", "Fetch": "FETCH", "ListOffsets": "LIST_OFFSETS"}
"""bench.request_quota.API_OF's names as the request log spells them."""


@dataclass
class Calls:
    """One client id's completed requests of one API, as its brokers logged them."""

    local_ms: list[float] = field(default_factory=list)
    records_bytes: list[int] = field(default_factory=list)
    per_second: collections.Counter[str] = field(default_factory=collections.Counter)


def parse_lines(lines: Iterable[str], prefix: str) -> dict[tuple[str, str], Calls]:
    """The request log lines of client ids starting with ``prefix``, by (client id, API name). A line that is
    not a complete request-log record (a rotated or truncated one) is skipped."""
    out: dict[tuple[str, str], Calls] = collections.defaultdict(Calls)
    for line in lines:
        i = line.find(MARK)
        if i < 0 or f'"clientId":"{prefix}' not in line:
            continue
        j = line.rfind("} (kafka.request.logger)")
        try:
            d = json.loads(line[i + len(MARK) : j + 1])
            h = d["requestHeader"]
            c = out[(h["clientId"], h["requestApiKeyName"])]
            c.local_ms.append(float(d["localTimeMs"]))
        except (ValueError, KeyError, TypeError):
            continue
        c.records_bytes.append(sum(_records_bytes(d.get("response") or {})))
        c.per_second[line[1:20]] += 1  # "[2026-11-28 13:26:18,582]": to the second
    return out


def _records_bytes(response: dict) -> Iterator[int]:
    for t in response.get("responses", []):
        for p in t.get("partitions", []):
            n = p.get("recordsSizeInBytes")
            if isinstance(n, int):
                yield n


def summary(calls: dict[tuple[str, str], Calls], apis: set[str]) -> list[str]:
    """A table row per (client id, API) among ``apis``, then each client's requests a second."""
    rows = [
        "| client id | API | requests | handler ms p50 | mean | p99 | max | mean records bytes |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    timelines = []
    for (cid, api), c in sorted(calls.items()):
        if api not in apis or not c.local_ms:
            continue
        t = sorted(c.local_ms)
        rows.append(
            f"| {cid} | {api} | {len(t):,} | {statistics.median(t):.3f} | {statistics.mean(t):.3f} | "
            f"{t[int(0.99 * (len(t) - 1))]:.3f} | {t[-1]:.2f} | {statistics.mean(c.records_bytes):.0f} |"
        )
        timelines.append(f"- {cid} {api}, a second each: " + " ".join(str(n) for _, n in sorted(c.per_second.items())))
    return rows + [""] + timelines
