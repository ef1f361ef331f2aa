"""Which of the project's files one Produce request walks through, client socket to upstream socket and back.

Why: the glue should be followable; this counts, by tracing every Python call (``sys.setprofile``), the project
files whose code runs for one Produce v11 request and its response once the connection is warm (the first
request compiles and caches per-version tables; the second shows the steady path). The connection is the real
``proxy.connection.Connection`` with the real policy; only the two sockets are stand-ins (transports that
record what is written), so no broker is needed.

    .venv/bin/python -m bench.produce_walk
"""

from __future__ import annotations

import asyncio
import struct
import sys
from pathlib import Path

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import ProxyConfig
from protocol.api_versions import decode_caps
from protocol.frames import RequestBytesPool
from protocol.headers import encode_response_header
from proxy.brokers import BrokerDirectory
from proxy.connection import Connection, Services
from proxy.policy import Policy
from proxy.responses import TopicIds
from proxy.server import DECODED_APIS
from proxy.stats import Stats

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "protocol", "quotas", "mute", "config")
EVERY_QUOTA = {"producer_byte_rate": 10**12, "consumer_byte_rate": 10**12, "request_percentage": 10**6,
               "controller_mutation_rate": 10**6, "producer_ids_rate": 10**9}
"""Every quota kind configured for the client's user, none binding."""
_SIZE = struct.Struct(">i")
VERSION = 11
"""Produce version of the walk: what Kafka 4.x clients send (v10+ responses may carry node_endpoints)."""


class Transport:
    """Stands in for a socket's transport: records what is written."""

    def __init__(self, peer=("127.0.0.1", 50000)) -> None:
        self.written: list[bytes] = []
        self.peer = peer
        self.protocol = None
        """What the loop would hand reads to (``set_protocol``)."""

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def writelines(self, pieces) -> None:
        self.written.append(b"".join(bytes(p) for p in pieces))

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return self.peer if name == "peername" else default

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


def _produce(corr: int, records: int = 1, value_bytes: int = 100) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=7, producer_epoch=0, base_sequence=corr)
    for i in range(records):
        b.append(i, b"k", b"v" * value_bytes)
    b.close()
    TD = ProduceRequest.TopicProduceData
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=1000, version=VERSION, topic_data=[
        TD(name="t", partition_data=[TD.PartitionProduceData(index=0, records=b.buffer())])])
    req.with_header(correlation_id=corr, client_id="app")
    body = req.encode(header=True, framed=False)
    return _SIZE.pack(len(body)) + body


def _answer(corr: int, error_message: str | None = None) -> bytes:
    P = ProduceResponse._struct.fields["responses"].array_of.data_class
    Q = P.fields["partition_responses"].array_of.data_class
    body = ProduceResponse(version=VERSION, throttle_time_ms=0, responses=[
        P(version=VERSION, name="t", partition_responses=[Q(version=VERSION, index=0, error_code=0, base_offset=corr,
                                                      log_append_time_ms=-1, log_start_offset=0, record_errors=[],
                                                      error_message=error_message)])]).encode()
    head = encode_response_header(corr, True)
    return _SIZE.pack(len(head) + len(body)) + head + body


def _config(quotas: dict) -> ProxyConfig:
    entities = [{"entity": {"user": "ANONYMOUS"}, "quotas": quotas}] if quotas else []
    return ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                                       "quotas": {"entities": entities}})


class Harness:
    """One real Connection with the real policy and stand-in transports; :meth:`round_trip` sends one Produce
    and its answer through it."""

    def __init__(self, quotas: dict, records: int = 1, value_bytes: int = 100) -> None:
        config = _config(quotas)
        stats = Stats()

        async def no_listener(node_id: int, port: int) -> int:
            raise AssertionError("no listener expected")

        services = Services(config, stats, Policy(config, stats), RequestBytesPool(1 << 28),
                            BrokerDirectory("127.0.0.1", None, no_listener), TopicIds(),
                            decode_caps(DECODED_APIS), lambda conn, ip: None, lambda conn: None,
                            lambda conn: None)
        self.conn = Connection(services, [("127.0.0.1", 9)], "broker 1")
        self.client, self.upstream = Transport(), Transport()
        self.conn.client.connection_made(self.client)
        # As if the broker connection were up: the loop calls what the connection asked for (its chunk reader).
        self.upstream.protocol = self.conn.upstream_chunks
        self.conn.upstream_chunks.connection_made(self.upstream)
        self.records, self.value_bytes = records, value_bytes

    def round_trip(self, corr: int, request: bytes | None = None, answer: bytes | None = None) -> None:
        conn = self.conn
        conn.client.data_received(request or _produce(corr, self.records, self.value_bytes))
        answer = answer or _answer(corr)
        if conn.buffered_reads:
            buf = conn.upstream.get_buffer(len(answer))
            buf[:len(answer)] = answer
            conn.upstream.buffer_updated(len(answer))
        else:  # as uvloop hands a read to a plain protocol: the read's bytes
            self.upstream.protocol.data_received(answer)
        if self.client.written and self.upstream.written:
            self.client.written.clear()
            self.upstream.written.clear()
        else:
            raise AssertionError("the request or its answer did not get through")


async def walk(quotas: dict) -> list[str]:
    harness = Harness(quotas)
    files: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            try:
                rel = Path(frame.f_code.co_filename).resolve().relative_to(ROOT)
            except ValueError:
                return
            if rel.parts[0] in PACKAGES:
                files.add(str(rel))

    harness.round_trip(1)  # warm: per-version tables compiled once
    sys.setprofile(profile)
    try:
        harness.round_trip(2)
    finally:
        sys.setprofile(None)
    harness.conn.close()
    return sorted(files)


def main() -> None:
    for label, quotas in (("no quota", {}), ("every quota kind configured, none binding", EVERY_QUOTA)):
        files = asyncio.run(walk(quotas))
        print(f"{label}: {len(files)} files")
        for f in files:
            print(f"  {f}")


if __name__ == "__main__":
    main()
