"""Policy decisions that hand work back to the connection (``Defer``), driven without a socket or a cluster.

The connection awaits ``defer.decide()``; a Defer built around anything but a function fails only there, at
run time, for every request it covers (KIP-936 holds once did exactly that). These tests take the verdicts the
policy really returns and run them the way ``proxy.wire.connection.Connection._decide`` does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import ProxyConfig
from protocol.headers import parse_request_header
from protocol.request import read_request
from proxy.rules.policy import Decision, Policy
from proxy.rules.verdicts import Defer
from proxy.stats import Stats

HOLD_MAX_MS = 300


def _policy(**quotas) -> Policy:
    return Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "quotas": {
                    "producer_id_window_num": 2,
                    "producer_id_window_size_seconds": 1,
                    "producer_id_hold_max_ms": HOLD_MAX_MS,
                    "entities": [{"entity": {"user": "alice"}, "quotas": quotas}],
                },
            }
        ),
        Stats(),
    )


class _Conn(SimpleNamespace):
    """What the policy reads of a connection: identity, label, and the read hold it may ask for."""

    def __init__(self, principal: str, label: str = "broker 1") -> None:
        super().__init__(
            identity=SimpleNamespace(principal=principal), label=label, upstream_addr=None, holds=0, policy_state=None
        )
        self.mute = SimpleNamespace(hold=self._hold)

    def _hold(self) -> None:
        self.holds += 1


def _produce(pid: int):
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=pid, producer_epoch=0, base_sequence=0)
    b.append(1_700_000_000_000, b"k", b"v")
    b.close()
    TD = ProduceRequest.TopicProduceData
    req = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        version=9,
        topic_data=[
            TD(name="t", topic_id=uuid.uuid4(), partition_data=[TD.PartitionProduceData(index=0, records=b.buffer())])
        ],
    )
    req.with_header(correlation_id=pid, client_id="storm")
    frame = bytes(req.encode(header=True, framed=True))  # the whole frame, as the connection hands it on
    return parse_request_header(frame, 4), frame


async def _run(verdict):
    """What the connection does with a verdict: a Defer's wait is sat out muted, then its function is called
    and its awaitable awaited."""
    if isinstance(verdict, Defer):
        await asyncio.sleep(verdict.wait_s)
        return await verdict.decide()
    return verdict


def test_defer_refuses_anything_but_a_function():
    async def later():
        return None

    coro = later()
    with pytest.raises(TypeError, match="function returning an awaitable"):
        Defer(coro)
    coro.close()


def test_user_over_producer_ids_rate_is_held_then_decided_not_failed():
    asyncio.run(_held_then_decided())


async def _held_then_decided():
    policy = _policy(producer_ids_rate=1)  # 1 new id per 1 s window
    first, second, third = _Conn("alice"), _Conn("alice", "broker 2"), _Conn("alice", "broker 3")
    now = time.monotonic()
    for pid, conn in ((1, first), (2, first)):
        header, request = _produce(pid)
        d = await _run(policy.on_request(conn, read_request(header, request), now))
    assert isinstance(d, Decision) and d.throttle_ms > 0 and first.holds == 1  # over quota: its reads are held

    # A new producer of the same user, on another connection: held, and its request decided after the hold.
    header, request = _produce(3)
    verdict = policy.on_request(second, read_request(header, request), now)
    assert isinstance(verdict, Defer)
    t0 = time.monotonic()
    decided = await _run(verdict)
    waited = time.monotonic() - t0
    assert waited >= (min(d.throttle_ms, HOLD_MAX_MS) - 5) / 1000
    assert isinstance(decided, Decision) and decided.new_pids == 1  # charged once, after the hold

    # Past the hold, a request of the user is decided at once again (the hold was not renewed forever).
    await asyncio.sleep(HOLD_MAX_MS / 1000)
    header, request = _produce(3)
    assert not isinstance(policy.on_request(third, read_request(header, request), time.monotonic()), Defer)


def test_unquotaed_user_is_never_held():
    policy = _policy(producer_ids_rate=1)
    conn = _Conn("bob")
    for pid in range(1, 20):
        header, request = _produce(pid)
        assert policy.on_request(conn, read_request(header, request), time.monotonic()) is None
