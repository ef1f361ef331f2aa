"""Which of the project's files one Produce request walks through, client socket to upstream socket and back.

Why: the glue should be followable; this counts, by tracing every Python call (``sys.setprofile``), the project
files whose code runs for one Produce v9 request and its response once the connection is warm (the first
request compiles and caches per-version tables; the second shows the steady path). The connection is the real
``proxy.connection.Connection`` with the real policy; only the two sockets are stand-ins (transports that
record what is written), so no broker is needed.

    .venv/bin/python -m bench.produce_walk
"""

from __future__ import annotations

import asyncio
import struct
import sys
import uuid
from pathlib import Path

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import ProxyConfig
from protocol.api_versions import decode_caps
from protocol.frames import RequestBytesPool
from protocol.headers import encode_response_header
from proxy.brokers import BrokerDirectory
from proxy.connection import Connection, Services
from proxy.metrics import Stats
from proxy.policy import Policy
from proxy.responses import TopicIds
from proxy.server import DECODED_APIS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "protocol", "quotas", "mute", "config")
_SIZE = struct.Struct(">i")


class Transport:
    """Stands in for a socket's transport: records what is written."""

    def __init__(self, peer=("127.0.0.1", 50000)) -> None:
        self.written: list[bytes] = []
        self.peer = peer

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def writelines(self, pieces) -> None:
        self.written.append(b"".join(bytes(p) for p in pieces))

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return self.peer if name == "peername" else default

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


def _produce(corr: int) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=7, producer_epoch=0, base_sequence=corr)
    b.append(0, b"k", b"v" * 100)
    b.close()
    TD = ProduceRequest.TopicProduceData
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=1000, version=9, topic_data=[
        TD(name="t", partition_data=[TD.PartitionProduceData(index=0, records=b.buffer())])])
    req.with_header(correlation_id=corr, client_id="app")
    body = req.encode(header=True, framed=False)
    return _SIZE.pack(len(body)) + body


def _answer(corr: int) -> bytes:
    P = ProduceResponse._struct.fields["responses"].array_of.data_class
    Q = P.fields["partition_responses"].array_of.data_class
    body = ProduceResponse(version=9, throttle_time_ms=0, responses=[
        P(version=9, name="t", partition_responses=[Q(version=9, index=0, error_code=0, base_offset=corr,
                                                      log_append_time_ms=-1, log_start_offset=0, record_errors=[],
                                                      error_message=None)])]).encode()
    head = encode_response_header(corr, True)
    return _SIZE.pack(len(head) + len(body)) + head + body


def _config(quotas: dict) -> ProxyConfig:
    entities = [{"entity": {"user": "ANONYMOUS"}, "quotas": quotas}] if quotas else []
    return ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                                       "quotas": {"entities": entities}})


async def walk(quotas: dict) -> list[str]:
    config = _config(quotas)
    stats = Stats()

    async def no_listener(node_id: int, port: int) -> int:
        raise AssertionError("no listener expected")

    services = Services(config, stats, Policy(config, stats), RequestBytesPool(1 << 28),
                        BrokerDirectory("127.0.0.1", None, no_listener), TopicIds(),
                        decode_caps(DECODED_APIS), lambda ip: None, lambda ip: None)
    conn = Connection(services, [("127.0.0.1", 9)], "broker 1")
    client, upstream = Transport(), Transport()
    conn.client.connection_made(client)
    conn.upstream.transport = upstream  # as if the broker connection were up

    def one(corr: int, traced: set[str] | None) -> None:
        def profile(frame, event, arg):
            if event == "call":
                path = Path(frame.f_code.co_filename)
                try:
                    rel = path.resolve().relative_to(ROOT)
                except ValueError:
                    return
                if rel.parts[0] in PACKAGES:
                    traced.add(str(rel))

        if traced is not None:
            sys.setprofile(profile)
        try:
            conn.client.data_received(_produce(corr))
            answer = _answer(corr)
            buf = conn.upstream.get_buffer(len(answer))
            buf[:len(answer)] = answer
            conn.upstream.buffer_updated(len(answer))
        finally:
            sys.setprofile(None)
        assert client.written and upstream.written, "the request or its answer did not get through"

    one(1, None)  # warm: per-version tables compiled once
    files: set[str] = set()
    one(2, files)
    conn.close()
    return sorted(files)


def main() -> None:
    every = {"producer_byte_rate": 10**9, "consumer_byte_rate": 10**9, "request_percentage": 1000,
             "controller_mutation_rate": 1000, "producer_ids_rate": 10**6}
    for label, quotas in (("no quota", {}), ("every quota kind configured, none binding", every)):
        files = asyncio.run(walk(quotas))
        print(f"{label}: {len(files)} files")
        for f in files:
            print(f"  {f}")
    print(f"(python {sys.version.split()[0]}; uuid {uuid.uuid4().hex[:6]} marks this run)")


if __name__ == "__main__":
    main()
