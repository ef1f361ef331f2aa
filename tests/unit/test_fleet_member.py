"""proxy.fleet_member.FleetSync's member id: the workers of one host are members of their own."""

from __future__ import annotations

import asyncio

import pytest

from config.model import ProxyConfig
from proxy.fleet_member import FleetSync
from quotas.entities import QuotaStore
from quotas.manager import QuotaManager


def fleet_config(monkeypatch, member: str) -> ProxyConfig:
    """A member of fleet ``prod`` (its secret in the environment), the cluster unreachable."""
    monkeypatch.setenv("KTP_TEST_SECRET", "s" * 32)
    return ProxyConfig.model_validate(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
            "fleet": {"name": "prod", "secret_env": "KTP_TEST_SECRET", "member": member, "sync_interval_ms": 250},
            "quotas": {"scope": "fleet"},
        }
    )


@pytest.mark.parametrize("worker, member", [(None, "me"), (0, "me-w0"), (3, "me-w3")])
def test_each_worker_of_a_host_is_a_member_of_its_own(monkeypatch, worker, member):
    config = fleet_config(monkeypatch, "me")

    async def build() -> FleetSync:  # (it makes an asyncio queue: inside a loop)
        return FleetSync(config, QuotaManager(QuotaStore()), lambda: 0, worker=worker)

    assert asyncio.run(build()).member == member


def test_members_enforce_the_shares_their_own_records_read_back_give_them(monkeypatch):
    """Two members over one (simulated) topic: each takes every record in the same order; each manager then
    enforces its member's share of the quota (both hungry: half each), not the quota."""
    from quotas.entities import QuotaEntity
    from quotas.fleet_reports import FleetLedger, record_mac

    monkeypatch.setenv("KTP_TEST_SECRET", "s" * 32)
    quota = 1_000_000.0
    clock = [1_000_000]

    def member(name: str) -> FleetSync:
        config = fleet_config(monkeypatch, name)
        store = QuotaStore()
        store.set(QuotaEntity(None, "hot"), "producer_byte_rate", quota)
        qm = QuotaManager(store)
        qm.ledger = FleetLedger()
        return FleetSync(config, qm, lambda: clock[0], wall_ms=lambda: clock[0])

    async def build() -> list[FleetSync]:
        return [member("a"), member("b")]

    a, b = asyncio.run(build())
    before = a.manager.charge_rate("producer_byte_rate", "", "hot", "", 1.0, clock[0])
    assert before is not None and before.limit == quota  # no lease and nobody heard of: a proxy on its own
    for _ in range(12):  # three seconds of intervals: both members' clients want more than the quota
        clock[0] += 250
        log = []
        for m in (a, b):
            m.manager.charge_rate("producer_byte_rate", "", "hot", "", quota / 4 * 3, clock[0])
            m._observe(m.manager.ledger.take(), clock[0])
            rec = m.holder.record(clock[0]).encode()
            log.append(rec)
        for value in log:
            headers = [("ktp-mac", record_mac(a.secret, a.topic, None, value))]
            for m in (a, b):
                m.take(a.topic, None, value, headers)
    for m in (a, b):
        c = m.manager.charge_rate("producer_byte_rate", "", "hot", "", 1.0, clock[0])
        assert c is not None and c.limit == pytest.approx(quota / 2, rel=0.01), (m.member, c.limit)
    assert a.book.live() == b.book.live() == 2
    assert a.leases_taken > 0 and b.leases_taken > 0
    # no record read back for a lease: cut off from the topic, the equal split; connected (records late), nothing
    clock[0] += 4_001
    a.check_lease(clock[0])
    c = a.manager.charge_rate("producer_byte_rate", "", "hot", "", 1.0, clock[0])
    assert c is not None and c.limit == pytest.approx(quota / 2)
    a.holder.fallback = "floor"
    a._rebind()
    c = a.manager.charge_rate("producer_byte_rate", "", "hot", "", 1.0, clock[0])
    assert c is not None and c.limit == pytest.approx(quota * 0.05 / 2)  # its floor, which the book counts


def test_a_bucket_throttled_without_usage_still_asks_for_more(monkeypatch):
    """KIP-599 rejects a request over its bucket: nothing is recorded, only a throttle. The member still counts
    its clients as held back (demand: the whole quota), or its share would fall to its floor and stay there."""
    from quotas.entities import QuotaEntity
    from quotas.fleet_reports import FleetLedger

    config = fleet_config(monkeypatch, "a")
    store = QuotaStore()
    store.set(QuotaEntity(None, "c"), "controller_mutation_rate", 4.0)
    qm = QuotaManager(store)
    qm.ledger = FleetLedger()
    clock = [1_000_000]

    async def build() -> FleetSync:
        return FleetSync(config, qm, lambda: clock[0], wall_ms=lambda: clock[0])

    a = asyncio.run(build())
    first = qm.charge_mutations("", "c", "", [100], clock[0], strict=True)
    assert first is not None and first.mutations == 100  # admitted: the bucket is deep in debt now
    a._observe(qm.ledger.take(), clock[0])
    a.holder.in_flight = None
    for _ in range(8):  # two seconds of rejected requests: no usage at all
        clock[0] += 250
        again = qm.charge_mutations("", "c", "", [4], clock[0], strict=True)
        assert again is not None and again.mutations == 0 and again.throttle_ms > 0
        a._observe(qm.ledger.take(), clock[0])
        rec = a.holder.record(clock[0])
        a.holder.in_flight = None
        assert rec.demand.tolist() == [4.0]


class _Producer:
    """What FleetSync.stop asks of its aiokafka producer; ``hang``: the topic never answers."""

    def __init__(self, hang: bool = False) -> None:
        self.sent: list[tuple[str, bytes, list[tuple[str, bytes]]]] = []
        self.hang = hang

    async def send_and_wait(self, topic: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self.sent.append((topic, value, headers))
        if self.hang:
            await asyncio.sleep(3600)


def test_a_stopping_member_writes_a_farewell_record_and_does_not_wait_on_a_silent_topic(monkeypatch):
    """Server.shutdown closes every connection, then stops the fleet: the member's last record gives its share
    back (LeaseHolder.farewell), authenticated like the others; a topic that does not answer costs the shutdown
    FAREWELL_WAIT_S, no more, and the lease then runs out as if the member had died."""
    import time

    from proxy import fleet_member
    from quotas.fleet_leases import FAREWELL_LEASE_MS, LeaseRecord

    config = fleet_config(monkeypatch, "me")
    monkeypatch.setattr(fleet_member, "FAREWELL_WAIT_S", 0.2)

    async def stop(producer: _Producer) -> tuple[FleetSync, float]:
        sync = FleetSync(config, QuotaManager(QuotaStore()), lambda: 0, wall_ms=lambda: 5_000)
        sync._producer, sync.connected = producer, True
        began = time.monotonic()
        await sync.stop()
        return sync, time.monotonic() - began

    answered = _Producer()
    sync, _ = asyncio.run(stop(answered))
    [(topic, value, headers)] = answered.sent
    rec = LeaseRecord.decode(value)
    assert topic == sync.topic and rec.member == "me" and rec.lease_ms == FAREWELL_LEASE_MS
    assert headers == sync._mac(sync.topic, None, value)

    silent = _Producer(hang=True)
    _, took = asyncio.run(stop(silent))
    assert len(silent.sent) == 1 and took < 1.0
