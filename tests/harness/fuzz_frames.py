"""Deterministic fuzz cases for every walk the proxy makes over a client's bytes (issue #35), and the in-process rig
that drives them through a real :class:`proxy.wire.connection.Connection` with every quota kind on.

Why a rig of its own: the contract is that a malformed request closes its connection with one WARNING line and no
traceback, whichever reader meets it first (the request header, acks, the wait the broker may take, the protected
topics' check, the KIP-599 and client-quota parsers, the producer ids, a Fetch's max_bytes, SASL's tokens). Driving
the connection's own entry point (``data_received``) rather than each parser reaches every one of them, in the
order the proxy calls them, so a reader added later is fuzzed too.

The cases:

- :func:`valid_requests`: a request of every API kafka-python has a schema for, in every version it knows (filled
  from the schema, so every field is on the wire and every array has an element; topic names are protected ones,
  so the topic guard decodes them), plus hand-made ones the schema cannot fill meaningfully: Produce with real
  record batches (small, and one past ``SMALL_FRAME_BYTES`` so the large-frame path reads a view), SASL
  handshakes and tokens of every mechanism the proxy follows.
- :func:`truncations`: a request cut at every offset, its size prefix saying so (a frame that is whole as a frame
  and short as a request: the bug of #35).
- :func:`mutations`: flipped, inserted and cut bytes, and lengths or counts set to -1, 0x7FFF and the like.

:class:`FuzzRig` counts what the contract forbids: an ERROR record or a record with a traceback, a task whose
exception was never retrieved, a task destroyed while pending or still pending once its connection closed (it
would be), and a connection closed as "cannot process".
Used by ``tests/unit/test_request_fuzz.py`` (a CI-sized share) and ``bench.fuzz_walks`` (all of it, millions).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import random
import struct
import uuid
from collections.abc import Iterator
from typing import Any

from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import ProxyConfig
from protocol.address_free import offered_caps
from protocol.api_versions import decode_caps
from protocol.apis import REQUESTS, Api, request_is_flexible
from protocol.endpoint_apis import ADDRESS_APIS
from protocol.frames import RequestBytesPool
from protocol.headers import encode_response_header
from protocol.sasl_identity import ANONYMOUS
from protocol.topic_guard import GUARDED_APIS, ProtectedTopics
from proxy.rules.policy import Policy
from proxy.server import DECODED_APIS
from proxy.stats import Stats
from proxy.wire.brokers import BrokerDirectory
from proxy.wire.connection import Connection, Services
from proxy.wire.responses import TopicIds
from tests.harness.connection_rig import Transport

_SIZE = struct.Struct(">i")
PROTECTED = "__ktp_own"
"""A protected topic's name: every schema-filled request names it, so the topic guard decodes every one."""
_TOPIC_ID = uuid.UUID(int=0x1234_5678)

QUOTAS = {
    "producer_byte_rate": 1 << 40,
    "consumer_byte_rate": 1 << 40,
    "request_percentage": 10_000,
    "controller_mutation_rate": 100_000,
    "producer_ids_rate": 1_000_000,
}
"""Every quota kind a request can be charged, none binding: each reader runs, no mute holds the next frame."""


# ------------------------------------------------------------------------------------------ valid requests


def _scalar(type_str: str, name: str, entity: str | None, topic: str) -> Any:
    if type_str in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        return 1
    if type_str == "bool":
        return True
    if type_str == "float64":
        return 1.0
    if type_str == "uuid":
        return _TOPIC_ID
    if type_str == "string":
        return topic if entity == "topicName" or "topic" in name.lower() else "a"
    if type_str in ("bytes", "records"):
        return b"x"
    raise ValueError(f"no filler for schema type {type_str!r}")


def _fields(fields: Any, version: int, topic: str) -> dict[str, Any]:
    return {f.name: _value(f, version, topic) for f in fields.values() if f.for_version_q(version)}


def _value(field: Any, version: int, topic: str) -> Any:
    if field.is_array():
        if field.is_struct_array():
            return [field.data_class(version=version, **_fields(field.array_of.fields, version, topic))]
        return [_scalar(field.array_of.type_str, field.name, getattr(field, "_entity_type", None), topic)]
    if field.is_struct():
        return field.data_class(version=version, **_fields(field.fields, version, topic))
    return _scalar(field.type_str, field.name, getattr(field, "_entity_type", None), topic)


def schema_bodies(topic: str = PROTECTED) -> Iterator[tuple[int, int, bytes]]:
    """(api key, version, body) for every request kafka-python has a schema for, in every version it knows, every
    field on the wire and every array with an element; ``topic``: the name of every topic it names."""
    for key, cls in sorted(REQUESTS.items()):
        for version in range(cls.min_version, cls.max_version + 1):
            msg = cls(version=version, **_fields(cls._struct.fields, version, topic))
            yield key, version, bytes(msg.encode(version=version))


def _records(producer_id: int, value_bytes: int) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 22, producer_id=producer_id, producer_epoch=0, base_sequence=0)
    b.append(0, b"k", b"v" * value_bytes)
    b.close()
    return bytes(b.buffer())


def produce_bodies(value_bytes: int = 100) -> Iterator[tuple[int, int, bytes]]:
    """Produce in every version with a real record batch (its producer id is what KIP-936 reads), to a plain
    topic (so the quotas' readers run, not the guard's refusal)."""
    td = ProduceRequest.TopicProduceData
    for version in range(ProduceRequest.min_version, ProduceRequest.max_version + 1):
        records = _records(7, value_bytes) if version >= 3 else b""  # v0-2: message sets, never record batches
        data = td(name="t", partition_data=[td.PartitionProduceData(index=0, records=records)])
        if version >= 13:
            data.topic_id = _TOPIC_ID
        req = ProduceRequest(
            version=version,
            transactional_id="tx" if version >= 3 else None,
            acks=-1,
            timeout_ms=1000,
            topic_data=[data],
        )
        yield Api.PRODUCE, version, bytes(req.encode(version=version))


def _jwt(claims: dict[str, Any]) -> str:
    part = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"e30.{part}.sig"


SASL_TOKENS: dict[str, bytes] = {
    "PLAIN": b"authz\x00alice\x00secret",
    "SCRAM-SHA-256": b"n,,n=alice,r=abcdefgh",
    "SCRAM-SHA-512": b"n,a=alice,n=alice,r=abcdefgh,ext=1",
    "OAUTHBEARER": f"n,,\x01auth=Bearer {_jwt({'sub': 'alice'})}\x01\x01".encode(),
    "GSSAPI": b"\x60\x82\x01\x00",
}
"""A first client token of every mechanism the identity tracker reads (GSSAPI's is opaque to it)."""


def sasl_bodies() -> Iterator[tuple[str, int, int, bytes]]:
    """(mechanism, api key, version, body): a SaslHandshake, and a SaslAuthenticate carrying the mechanism's first
    token, in every version."""
    from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

    for mechanism, token in SASL_TOKENS.items():
        for v in range(SaslHandshakeRequest.min_version, SaslHandshakeRequest.max_version + 1):
            yield mechanism, Api.SASL_HANDSHAKE, v, bytes(SaslHandshakeRequest(mechanism=mechanism).encode(version=v))
        for v in range(SaslAuthenticateRequest.min_version, SaslAuthenticateRequest.max_version + 1):
            yield (
                mechanism,
                Api.SASL_AUTHENTICATE,
                v,
                bytes(SaslAuthenticateRequest(auth_bytes=token).encode(version=v)),
            )


def request_frame(key: int, version: int, body: bytes, corr: int = 1, client_id: str | None = "fuzz") -> bytes:
    """A whole request frame: size prefix, header (v1, or v2 in flexible versions), ``body``."""
    cid = b"" if client_id is None else client_id.encode()
    head = struct.pack(">hhih", key, version, corr, -1 if client_id is None else len(cid)) + cid
    if request_is_flexible(key, version):
        head += b"\x00"
    return _SIZE.pack(len(head) + len(body)) + head + body


class Case:
    """One fuzz case: ``frames`` sent in order on a fresh connection (a SASL exchange's earlier steps, then the
    fuzzed frame); ``answer_first``: the broker answers a SaslHandshake v0 before the last frame is sent (it is
    then a raw token)."""

    __slots__ = ("label", "frames", "handshake_v0", "body")

    def __init__(self, label: str, frames: list[bytes], handshake_v0: bool = False, body: bytes | None = None) -> None:
        self.label = label
        self.frames = frames
        self.handshake_v0 = handshake_v0
        self.body = body
        """The last frame's body, when it has a request header (not a raw token): sent under other headers too."""


def valid_cases(large: bool = True, warm: bool = True) -> list[Case]:
    """A valid case of every request the proxy may read: what :func:`truncations` and :func:`mutations` start from.
    ``large``: also a Produce past ``SMALL_FRAME_BYTES`` (handed to the readers as a view, not ``bytes``); ``warm``:
    also each after the same request whole."""
    out: list[Case] = []
    # Naming a protected topic (the topic guard reads them; most are refused before a quota is charged), and a
    # plain one (the quotas' readers run: acks, the wait, a Fetch's max_bytes, KIP-599's topics).
    plain = [(f"api {key} v{version} own", key, version, body) for key, version, body in schema_bodies()]
    plain += [(f"api {key} v{version}", key, version, body) for key, version, body in schema_bodies("t")]
    plain += [(f"Produce v{version}", key, version, body) for key, version, body in produce_bodies()]
    if large:
        plain += [
            (f"large Produce v{version}", k, version, b) for k, version, b in produce_bodies(70_000) if version >= 3
        ]
    for label, key, version, body in plain:
        frame = request_frame(key, version, body)
        out.append(Case(label, [frame], body=body))
        # Warm: the same request just before, so the readers that remember the last request's shape (the
        # producer id's skeleton, the flexible-version and walk memos) meet the fuzzed one with it in mind.
        if warm:
            out.append(Case(f"{label} warm", [frame, request_frame(key, version, body, 2)], body=body))
    from kafka.protocol.sasl import SaslHandshakeRequest

    for mechanism, key, version, body in sasl_bodies():
        if key == Api.SASL_HANDSHAKE:
            out.append(Case(f"SaslHandshake v{version} {mechanism}", [request_frame(key, version, body)], body=body))
        else:
            hs = request_frame(
                Api.SASL_HANDSHAKE, 1, bytes(SaslHandshakeRequest(mechanism=mechanism).encode(version=1))
            )
            frames = [hs, request_frame(key, version, body, 2)]
            out.append(Case(f"SaslAuthenticate v{version} {mechanism}", frames, body=body))
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "GSSAPI"):  # raw tokens after a SaslHandshake v0
        hs = request_frame(Api.SASL_HANDSHAKE, 0, bytes(SaslHandshakeRequest(mechanism=mechanism).encode(version=0)))
        token = SASL_TOKENS[mechanism]
        out.append(Case(f"raw token {mechanism}", [hs, _SIZE.pack(len(token)) + token], handshake_v0=True))
    return out


# ------------------------------------------------------------------------------------------ fuzzing


def _with_last(case: Case, last: bytes, label: str) -> Case:
    return Case(label, [*case.frames[:-1], last], case.handshake_v0, case.body)


HEADERS: list[tuple[int, int]] = sorted({(key, version) for key, version, _ in schema_bodies()})
"""Every (api key, version) the cases are made of: a body is also sent under one of the others' headers."""


def truncations(case: Case) -> Iterator[Case]:
    """The case's last frame cut at every offset after its size prefix, the prefix saying so: every frame is whole
    as a frame and short as a request. (A large frame is cut at every offset of its first 512 bytes and its last
    64, and every 997th byte between: its records are skipped in one step, so the offsets inside them are alike.)"""
    frame = case.frames[-1]
    n = len(frame)
    cuts: range | list[int] = range(4, n)
    if n > 4096:
        cuts = sorted({*range(4, 516), *range(4, n, 997), *range(max(n - 64, 4), n)})
    for cut in cuts:
        yield _with_last(case, _SIZE.pack(cut - 4) + frame[4:cut], f"{case.label} cut at {cut}")


_LENGTHS = (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\xff\xfe", b"\x7f\xff", b"\x00\x00", b"\x80\x80\x80\x80\x08")


def mutate(rng: random.Random, frame: bytes) -> bytes:
    """``frame`` with one to four random edits past its size prefix (the prefix then fixed up, so the frame is
    read as a frame): a byte changed, inserted or dropped, the rest cut off, or a length or count set to -1, the
    largest int16/int32, 0 or an overlong varint."""
    b = bytearray(frame[4:])
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif op == 2 and b:
            del b[rng.randrange(len(b))]
        elif op == 3 and b:
            del b[rng.randrange(len(b)) :]
        elif b:
            i = rng.randrange(len(b))
            b[i : i + 4] = rng.choice(_LENGTHS)
    return _SIZE.pack(len(b)) + bytes(b)


def mutations(case: Case, rng: random.Random, count: int) -> Iterator[Case]:
    """``count`` mutations of the case's last frame (see :func:`mutate`); one in eight is first sent under the
    header of another API or version (a body that is valid, but for something else)."""
    for i in range(count):
        frame = case.frames[-1]
        label = f"{case.label} mutation {i}"
        if case.body is not None and rng.random() < 0.125:
            key, version = rng.choice(HEADERS)
            frame = request_frame(key, version, case.body, 2)
            label += f" as api {key} v{version}"
            if rng.random() < 0.5:
                yield _with_last(case, frame, label)
                continue
        yield _with_last(case, mutate(rng, frame), label)


# ------------------------------------------------------------------------------------------ the rig


class Failure(AssertionError):
    """What the contract forbids happened for a case."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[str] = []
        self.warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f": {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            self.bad.append(text)
        elif record.levelno == logging.WARNING:
            self.warnings += 1


def _config(smooth: bool) -> ProxyConfig:
    return ProxyConfig.model_validate(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
            "quotas": {
                "entities": [{"entity": {"user": "<default>"}, "quotas": QUOTAS}],
                "enforcement": "smooth" if smooth else "kafka",
                "admins": [ANONYMOUS],  # so Describe/AlterClientQuotas are read to the end
            },
        }
    )


class FuzzRig:
    """Real connections, with the real policy (every quota kind on, the topic guard on) and stand-in sockets, one
    per case. Call :meth:`run` inside a running event loop; it raises :class:`Failure` naming the case when the
    contract is broken. ``smooth``: smooth enforcement (a Fetch's max_bytes is read and may be rewritten)."""

    def __init__(self, smooth: bool = False) -> None:
        config = _config(smooth)
        self.stats = Stats()
        policy = Policy(config, self.stats)
        policy.guard = ProtectedTopics([PROTECTED])

        async def no_listener(node_id: int, port: int) -> int:
            raise AssertionError("no listener expected")

        self.services = Services(
            config,
            self.stats,
            policy,
            RequestBytesPool(1 << 30),
            BrokerDirectory("127.0.0.1", None, no_listener),
            TopicIds(),
            offered_caps(decode_caps(ADDRESS_APIS | DECODED_APIS | GUARDED_APIS)),  # as the server's, guard on
            lambda conn, ip: None,
            lambda conn: None,
            lambda conn: None,
        )
        self.records = _Records()
        self.loop_errors: list[str] = []
        self.cases = 0
        self.closed = 0
        """Cases whose connection the proxy closed (the malformed ones, mostly)."""
        self.pending_tasks = 0

    def __enter__(self) -> FuzzRig:
        logging.getLogger().addHandler(self.records)
        loop = asyncio.get_running_loop()
        self._handler = loop.get_exception_handler()
        loop.set_exception_handler(lambda _loop, ctx: self.loop_errors.append(str(ctx.get("message"))))
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self.records)
        asyncio.get_running_loop().set_exception_handler(self._handler)

    async def run(self, case: Case) -> None:
        conn = Connection(self.services, [("127.0.0.1", 9)], "broker 1")
        client, upstream = Transport(), Transport()
        conn.client.connection_made(client)
        upstream.protocol = conn.upstream_chunks
        conn.upstream_chunks.connection_made(upstream)
        side: Any = conn.client
        for i, frame in enumerate(case.frames):
            if case.handshake_v0 and i == len(case.frames) - 1:
                corr = struct.unpack_from(">i", case.frames[0], 8)[0]
                answer = encode_response_header(corr, False) + struct.pack(">hi", 0, 1) + b"\x00\x05PLAIN"
                upstream.protocol.data_received(_SIZE.pack(len(answer)) + answer)
                await asyncio.sleep(0)  # the handshake's answer releases what follows it on the next turn
            side.data_received(frame)
            if conn.closed:
                break
        for _ in range(3):  # deferred decisions (KIP-599 asks the cluster first) start and run to their ask
            await asyncio.sleep(0)
        self.cases += 1
        self.closed += conn.closed
        conn.close()
        await asyncio.sleep(0)  # the cancelled tasks end,
        await asyncio.sleep(0)  # and leave the connection's set
        if conn._tasks:  # one would be destroyed while pending once the connection is collected
            self.pending_tasks += len(conn._tasks)
            for task in conn._tasks:
                task.cancel()
        self.check(case)

    def reset(self) -> None:
        """Forget what :meth:`check` found (a long run records a failure and goes on)."""
        self.records.bad.clear()
        self.loop_errors.clear()
        self.stats.connection_errors.pop("internal", None)
        self.pending_tasks = 0

    def check(self, case: Case | None) -> None:
        where = "" if case is None else f" ({case.label}: {case.frames[-1][:48].hex()}...)"
        if self.records.bad:
            raise Failure(f"logged {self.records.bad[0]}{where}")
        if self.stats.connection_errors.get("internal"):
            raise Failure(f"closed a connection as 'cannot process a request'{where}")
        if self.loop_errors:
            raise Failure(f"event loop: {self.loop_errors[0]}{where}")
        if self.pending_tasks:
            raise Failure(f"a task outlived its closed connection{where}")

    async def settle(self) -> None:
        """Collect what is left (a task destroyed while pending is reported only when collected), then check."""
        await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
        self.check(None)
