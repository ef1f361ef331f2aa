"""proxy.fleet.member.FleetSync's member id: the workers of one host are members of their own."""

from __future__ import annotations

import asyncio

import pytest

from config.model import ProxyConfig
from proxy.fleet.member import FleetSync
from proxy.fleet.parts import fleet_parts, wall_ms
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


def fleet_sync(
    config: ProxyConfig, store: QuotaStore | None = None, now_ms=lambda: 0, wall=wall_ms, worker=None, fair_share=None
) -> FleetSync:
    """A member as the proxy composes it at start (``proxy.server``): its parts first, the quota manager built with
    them, then the sync."""
    parts = fleet_parts(config, worker, wall)
    assert parts is not None
    manager = QuotaManager(parts.leased(store if store is not None else QuotaStore()), ledger=parts.ledger)
    return FleetSync(config, manager, parts, now_ms, fair_share=fair_share)


@pytest.mark.parametrize("worker, member", [(None, "me"), (0, "me-w0"), (3, "me-w3")])
def test_each_worker_of_a_host_is_a_member_of_its_own(monkeypatch, worker, member):
    config = fleet_config(monkeypatch, "me")

    async def build() -> FleetSync:  # (it makes an asyncio queue: inside a loop)
        return fleet_sync(config, worker=worker)

    assert asyncio.run(build()).member == member


def test_members_enforce_the_shares_their_own_records_read_back_give_them(monkeypatch):
    """Two members over one (simulated) topic: each takes every record in the same order; each manager then
    enforces its member's share of the quota (both hungry: half each), not the quota."""
    from quotas.entities import QuotaEntity
    from quotas.fleet_reports import record_mac

    monkeypatch.setenv("KTP_TEST_SECRET", "s" * 32)
    quota = 1_000_000.0
    clock = [1_000_000]

    def member(name: str) -> FleetSync:
        config = fleet_config(monkeypatch, name)
        store = QuotaStore()
        store.set(QuotaEntity(None, "hot"), "producer_byte_rate", quota)
        return fleet_sync(config, store, lambda: clock[0], lambda: clock[0])

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

    config = fleet_config(monkeypatch, "a")
    store = QuotaStore()
    store.set(QuotaEntity(None, "c"), "controller_mutation_rate", 4.0)
    clock = [1_000_000]

    async def build() -> FleetSync:
        return fleet_sync(config, store, lambda: clock[0], lambda: clock[0])

    a = asyncio.run(build())
    qm = a.manager
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

    from proxy.fleet import member as fleet_member
    from quotas.fleet_leases import FAREWELL_LEASE_MS, LeaseRecord

    config = fleet_config(monkeypatch, "me")
    monkeypatch.setattr(fleet_member, "FAREWELL_WAIT_S", 0.2)

    async def stop(producer: _Producer) -> tuple[FleetSync, float]:
        sync = fleet_sync(config, wall=lambda: 5_000)
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


# ------------------------------------------------------------------------------------------ fair share in a fleet


def _light_fleet(monkeypatch, clock: list[int]):
    """Two members, a and b, each with a fair share of its own, whose lease books know both (lease records taken in
    the same order by both); a's only tenant on broker 1 is small (a victim), b's only tenant there is a flooder."""
    from quotas.fair_share import FairShare, FairShareSettings
    from quotas.fleet_reports import record_mac

    shares = {name: FairShare(FairShareSettings()) for name in ("a", "b")}

    def member(name: str) -> FleetSync:
        return fleet_sync(
            fleet_config(monkeypatch, name), None, lambda: clock[0], lambda: clock[0], fair_share=lambda: shares[name]
        )

    async def build() -> tuple[FleetSync, FleetSync]:  # (it makes an asyncio queue: inside a loop)
        return member("a"), member("b")

    a, b = asyncio.run(build())
    for _ in range(4):
        clock[0] += 250
        for value in [m.holder.record(clock[0]).encode() for m in (a, b)]:
            for m in (a, b):
                m.take(a.topic, None, value, [("ktp-mac", record_mac(a.secret, a.topic, None, value))])
            for m in (a, b):
                m.holder.in_flight = None
    assert a.live_members() == b.live_members() == 2
    for name, per_tick in (("a", 20 * 1024.0), ("b", 4 * 1024 * 1024.0)):  # 200 KiB/s and 40 MiB/s of work
        fs = shares[name]
        br = fs.broker("broker 1", clock[0])
        t = fs.tenant(br, name, clock[0])
        for i in range(30):
            br.charge(t, per_tick, clock[0] + 100 * i)
            fs.tick(clock[0] + 100 * i + 100)
    return a, b, shares


def _mac(sync: FleetSync, value: bytes) -> list[tuple[str, bytes]]:
    return sync._mac(sync.topic, None, value)


def test_a_member_writes_a_light_report_when_it_has_news_and_refreshes_it_while_it_lasts(monkeypatch):
    from proxy.fleet.member import LIGHT_REFRESH_MS, LIGHT_VALID_MS
    from quotas.fleet_fair import LightReport

    clock = [1_000_000]
    a, b, shares = _light_fleet(monkeypatch, clock)
    assert a.light_report(clock[0]) is None  # the fleet's size told first: its small lone tenant shows at the next tick
    assert shares["a"].members == 2
    clock[0] += 3_100
    shares["a"].tick(clock[0])
    value = a.light_report(clock[0])
    assert value is not None
    rep = LightReport.decode(value)
    assert rep.member == "a" and rep.ts_ms == clock[0] and rep.valid_ms == LIGHT_VALID_MS
    assert set(rep.light) == {"broker 1"} and 150 * 1024 < rep.light["broker 1"] < 250 * 1024
    assert rep.base == {}  # no baseline measured yet: none told
    assert a.light_report(clock[0] + 250) is None  # nothing new: not before the refresh
    shares["a"].brokers["broker 1"].trusted_base = 1.75  # its smallest trusted baseline, told with its light ones
    assert LightReport.decode(a.light_report(clock[0] + LIGHT_REFRESH_MS) or b"").base == {"broker 1": 1.75}
    shares["a"].broker("broker 1", clock[0]).light_sum = 0.0
    shares["a"].broker("broker 2", clock[0]).light_sum = 1.0  # news: a broker not told yet
    assert LightReport.decode(a.light_report(clock[0] + LIGHT_REFRESH_MS + 250) or b"").light == {"broker 2": 1.0}
    shares["a"].brokers["broker 2"].light_sum = 0.0
    assert a.light_report(clock[0] + 5 * LIGHT_REFRESH_MS) is None  # nothing light: nothing to say, the last lapses
    assert b.light_report(clock[0]) is None  # a lone flooder is nobody to protect
    a.fair_share = lambda: None  # fair share turned off by a reload
    assert a.light_report(clock[0] + 10 * LIGHT_REFRESH_MS) is None


def test_another_members_light_report_makes_this_one_limit_its_flooder(monkeypatch):
    from proxy.fleet.member import LIGHT_VALID_MS
    from quotas.fleet_fair import LightReport

    clock = [1_000_000]
    a, b, shares = _light_fleet(monkeypatch, clock)
    remote = shares["b"].brokers["broker 1"].remote_light
    value = LightReport(
        "a", clock[0] - 500, LIGHT_VALID_MS, {"broker 1": 200 * 1024.0, "broker 9": 1.0}, {"broker 1": 1.5}
    ).encode()
    b.take(b.topic, None, value, _mac(b, value))
    # until its writer's ts + valid, with its baseline there (the target's)
    assert remote == {"a": (clock[0] + LIGHT_VALID_MS - 500, 200 * 1024.0, 1.5)}
    assert "broker 9" not in shares["b"].brokers  # a broker b does not know is not made up
    assert b.light_taken == 1 and b.bad == 0
    assert shares["b"].brokers["broker 1"].members == 2
    # b's flooder, alone on b, now has somebody to protect: its floor is its part of the fleet's min_limit
    floor = shares["b"].brokers["broker 1"]._floor(list(shares["b"].brokers["broker 1"].tenants.values()), clock[0])
    assert floor == shares["b"].settings.min_limit / 2

    remote.clear()
    own = LightReport("b", clock[0], LIGHT_VALID_MS, {"broker 1": 1.0}).encode()
    b.take(b.topic, None, own, _mac(b, own))  # its own, read back: not news
    lapsed = LightReport("a", clock[0] - LIGHT_VALID_MS - 1, LIGHT_VALID_MS, {"broker 1": 1.0}).encode()
    b.take(b.topic, None, lapsed, _mac(b, lapsed))  # from before it started reading
    ahead = LightReport("a", clock[0] + 60_000, LIGHT_VALID_MS, {"broker 1": 1.0}).encode()
    forged = LightReport("a", clock[0], LIGHT_VALID_MS, {"broker 1": 1.0}).encode()
    b.take(b.topic, None, forged, [("ktp-mac", b"\0" * 32)])
    assert remote == {} and b.light_taken == 1 and b.unauthenticated == 1
    b.take(b.topic, None, ahead, _mac(b, ahead))  # a clock far ahead counts no longer than its report's life and skew
    assert remote["a"][0] <= clock[0] + LIGHT_VALID_MS + 250
    b.fair_share = lambda: None  # off here: nothing to note
    b.take(b.topic, None, value, _mac(b, value))
    assert b.light_taken == 2


def test_a_malformed_light_report_is_counted_and_warned_of_once_never_a_traceback(monkeypatch, caplog):
    from quotas.fleet_fair import MAGIC

    clock = [1_000_000]
    _a, b, shares = _light_fleet(monkeypatch, clock)
    bad = MAGIC + b"\xff" * 40
    with caplog.at_level("WARNING", logger="proxy.fleet.member"):
        for _ in range(3):
            b.take(b.topic, None, bad, _mac(b, bad))
        b.take(b.topic, None, b"KTX\x01", _mac(b, b"KTX\x01"))  # nobody's record at all
    assert b.bad == 4 and b.light_taken == 0
    assert shares["b"].brokers["broker 1"].remote_light == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "light report" in warnings[0], warnings


def test_light_reports_go_out_authenticated_on_the_fleets_topic(monkeypatch):
    """The publishing task: every interval, a report when one is due, MAC'd like the lease records."""
    from quotas.fleet_fair import LightReport
    from quotas.fleet_reports import authentic

    clock = [1_000_000]
    a, _b, shares = _light_fleet(monkeypatch, clock)
    a.light_report(clock[0])
    clock[0] += 3_100
    shares["a"].tick(clock[0])
    a.interval_s = 0.01
    producer = _Producer()

    async def publish() -> None:
        task = asyncio.get_running_loop().create_task(a._publish_light(producer))
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(publish())
    assert len(producer.sent) == 1 and a.light_sent == 1  # then nothing new before the refresh (the clock stood)
    topic, value, headers = producer.sent[0]
    assert topic == a.topic and authentic(a.secret, topic, None, value, headers)
    assert set(LightReport.decode(value).light) == {"broker 1"}
