"""One real ``proxy.wire.connection.Connection``, with the real policy, and stand-in sockets: a Produce request and its
answer go through it in process, no broker and no event loop's I/O. The unit tests drive the connection's
counters, reads and turns with it; the benchmarks count what one Produce costs on it (``bench.produce_walk``: the
files it walks through; ``bench.request_cpu`` and ``bench.instructions``: its CPU and instructions).
"""

from __future__ import annotations

import struct
from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import ProxyConfig
from protocol.api_versions import decode_caps
from protocol.frames import RequestBytesPool
from protocol.headers import encode_response_header
from proxy.rules.policy import Policy
from proxy.server import DECODED_APIS
from proxy.stats import Stats
from proxy.wire.brokers import BrokerDirectory
from proxy.wire.connection import Connection, Services
from proxy.wire.responses import TopicIds
from proxy.wire.sockets import ClientSide, UpstreamSide

_SIZE = struct.Struct(">i")
PRODUCE_VERSION = 11
"""Produce version of the rig's requests: what Kafka 4.x clients send (v10+ responses may carry node_endpoints)."""


class Transport:
    """Stands in for a socket's transport: records what is written."""

    def __init__(self, peer=("127.0.0.1", 50000)) -> None:
        self.written: list[bytes] = []
        self.peer = peer
        self.protocol: Any = None
        """What the loop would hand reads to (``set_protocol``): a plain or a buffered protocol, called as the loop
        calls it (``data_received``, or ``get_buffer`` and ``buffer_updated``)."""

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


def produce_request(corr: int, records: int = 1, value_bytes: int = 100) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=7, producer_epoch=0, base_sequence=corr)
    for i in range(records):
        b.append(i, b"k", b"v" * value_bytes)
    b.close()
    TD = ProduceRequest.TopicProduceData
    req = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=1000,
        version=PRODUCE_VERSION,
        topic_data=[TD(name="t", partition_data=[TD.PartitionProduceData(index=0, records=b.buffer())])],
    )
    req.with_header(correlation_id=corr, client_id="app")
    body = req.encode(header=True, framed=False)
    return _SIZE.pack(len(body)) + body


def produce_response(corr: int, error_message: str | None = None) -> bytes:
    P = ProduceResponse._struct.fields["responses"].array_of.data_class
    Q = P.fields["partition_responses"].array_of.data_class
    v = PRODUCE_VERSION
    body = ProduceResponse(
        version=v,
        throttle_time_ms=0,
        responses=[
            P(
                version=v,
                name="t",
                partition_responses=[
                    Q(
                        version=v,
                        index=0,
                        error_code=0,
                        base_offset=corr,
                        log_append_time_ms=-1,
                        log_start_offset=0,
                        record_errors=[],
                        error_message=error_message,
                    )
                ],
            )
        ],
    ).encode()
    head = encode_response_header(corr, True)
    return _SIZE.pack(len(head) + len(body)) + head + body


def _config(quotas: dict) -> ProxyConfig:
    entities = [{"entity": {"user": "ANONYMOUS"}, "quotas": quotas}] if quotas else []
    return ProxyConfig.model_validate(
        {"upstream": {"bootstrap_servers": ["127.0.0.1:9"]}, "quotas": {"entities": entities}}
    )


class ConnectionRig:
    """One real Connection with the real policy and stand-in transports; :meth:`round_trip` sends one Produce
    and its answer through it."""

    def __init__(self, quotas: dict, records: int = 1, value_bytes: int = 100) -> None:
        config = _config(quotas)
        stats = Stats()

        async def no_listener(node_id: int, port: int) -> int:
            raise AssertionError("no listener expected")

        services = Services(
            config,
            stats,
            Policy(config, stats),
            RequestBytesPool(1 << 28),
            BrokerDirectory("127.0.0.1", None, no_listener),
            TopicIds(),
            decode_caps(DECODED_APIS),
            lambda conn, ip: None,
            lambda conn: None,
            lambda conn: None,
        )
        self.conn = Connection(services, [("127.0.0.1", 9)], "broker 1")
        client_side, upstream_side = self.conn.client, self.conn.upstream
        assert isinstance(client_side, ClientSide) and isinstance(upstream_side, UpstreamSide)  # typed _Side there
        self.client_side = client_side
        """The connection's client socket protocol (``conn.client``), as the loop sees it: its reads as bytes."""
        self.upstream_side = upstream_side
        """The connection's broker socket protocol (``conn.upstream``) once reads are buffered."""
        self.client, self.upstream = Transport(), Transport()
        self.conn.client.connection_made(self.client)
        # As if the broker connection were up: the loop calls what the connection asked for (its chunk reader).
        self.upstream.protocol = self.conn.upstream_chunks
        self.conn.upstream_chunks.connection_made(self.upstream)
        self.records, self.value_bytes = records, value_bytes

    def round_trip(self, corr: int, request: bytes | None = None, answer: bytes | None = None) -> None:
        conn = self.conn
        self.client_side.data_received(request or produce_request(corr, self.records, self.value_bytes))
        answer = answer or produce_response(corr)
        if conn.buffered_reads:
            buf = self.upstream_side.get_buffer(len(answer))
            buf[: len(answer)] = answer
            self.upstream_side.buffer_updated(len(answer))
        else:  # as uvloop hands a read to a plain protocol: the read's bytes
            self.upstream.protocol.data_received(answer)
        if self.client.written and self.upstream.written:
            self.client.written.clear()
            self.upstream.written.clear()
        else:
            raise AssertionError("the request or its answer did not get through")
