"""The per-API request and latency counters a connection bumps, as the metrics endpoint exports them.

A real ``proxy.wire.connection.Connection`` with the real policy and stand-in transports
(``tests.harness.connection_rig``): Produce round trips, then a Metadata request, so the API the connection
remembers changes.
"""

from __future__ import annotations

import asyncio

from kafka.protocol.metadata import MetadataRequest

from proxy.metrics import _Collector
from tests.harness.connection_rig import ConnectionRig


def _metadata_frame(corr: int) -> bytes:
    req = MetadataRequest(topics=[], allow_auto_topic_creation=False, version=4)
    req.with_header(correlation_id=corr, client_id="app")
    return bytes(req.encode(header=True, framed=True))


def test_requests_and_latencies_are_counted_per_api_and_exported():
    async def run() -> ConnectionRig:
        h = ConnectionRig({})
        for corr in (1, 2, 3):
            h.round_trip(corr)
        h.client_side.data_received(_metadata_frame(4))  # forwarded; its answer never comes
        return h

    h = asyncio.run(run())
    stats = h.conn.services.stats
    assert stats.by_api["Produce"].requests == 3 and stats.by_api["Produce"].latency_count == 3
    assert stats.by_api["Metadata"].requests == 1 and stats.by_api["Metadata"].latency_count == 0
    assert stats.by_api["Produce"].latency_sum >= 0.0

    collector = _Collector(stats, lambda: 1, list, dict)
    families = {f.name: f for f in collector.collect()}
    requests = {s.labels["api"]: s.value for s in families["ktp_requests"].samples if s.name.endswith("_total")}
    assert requests == {"Produce": 3, "Metadata": 1}
    latency = {(s.name, s.labels["api"]): s.value for s in families["ktp_request_latency_seconds"].samples}
    assert latency[("ktp_request_latency_seconds_count", "Produce")] == 3
    assert ("ktp_request_latency_seconds_count", "Metadata") not in latency  # no answer yet: no sample
