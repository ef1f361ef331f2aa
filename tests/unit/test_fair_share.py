"""Capacity-aware fair share (quotas/fair_share.py) on an injected clock: the division, the baseline, the control
law, and the whole loop against a simulated broker whose delay grows with the work it is given.

The simulated broker (:class:`SimBroker`) is a queue: it serves ``capacity`` work bytes a second; a request's service
time is its class's base time plus the work queued ahead of it over the capacity. Tenants send requests of a fixed
size at a fixed demand, one at a time while one is held (as a connection the proxy does not read while it holds a
request). Figures asserted are what the loop must do whatever its tuning: a lone tenant never limited, a light
tenant never held, the delay brought under control, the limit settling without swinging, the limit released when
nobody is left to protect.
"""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.fair_share import (
    BASELINE_EPOCH_MS,
    MIB,
    MIN_BASELINE_SAMPLES,
    REQUEST_WORK,
    TICK_MS,
    Baseline,
    BrokerLoad,
    FairShare,
    FairShareSettings,
    sample_class,
    water_level,
)

KIB = 1024


# ------------------------------------------------------------------------------------------ the division
def test_doormans_example_cap_120_wants_1000_50_10():
    level = water_level([1000.0, 50.0, 10.0], [1.0, 1.0, 1.0], 120.0)
    assert level == pytest.approx(60.0)
    assert [min(d, level) for d in (1000.0, 50.0, 10.0)] == pytest.approx([60.0, 50.0, 10.0])


def test_weights_divide_what_is_left_in_proportion():
    level = water_level([math.inf, math.inf, 5.0], [2.0, 1.0, 1.0], 65.0)
    assert level == pytest.approx(20.0)  # 5 to the light one, 40 and 20 to the others


def test_when_everything_fits_the_level_leaves_room_above_the_largest():
    level = water_level([10.0, 20.0], [1.0, 1.0], 100.0)
    assert level >= 20.0


@settings(max_examples=300, deadline=None)
@given(
    demands=st.lists(st.one_of(st.floats(0, 1e9, allow_nan=False), st.just(math.inf)), min_size=1, max_size=12),
    capacity=st.floats(1.0, 1e9, allow_nan=False),
    data=st.data(),
)
def test_max_min_invariants(demands, capacity, data):
    weights = data.draw(st.lists(st.floats(0.1, 10.0), min_size=len(demands), max_size=len(demands)))
    level = water_level(demands, weights, capacity)
    given = [min(d, level * w) for d, w in zip(demands, weights, strict=True)]
    # Never more than the capacity is handed out while someone wants more than it gets.
    if any(d > level * w for d, w in zip(demands, weights, strict=True)):
        assert sum(given) <= capacity * (1 + 1e-9) + 1e-6
        # ... and the capacity is all handed out (max-min is work-conserving).
        assert sum(given) >= capacity * (1 - 1e-9) - 1e-6
    # A tenant asking for less than its weighted level gets all of it.
    for d, w, g in zip(demands, weights, given, strict=True):
        if d <= level * w:
            assert g == d
    # More capacity never lowers the level.
    assert water_level(demands, weights, capacity * 2) >= level - 1e-9


# ------------------------------------------------------------------------------------------ the baseline
def test_baseline_is_a_windowed_minimum_over_two_epochs():
    b = Baseline(0.0)
    epoch = BASELINE_EPOCH_MS / 1000
    for i in range(MIN_BASELINE_SAMPLES - 1):
        assert b.add(5.0, i / 1000) == math.inf  # not trusted yet
    assert b.add(2.0, 0.01) == 2.0
    assert b.add(9.0, 0.02) == 2.0  # a minimum, not an average
    t = epoch + 0.02
    assert b.add(4.0, t) == 2.0  # the previous epoch still counts
    t += epoch + 0.01
    assert b.add(4.5, t) == 4.0  # the 2.0 epoch is now two epochs old: forgotten
    assert b.add(10.0, t + 3 * epoch) == 10.0  # a long gap forgets both


def test_sample_classes():
    assert sample_class(0, 0, 1000) == -1  # acks=0: no answer
    assert sample_class(1, 1, 100) == -1  # Fetch waits for data
    assert sample_class(0, 1, 100) != sample_class(0, -1, 100)  # acks=all replicates
    assert sample_class(0, -1, 500) != sample_class(0, -1, 1_000_000)
    assert sample_class(3, 1, 50) >= 0  # Metadata
    assert sample_class(19, 1, 50) == -1  # CreateTopics waits for the controller


# ------------------------------------------------------------------------------------------ the simulated broker
class SimTenant:
    def __init__(self, name: str, demand: float, size: int) -> None:
        self.name = name
        self.demand = demand  # work bytes/s it tries to send
        self.size = size  # bytes a request
        self.credit = 0.0
        self.held_mark = -1.0
        self.sent = 0.0
        self.held_requests = 0
        self.waits_ms: list[int] = []
        self.delays_ms: list[float] = []


class SimBroker:
    """A FIFO server of ``capacity`` work bytes a second: a request waits for the work queued ahead of it."""

    def __init__(self, capacity: float, base_ms: float = 0.5) -> None:
        self.capacity = capacity
        self.base_ms = base_ms
        self.backlog = 0.0  # work bytes queued

    def serve(self, dt_s: float) -> None:
        self.backlog = max(0.0, self.backlog - self.capacity * dt_s)

    def admit(self, work: float) -> float:
        """The service time (ms) of a request of ``work`` admitted now."""
        wait_ms = self.backlog / self.capacity * 1000
        self.backlog += work
        return self.base_ms + wait_ms + work / self.capacity * 1000


def run(
    tenants: list[SimTenant],
    broker: SimBroker,
    seconds: float,
    fs: FairShare | None = None,
    start_ms: int = 0,
    step_ms: int = 10,
    schedule=None,
) -> tuple[FairShare, BrokerLoad, list[tuple[int, float, str]]]:
    """Drive ``tenants`` through fair share against ``broker`` for ``seconds``; (time, limit, state) per tick."""
    fs = fs or FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=64 * KIB))
    b = fs.broker("broker 1", start_ms)
    # A tenant is known to the broker from its first request (as a connection binds at its first), not before.
    handles = {t.name: fs.tenant(b, t.name, start_ms) for t in tenants if t.demand > 0}
    trace: list[tuple[int, float, str]] = []
    now = start_ms
    end = start_ms + int(seconds * 1000)
    while now < end:
        if schedule is not None:
            schedule(now, tenants, broker)
        broker.serve(step_ms / 1000)
        for t in tenants:
            h = handles.get(t.name)
            if h is None:
                if t.demand <= 0:
                    continue  # not sent anything yet: unknown to the broker
                h = handles[t.name] = fs.tenant(b, t.name, now)
            if t.held_mark >= 0:
                if b.wait_ms(h, t.held_mark, now) > 1:
                    continue
                t.held_mark = -1.0
                service = broker.admit(t.size)
                b.sample(sample_class(0, -1, t.size), service, now / 1000, now / 1000)
                t.sent += t.size
                t.delays_ms.append(service)
                continue
            t.credit += t.demand * step_ms / 1000
            while t.credit >= t.size and t.held_mark < 0:
                t.credit -= t.size
                mark = b.charge(h, float(t.size + REQUEST_WORK), now)
                wait = b.wait_ms(h, mark, now)
                if wait > 1:
                    t.held_mark = mark
                    t.held_requests += 1
                    t.waits_ms.append(wait)
                    t.credit = min(t.credit, t.size)  # a held connection is not read: its demand queues at the client
                    break
                service = broker.admit(t.size)
                b.sample(sample_class(0, -1, t.size), service, now / 1000, now / 1000)
                t.sent += t.size
                t.delays_ms.append(service)
        now += step_ms
        if now % TICK_MS == 0:
            fs.tick(now)
            trace.append((now, b.limit, b.state))
    return fs, b, trace


def test_a_lone_flooder_is_never_limited():
    flood = SimTenant("flooder", 40 * MIB, 1_000_000)
    fs, b, trace = run([flood], SimBroker(20 * MIB), 20)
    assert all(limit == 0 for _t, limit, _s in trace)
    assert flood.held_requests == 0


def test_two_tenants_alike_are_never_limited():
    # Two tenants that start together beside each other are slow-started together (SURGE_FACTOR: neither knows the
    # other is no flood yet); once the delay shows with nobody light, the start ends, and nobody is limited after.
    a = SimTenant("a", 15 * MIB, 64 * KIB)
    c = SimTenant("c", 15 * MIB, 64 * KIB)
    waits: list[int] = []

    def schedule(now, tenants, broker):
        if now == 1_000:
            waits.extend([a.held_requests, c.held_requests])

    _fs, b, trace = run([a, c], SimBroker(20 * MIB), 20, schedule=schedule)
    assert all(limit == 0 for _t, limit, _s in trace)
    assert [a.held_requests, c.held_requests] == waits, "held in their first second only"
    assert not b.starting
    assert a.sent >= 0.95 * c.sent and c.sent >= 0.95 * a.sent


def test_a_victim_beside_a_flooder_is_protected_and_never_held():
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 40 * MIB, 256 * KIB)
    _fs, b, trace = run([victim, flood], SimBroker(20 * MIB), 30)
    assert victim.held_requests == 0, "a tenant below its share is never delayed"
    assert b.limit > 0, "the broker is limited while the flood goes on"
    settled = victim.delays_ms[len(victim.delays_ms) // 2 :]
    assert statistics.median(settled) < 0.5 + 2.0 * 3  # near its base plus the target, not a standing queue
    # the flooder still gets a good part of the capacity: the limit settles where the delay is at the target
    late = [limit for t, limit, _s in trace if t > 15_000]
    assert statistics.mean(late) > 5 * MIB
    # no swinging: the settled limit moves by less than a quarter of its mean
    assert statistics.pstdev(late) / statistics.mean(late) < 0.25


def test_a_flood_that_starts_later_is_cut_within_a_second():
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 0.0, 256 * KIB)

    def schedule(now, tenants, broker):
        if now == 5_000:
            flood.demand = 60 * MIB

    _fs, _b, trace = run([victim, flood], SimBroker(20 * MIB), 10, schedule=schedule)
    cut_at = next(t for t, limit, _s in trace if limit > 0)
    assert 5_000 < cut_at <= 6_000


def _flood_at(at_ms: int, demand: float, victim: SimTenant, flood: SimTenant, marks: dict[int, float]):
    """A schedule: the flood starts at ``at_ms``; ``marks`` gets what it had sent every 500 ms from then."""

    def schedule(now, tenants, broker):
        if now == at_ms:
            flood.demand = demand
        if now >= at_ms and (now - at_ms) % 500 == 0:
            marks[now - at_ms] = flood.sent

    return schedule


def _flood_beside_victim(slow_start: bool) -> tuple[dict[int, float], float, BrokerLoad]:
    """A 60-MiB/s flood of 1-MB requests starting at 5 s beside a victim settled since 0, on a 20-MiB/s broker: what
    the flood had sent every 500 ms from its start, the victim's worst service time in that first second, the
    broker."""
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 0.0, 1_000_000)
    marks: dict[int, float] = {}
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB, slow_start=slow_start))
    _fs, b, _trace = run(
        [victim, flood], SimBroker(20 * MIB), 7, fs=fs, schedule=_flood_at(5_000, 60 * MIB, victim, flood, marks)
    )
    half = len(victim.delays_ms) * 5 // 7  # the victim sends evenly: its requests from 5 s on
    return marks, max(victim.delays_ms[half : half + 200]), b


def test_a_flood_beside_a_settled_victim_is_paced_from_its_first_request():
    # Slow start (SURGE_FACTOR): before any signal the flood gets a megabyte a second, doubled while the delay stays
    # low, and the control law takes over from there; issue 48's bench saw 47-85 MiB forwarded in a real flood's
    # first second without it.
    marks, worst, b = _flood_beside_victim(slow_start=True)
    assert b.starts >= 1
    assert marks[500] <= 4_000_000, marks
    assert worst < 100, "no standing queue of the flood's first requests"
    assert b.limit > 0, "the control law took over from the start"


def test_without_slow_start_the_same_flood_goes_in_unpaced():
    # The bounds of the test above can fail: with slow_start off, the same flood's first half second is
    # several times them, and so is the victim's worst.
    marks, worst, b = _flood_beside_victim(slow_start=False)
    assert b.starts == 0
    assert marks[500] >= 10_000_000, marks
    assert worst >= 200


def test_a_burst_that_fits_is_released_within_a_second_and_never_limited():
    # A new steady producer beside a settled one, well within what the broker takes: slow started, its rate doubles
    # each quiet tick, and it is unpaced once its work fits; the broker is never limited.
    victim = SimTenant("victim", 200 * KIB, KIB)
    steady = SimTenant("steady", 0.0, 64 * KIB)
    marks: dict[int, float] = {}
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))
    _fs, b, trace = run(
        [victim, steady], SimBroker(40 * MIB), 15, fs=fs, schedule=_flood_at(5_000, 4 * MIB, victim, steady, marks)
    )
    assert b.starts >= 1
    assert all(limit == 0 for _t, limit, _s in trace)
    assert not b.starting and not b.tenants["steady"].paced
    sent = marks[10_000 - 500] - marks[0] if 9_500 in marks else 0.0
    assert sent >= 0.95 * 4 * MIB * 9.5, sent  # it kept its rate over the 10 s after it began


def test_a_tenant_alone_is_never_slow_started():
    flood = SimTenant("flooder", 0.0, 1_000_000)
    marks: dict[int, float] = {}
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))
    _fs, b, _trace = run(
        [flood], SimBroker(20 * MIB), 8, fs=fs, schedule=_flood_at(5_000, 60 * MIB, flood, flood, marks)
    )
    assert b.starts == 0 and flood.held_requests == 0


def test_tenants_that_start_together_share_one_start():
    victim = SimTenant("victim", 200 * KIB, KIB)
    floods = [SimTenant(f"flood-{i}", 0.0, 256 * KIB) for i in range(20)]
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))
    sent: dict[str, float] = {}

    def schedule(now, tenants, broker):
        if now == 5_000:
            for f in floods:
                f.demand = 3 * MIB
        if now == 5_300:
            sent["first 300 ms"] = sum(f.sent for f in floods)

    _fs, b, _trace = run([victim, *floods], SimBroker(20 * MIB), 6, fs=fs, schedule=schedule)
    assert b.starts >= 2
    # twenty 256-KiB requests go before each is paced; after that they share one start rate, not twenty
    assert sent["first 300 ms"] < 20 * 256 * KIB + 2 * MIB, sent


def test_a_broker_that_slows_down_gets_a_lower_limit():
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 60 * MIB, 256 * KIB)

    def schedule(now, tenants, broker):
        if now == 20_000:
            broker.capacity = 8 * MIB

    _fs, _b, trace = run([victim, flood], SimBroker(24 * MIB), 40, schedule=schedule)
    before = statistics.mean(limit for t, limit, _s in trace if 12_000 < t <= 20_000)
    after = statistics.mean(limit for t, limit, _s in trace if t > 32_000)
    assert after < 0.7 * before


def test_when_the_victim_leaves_the_flooder_is_released():
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 40 * MIB, 256 * KIB)

    def schedule(now, tenants, broker):
        if now == 15_000:
            victim.demand = 0.0

    _fs, b, trace = run([victim, flood], SimBroker(20 * MIB), 25, schedule=schedule)
    assert any(limit > 0 for t, limit, _s in trace if t < 15_000)
    released = [t for t, limit, _s in trace if t > 15_000 and limit == 0]
    assert released and released[0] < 15_000 + 3_000  # inactive after 2 s, released at the next tick
    assert b.limit == 0


def test_twenty_client_ids_share_the_same_limit_as_one():
    victim = SimTenant("victim", 200 * KIB, KIB)
    floods = [SimTenant(f"flood-{i}", 3 * MIB, 64 * KIB) for i in range(20)]
    _fs, b, trace = run([victim, *floods], SimBroker(20 * MIB), 30)
    assert victim.held_requests == 0
    settled = victim.delays_ms[len(victim.delays_ms) // 2 :]
    assert statistics.median(settled) < 0.5 + 2.0 * 3
    assert b.limit > 0


class NoisyBroker(SimBroker):
    """A broker whose answers are late for reasons no limit removes (another process on its host): three in five
    take 50 ms more, whatever it is given."""

    def __init__(self, capacity: float) -> None:
        super().__init__(capacity)
        self.n = 0

    def admit(self, work: float) -> float:
        self.n += 1
        return super().admit(work) + (50.0 if self.n % 5 < 3 else 0.0)


def test_a_delay_no_limit_lowers_stops_the_limit_at_its_floor():
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 40 * MIB, 256 * KIB)
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))
    _fs, b, trace = run([victim, flood], NoisyBroker(20 * MIB), 20, fs=fs)
    late = [limit for t, limit, _s in trace if t > 5_000]
    assert all(limit > 0 for limit in late)
    floor = b.tenants["victim"].demand + 1 * MIB
    assert min(late) >= 0.9 * floor  # never below what the victim uses plus the floor for the rest
    assert min(late) < 2 * floor  # and it did go down there: the delay never came under the target
    assert victim.held_requests == 0


def test_samples_of_requests_sent_before_a_change_are_ignored():
    fs = FairShare(FairShareSettings())
    b = fs.broker("b", 0)
    for i in range(MIN_BASELINE_SAMPLES):
        b.sample(0, 1.0, i / 1000, i / 1000)
    b.delays.clear()
    b.changed_s = 1.0
    b.sample(0, 50.0, 0.999, 1.1)  # sent before the change: its delay belongs to the old limit
    assert b.delays == []
    b.sample(0, 50.0, 1.0, 1.1)
    assert b.delays == [49.0]


def test_in_a_fleet_a_lone_flooder_is_limited_while_another_member_protects_a_light_tenant():
    # This member sees only the flooder; another member of the fleet has the victim on the same broker.
    flood = SimTenant("flooder", 40 * MIB, 256 * KIB)
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=512 * KIB))
    b = fs.broker("broker 1", 0)
    fs.note_remote("member-b", {"broker 1": 200 * KIB}, members=2, until_ms=8_000)
    _fs, b, trace = run([flood], SimBroker(20 * MIB), 15, fs=fs)
    assert any(limit > 0 for t, limit, _s in trace if t < 8_000), "held while the other member's victim counts"
    assert b.members == 2
    assert all(limit == 0 for t, limit, _s in trace if t > 8_500), "released once that report ran out"
    assert fs.light() == {}  # nothing light of its own to tell the others


def test_in_a_fleet_the_target_is_half_the_smallest_baseline_any_member_measured():
    # This member sees only 1-MB batches (a 20-ms baseline): on its own its target would be 10 ms; the victim's
    # member measures small requests at 2 ms, so, while its report counts, the target here is 1 ms.
    fs = FairShare(FairShareSettings(target_delay_ms=0.5, min_limit=MIB))
    b = fs.broker("broker 1", 0)
    t = fs.tenant(b, "flooder", 0)

    def tick(now_ms: int) -> None:
        for i in range(5):
            b.charge(t, MIB, now_ms)
            b.sample(5, 20.0 + i * 0.1, now_ms / 1000 - 0.05, now_ms / 1000)
        fs.tick(now_ms)

    epoch = BASELINE_EPOCH_MS  # the baseline is trusted once it has lived a whole epoch
    for now in range(0, epoch + 1_000, 100):
        tick(now)
    assert b.base == pytest.approx(20.0) and b.target == pytest.approx(10.0)
    fs.note_remote("member-a", {"broker 1": 200 * KIB}, members=2, until_ms=epoch + 3_000, base={"broker 1": 2.0})
    tick(epoch + 1_000)
    assert b.target == pytest.approx(1.0)
    fs.note_remote("member-a", {"broker 1": 200 * KIB}, members=2, until_ms=epoch + 3_000, base={"broker 1": 40.0})
    tick(epoch + 1_100)
    assert b.target == pytest.approx(10.0), "a longer baseline elsewhere does not loosen this member's target"
    fs.note_remote("member-a", {"broker 1": 200 * KIB}, members=2, until_ms=epoch + 3_000, base={"broker 1": 2.0})
    tick(epoch + 3_000)
    assert b.target == pytest.approx(10.0), "the report has lapsed"


def test_a_baseline_learnt_in_the_first_epoch_does_not_raise_the_target():
    """A fresh proxy in a flood learns its baselines from requests already queued behind it (8-87 ms in issue 48's
    bench): half of that as the target held the flood for seconds. Until a class's minimum has lived a whole epoch the
    target is the configured one; then a slow broker's quickest requests raise it as before."""
    fs = FairShare(FairShareSettings(target_delay_ms=1.0, min_limit=MIB))
    b = fs.broker("broker 1", 0)
    t = fs.tenant(b, "flooder", 0)
    targets: dict[int, float] = {}
    for now in range(0, BASELINE_EPOCH_MS + 1_000, 100):
        for i in range(5):
            b.charge(t, 256 * KIB, now)
            b.sample(1, 40.0 + i, now / 1000 - 0.05, now / 1000)
        fs.tick(now)
        targets[now] = b.target
    assert b.base == pytest.approx(40.0)
    assert all(d == pytest.approx(1.0) for now, d in targets.items() if now < BASELINE_EPOCH_MS)
    assert targets[BASELINE_EPOCH_MS + 900] == pytest.approx(20.0)


def test_a_member_tells_the_fleet_where_it_has_light_tenants():
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 40 * MIB, 256 * KIB)
    fs, _b, _trace = run([victim, flood], SimBroker(20 * MIB), 10)
    light = fs.light()
    assert set(light) == {"broker 1"}
    assert light["broker 1"] == pytest.approx(fs.brokers["broker 1"].tenants["victim"].demand)
    assert fs.baselines() == {}, "no baseline has lived a whole epoch yet: none is told"
    fs, _b, _trace = run([victim, flood], SimBroker(20 * MIB), BASELINE_EPOCH_MS // 1000 + 5)
    b = fs.brokers["broker 1"]
    assert set(fs.baselines()) == {"broker 1"} and fs.baselines()["broker 1"] == b.trusted_base
    assert 0 < b.trusted_base < math.inf


def test_in_a_fleet_a_member_tells_the_others_of_a_lone_tenant_too_small_to_compare():
    # Alone on its member, a victim has nobody to be light against: on its own a proxy never limits it, and tells
    # nothing; in a fleet it is told as light, being too small to compare (FLEET_LIGHT), so that the member with the
    # flooder limits it. A lone flooder, far above that, is never told.
    def alone(tenant: SimTenant, members: int) -> dict[str, float]:
        fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=MIB))
        fs.set_members(members)
        fs, _b, trace = run([tenant], SimBroker(20 * MIB), 5, fs=fs)
        assert all(limit == 0 for _t, limit, _s in trace)  # a lone tenant is never limited, in a fleet or not
        return fs.light()

    # 100 KiB/s of 1-KiB requests: 200 KiB/s of work (REQUEST_WORK a request), below half of 1 MiB / 2 members
    assert alone(SimTenant("victim", 100 * KIB, KIB), 1) == {}
    told = alone(SimTenant("victim", 100 * KIB, KIB), 2)
    assert set(told) == {"broker 1"} and told["broker 1"] == pytest.approx(200 * KIB, rel=0.1)
    assert alone(SimTenant("victim", 100 * KIB, KIB), 4) == {}  # over half its part of the floor of four (128 KiB)
    assert alone(SimTenant("flooder", 40 * MIB, 256 * KIB), 2) == {}


def test_two_members_protect_a_victim_on_one_from_a_flooder_on_the_other():
    """The whole loop over a fleet of two: member A has only the victim, member B only the flooder, both in front of
    the same broker; each tick each member reads the other's light(). Without the reports (each alone) nobody is
    limited and the victim waits behind the flood; with them B limits the flooder and the victim's delay falls."""
    settings_ = FairShareSettings(target_delay_ms=2.0, min_limit=MIB)

    def fleet(share: bool) -> tuple[list[float], list[float], FairShare]:
        broker = SimBroker(20 * MIB)
        victim, flood = SimTenant("victim", 100 * KIB, KIB), SimTenant("flooder", 40 * MIB, 256 * KIB)
        members = [FairShare(settings_), FairShare(settings_)]
        for fs in members:
            fs.set_members(2)
        loads = [fs.broker("broker 1", 0) for fs in members]
        pairs = [(victim, members[0], loads[0]), (flood, members[1], loads[1])]
        handles = [fs.tenant(b, t.name, 0) for t, fs, b in pairs]
        for now in range(0, 20_000, 10):
            broker.serve(0.01)
            for (t, _fs, b), h in zip(pairs, handles, strict=True):
                if t.held_mark >= 0:
                    if b.wait_ms(h, t.held_mark, now) > 1:
                        continue
                    t.held_mark = -1.0
                    t.delays_ms.append(broker.admit(t.size))
                    b.sample(sample_class(0, -1, t.size), t.delays_ms[-1], now / 1000, now / 1000)
                    continue
                t.credit += t.demand / 100
                while t.credit >= t.size and t.held_mark < 0:
                    t.credit -= t.size
                    mark = b.charge(h, float(t.size + REQUEST_WORK), now)
                    if b.wait_ms(h, mark, now) > 1:
                        t.held_mark = mark
                        t.held_requests += 1
                        t.credit = min(t.credit, t.size)
                        break
                    t.delays_ms.append(broker.admit(t.size))
                    b.sample(sample_class(0, -1, t.size), t.delays_ms[-1], now / 1000, now / 1000)
            if (now + 10) % TICK_MS == 0:
                for fs in members:
                    fs.tick(now + 10)
                if share:  # (a real member hears every second, and the report counts for three)
                    members[1].note_remote("a", members[0].light(), 2, now + 3_000)
                    members[0].note_remote("b", members[1].light(), 2, now + 3_000)
        late = victim.delays_ms[len(victim.delays_ms) // 2 :]
        return late, flood.delays_ms, members[1]

    late, _flood, b = fleet(share=False)
    assert b.brokers["broker 1"].cuts == 0 and statistics.median(late) > 100  # nobody to protect: the victim waits
    late, flood_delays, b = fleet(share=True)
    assert b.brokers["broker 1"].cuts > 0  # B limited the flooder for A's victim
    assert statistics.quantiles(late, n=100)[98] < 20, statistics.quantiles(late, n=100)[98]
    assert len(flood_delays) > 100  # held to a share, not starved


def test_in_a_fleet_two_members_whose_lone_tenants_are_both_small_limit_neither():
    # Each is told of the other's small tenant; one proxy holding both would see two tenants alike and limit neither,
    # so neither member does, even with the broker slow for reasons of its own.
    settings_ = FairShareSettings(target_delay_ms=2.0, min_limit=MIB)
    fs = FairShare(settings_)
    fs.set_members(2)
    fs.broker("broker 1", 0)
    fs.note_remote("other", {"broker 1": 200 * KIB}, members=2, until_ms=60_000)
    _fs, b, trace = run([SimTenant("small", 100 * KIB, KIB)], SimBroker(80 * KIB), 10, fs=fs)
    assert b.q_avg > settings_.target_delay_ms  # saturated
    assert b.remote_light and all(limit == 0 for _t, limit, _s in trace) and b.cuts == 0
    assert set(fs.light()) == {"broker 1"}  # and still tells the other it has somebody small here


@pytest.mark.parametrize(("victim_kib_s", "flood_ids"), [(800, 1), (400, 20)])
def test_a_victim_near_the_floor_never_lets_the_broker_flap_open(victim_kib_s, flood_ids):
    """A limit cut to its floor must leave the light tenants in the sparse room (SPARSE_TOTAL of the limit): the floor
    was their demand plus ``min_limit``, under which a victim using more than ``min_limit`` overflowed the room, was
    classed heavy, left nobody to protect, and the broker was released into the flood, again and again (27 releases
    and a settled median of 108 ms for the first case before the fix)."""
    victim = SimTenant("victim", victim_kib_s * KIB, KIB)
    floods = [SimTenant(f"flood-{i}", 40 * MIB / flood_ids, 64 * KIB) for i in range(flood_ids)]
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=64 * KIB))
    _fs, _b, trace = run([victim, *floods], SimBroker(20 * MIB), 30, fs=fs)
    first = next(i for i, (_t, limit, _s) in enumerate(trace) if limit > 0)
    pairs = zip(trace[first:-1], trace[first + 1 :], strict=True)
    released = [t for (t, before, _s), (_t2, after, _s2) in pairs if before > 0 and after == 0]
    assert released == []
    assert victim.held_requests == 0
    assert statistics.median(victim.delays_ms[len(victim.delays_ms) // 2 :]) < 0.5 + 2.0 * 3


def test_twenty_new_client_ids_are_not_twenty_graces():
    """Tenants new on a limited broker are paced at no less than a grace share until their demand is known, but they
    count at it against the sparse room: twenty client ids that start at once make at most a few of them sparse; the
    others are heavy, paced at the level."""
    fs = FairShare(FairShareSettings(min_limit=64 * KIB))
    b = fs.broker("b", 0)
    victim = fs.tenant(b, "victim", 0)
    b.limit = b.peak = 10 * MIB
    b.level = 1 * MIB
    victim.demand = 100 * KIB
    new = [fs.tenant(b, f"flood-{i}", 60_000) for i in range(20)]
    for t in [victim, *new]:
        t.last_ms = 60_000
    b._classify([victim, *new], b.limit, 60_000)
    assert victim.sparse
    sparse_new = [t for t in new if t.sparse]
    assert 1 <= len(sparse_new) <= 4  # SPARSE_TOTAL / GRACE_SHARE, less what the victim uses


def test_a_tenant_held_longer_than_the_active_window_still_counts():
    """Twenty client ids of 1-MB requests paced at a low share each wait longer than ACTIVE_MS for their next request:
    counted idle, they left the victim alone on the broker, which was released into them (four releases in 30 s
    before the fix, the victim's settled p99 near 300 ms)."""
    victim = SimTenant("victim", 200 * KIB, KIB)
    floods = [SimTenant(f"flood-{i}", 3 * MIB, 1_000_000) for i in range(20)]
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))
    _fs, _b, trace = run([victim, *floods], SimBroker(60 * MIB), 30, fs=fs)
    first = next(i for i, (_t, limit, _s) in enumerate(trace) if limit > 0)
    assert all(limit > 0 for _t, limit, _s in trace[first:])
    assert victim.held_requests == 0


@pytest.mark.parametrize("busy_elsewhere", [True, False])
def test_a_flooder_that_pauses_is_not_met_unlimited_when_it_returns(busy_elsewhere):
    """A librdkafka producer whose queue is full of another broker's batches sends nothing to this one for seconds:
    only the victim is active here then. Releasing the broker there let the flood back in unlimited (the real runs
    logged "released 3-12x" a 40-s flood; here the victim's p99 in the 5 s after the flood resumed was 243 ms before
    the fix). The limit holds while the flooder, held here lately, is busy on another broker. The control: a flooder
    that goes quiet everywhere has left, and the victim alone is released at once (a one-broker cluster, or a fresh
    cluster's slow first seconds where a client creating topics was held: the fair-share demo then showed "limiting"
    beside its light producer alone); a victim that leaves releases the flooder at once
    (test_when_the_victim_leaves_the_flooder_is_released)."""
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 60 * MIB, 256 * KIB)
    marks: dict[str, int] = {}
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))

    def schedule(now, tenants, broker):
        if now == 15_000:
            flood.demand = 0.0
        elif now == 18_000:
            flood.demand = 60 * MIB
            marks["resume"] = len(victim.delays_ms)
        elif now == 23_000:
            marks["end"] = len(victim.delays_ms)
        if busy_elsewhere and 15_000 <= now < 18_000:
            fs.tenant(fs.broker("broker 2", now), "flooder", now).last_ms = now  # sending there meanwhile

    _fs, _b, trace = run([victim, flood], SimBroker(20 * MIB), 25, fs=fs, schedule=schedule)
    pause = [limit for t, limit, _s in trace if 15_000 <= t < 18_000]
    if busy_elsewhere:
        assert all(limit > 0 for t, limit, _s in trace if 5_000 <= t <= 25_000)
        after = sorted(victim.delays_ms[marks["resume"] : marks["end"]])
        # The resumed flood is paced: what it may send at once is its bucket's burst (burst_seconds of the limit in
        # force when it paused), which the victim may queue behind; unlimited, the queue only grows (243 ms).
        limit = next(limit for t, limit, _s in trace if t >= 17_900)
        burst_ms = fs.settings.burst_seconds * limit / (20 * MIB) * 1000
        assert after[int(0.99 * (len(after) - 1))] < 0.5 + 2.0 * 10 + burst_ms
    else:
        assert pause[0] > 0 and pause[-1] == 0  # released once the flooder was no longer active (ACTIVE_MS)
    assert victim.held_requests == 0


@pytest.mark.parametrize("held_on_another_broker", [True, False])
def test_a_broker_is_not_released_while_its_flooder_is_held_on_another(held_on_another_broker):
    """A producer held on one broker trickles to the others (its one queue is full of the held broker's batches):
    there it is neither held nor gone, and after RELEASE_MS of a low delay the broker was released into its return.
    It stays limited while that tenant is held on another broker; with nothing held elsewhere (the control) the same
    trickle releases it as before."""
    victim = SimTenant("victim", 200 * KIB, KIB)
    flood = SimTenant("flooder", 60 * MIB, 64 * KIB)
    fs = FairShare(FairShareSettings(target_delay_ms=2.0, min_limit=1 * MIB))

    def schedule(now, tenants, broker):
        if now == 10_000:
            flood.demand = 256 * KIB  # a trickle, below any level it was paced at: sent, never held here
        if now >= 10_000 and held_on_another_broker and now % TICK_MS == 0:
            other = fs.broker("broker 2", now)
            t = fs.tenant(other, "flooder", now)
            t.held_ms = t.last_ms = now  # held back there (what BrokerLoad.charge records of a request in debt)

    _fs, b, trace = run([victim, flood], SimBroker(20 * MIB), 30, fs=fs, schedule=schedule)
    assert any(limit > 0 for t, limit, _s in trace if t < 10_000)  # the flood was limited
    late = [limit for t, limit, _s in trace if t >= 25_000]
    if held_on_another_broker:
        assert all(limit > 0 for limit in late)
    else:
        assert all(limit == 0 for limit in late)


def test_slow_start_turned_off_ends_a_start_in_course():
    fs = FairShare(FairShareSettings(min_limit=1 * MIB))
    b = fs.broker("b", 0)
    victim = fs.tenant(b, "victim", 0)
    b.charge(victim, 10 * KIB, 0)
    fs.tick(100)
    flood = fs.tenant(b, "flood", 150)
    assert b.charge(flood, 1_000_000, 150) >= 0, "surging beside the victim: paced from its first batch"
    assert flood.starting and flood.paced
    fs.configure(FairShareSettings(min_limit=1 * MIB, slow_start=False))
    assert not flood.starting and not flood.paced and b.starting == []
    assert b.charge(flood, 1_000_000, 160) < 0, "off, a surge goes unpaced"


# ------------------------------------------------------------------------------------------ topic mutations
def _tenant_held_on(fs: FairShare, broker: str, key: str, now: int):
    """``key`` on ``broker``, which is limited and paces it at 64 KiB/s with its bucket emptied (held there)."""
    b = fs.broker(broker, now)
    t = fs.tenant(b, key, now)
    b.limit = 64 * KIB
    t.pace(64 * KIB, 0.1, now)
    b.charge(t, 64 * KIB, now)
    return t


def test_a_topic_mutation_waits_for_the_broker_where_its_tenant_is_held_not_only_the_one_it_asked():
    """A churn costs every broker (the controller's records reach them all): its work is charged to the tenant on
    each broker it is active on, and the request waits for the share it overdraws most. Before, it was charged on
    the broker it asked alone: open there, the create/delete loop ran at 49-63 mutations a second beside a flood
    that the other brokers held (issue 48's bench)."""
    fs = FairShare(FairShareSettings(min_limit=1 * MIB, slow_start=False))
    asked = fs.broker("broker 1", 0)
    admin = fs.tenant(asked, "flooder", 0)  # the flood's admin client: broker 1 is open
    held = _tenant_held_on(fs, "broker 2", "flooder", 0)
    idle = fs.broker("broker 3", 0)
    gone = fs.tenant(idle, "flooder", 0)
    gone.last_ms = -10_000  # left broker 3 long ago: not charged there
    before = held.work_total
    spread = 2 * 256 * KIB  # two topics
    t, mark = fs.charge_mutation(admin, 1024 + spread, spread, 100)
    assert t is held and mark >= 0, "it waits for broker 2's share"
    assert held.broker.wait_ms(held, mark, 100) > 5_000  # ~512 KiB over at 64 KiB/s
    assert held.work_total - before == spread and admin.work_total == 1024 + spread
    assert gone.work_total == 0.0
    assert fs.charge_mutation(admin, 1024, 0.0, 200) == (admin, -1.0), "no topics: its own broker alone"


def test_a_topic_mutation_goes_at_once_where_no_broker_holds_its_tenant():
    fs = FairShare(FairShareSettings(min_limit=1 * MIB, slow_start=False))
    mine = fs.tenant(fs.broker("broker 1", 0), "app", 0)
    elsewhere = fs.tenant(fs.broker("broker 2", 0), "app", 0)
    t, mark = fs.charge_mutation(mine, 1024 + 256 * KIB, 256 * KIB, 10)
    assert (t, mark) == (mine, -1.0)
    assert elsewhere.work_total == 256 * KIB  # counted as its demand there all the same
