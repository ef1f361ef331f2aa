"""quotas.fleet_leases: a fleet's leases never add up to more than the quota, whatever the demands, delays, losses
and deaths; a dead member's share comes back after a lease; an idle member starts at its floor at once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotas.entities import DEFAULT, BucketKey, QuotaEntity, QuotaStore
from quotas.fleet_leases import (
    FAREWELL_LEASE_MS,
    FLOOR_FRACTION,
    LEASE_MS,
    MAX_LEASE_MS,
    MIN_SHARE,
    NO_EPOCH,
    SKEW_MS,
    Grant,
    LeaseBook,
    LeasedStore,
    LeaseHolder,
    LeaseRecord,
    lease_id,
    max_min_fair,
)
from quotas.fleet_reports import ReportError
from quotas.fleet_sim import fleet
from quotas.manager import QuotaManager

Q = 1_000_000.0
MIB = 1_048_576.0


# ------------------------------------------------------------------------------------------------ max-min fair


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.floats(0, 3 * Q), min_size=1, max_size=8), min_size=1, max_size=5).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    ),
    st.floats(1.0, 10 * Q),
)
def test_max_min_fair_divides_no_more_than_the_quota_and_is_fair(rows, quota):
    demand = np.array(rows)
    b, m = demand.shape
    q = np.full(b, quota)
    alloc = max_min_fair(q, demand)
    floor = FLOOR_FRACTION * quota / m
    assert (alloc.sum(axis=1) <= q * (1 + 1e-9)).all()
    assert (alloc >= floor * (1 - 1e-9)).all()
    for row, got in zip(demand, alloc, strict=True):
        want = np.maximum(row, floor)
        short = got < want * (1 - 1e-6)
        if short.any():  # someone got less than it wanted: the quota is all given out...
            assert got.sum() == pytest.approx(quota, rel=1e-6)
            # ...and nobody got more than it unless it wanted no more than that (max-min)
            level = got[short].max()
            assert (got[~short] <= np.maximum(want[~short], level) * (1 + 1e-6)).all()
            assert np.allclose(got[short], level, rtol=1e-6)


def test_max_min_fair_example():
    got = max_min_fair(np.array([100.0]), np.array([[10.0, 200.0, 200.0, 0.0]]), floor_fraction=0.04)
    # floors of 1; the rest (96) water-filled: 9 to the first, 43.5 to each hungry one, none to the idle one
    assert got[0].tolist() == pytest.approx([10.0, 44.5, 44.5, 1.0])


# ------------------------------------------------------------------------------------------------ records


def test_lease_record_round_trips_and_refuses_malformed():
    rec = LeaseRecord(
        "m1",
        123,
        3,
        np.array([5, 1, 9], dtype="<u8"),
        np.array([10.0, 20.0, 30.0]),
        np.array([1.0, 2.0, 3.0]),
        np.array([4.0, 5.0, 6.0]),
    )
    back = LeaseRecord.decode(rec.encode())
    assert (back.member, back.ts_ms, back.members) == ("m1", 123, 3)
    assert back.ids.tolist() == [1, 5, 9]
    assert back.quota.tolist() == [20.0, 10.0, 30.0]
    assert back.hold.tolist() == [5.0, 4.0, 6.0]
    data = rec.encode()
    for bad in (data[:-1], b"KTP\x02" + data[4:], data[:20]):
        with pytest.raises(ReportError):
            LeaseRecord.decode(bad)
    neg = LeaseRecord("m", 1, 1, np.array([1], dtype="<u8"), np.array([-1.0]), np.array([0.0]), np.array([0.0]))
    with pytest.raises(ReportError):
        LeaseRecord.decode(neg.encode())


def test_a_member_takes_only_what_the_others_caps_leave():
    book = LeaseBook(250)
    ids = np.array([7], dtype="<u8")

    def rec(member, ts, demand, hold):
        return LeaseRecord(member, ts, 2, ids, np.array([Q]), np.array([demand]), np.array([hold]))

    book.take(rec("a", 0, Q, 0.5 * Q))
    g = book.take(rec("b", 1, Q, 0.5 * Q))
    assert g.shares.tolist() == []  # no bucket demanded at the boundary yet: no grant (b keeps its floor)
    book.take(rec("a", 250, Q, 0.5 * Q))  # a boundary: both demand the whole quota
    g = book.take(rec("b", 251, Q, 0.5 * Q))
    assert g.shares[0] == pytest.approx(0.5 * Q)
    # a says it now holds 0.9 Q (it should not, but the book counts what members say they hold): b gets 0.1 Q
    book.take(rec("a", 300, Q, 0.9 * Q))
    g = book.take(rec("b", 301, Q, 0.5 * Q))
    assert g.shares[0] == pytest.approx(0.1 * Q)


# ------------------------------------------------------------------------------------------------ the fleet


def _check(sim):
    """At most the quota, give or take the minimum share each member keeps (so that a throttle is finite)."""
    assert sim.max_ratio <= 1 + len(sim.members) * MIN_SHARE + 1e-9, sim.max_ratio


delays = st.one_of(st.none(), st.integers(0, 3_000))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lease=st.sampled_from([1_000, LEASE_MS]),  # a short one: leases run out between records
    n=st.integers(1, 5),
    buckets=st.integers(1, 2),
    seed=st.integers(0, 1 << 30),
    loss=st.floats(0, 0.5),
    max_write=st.integers(0, 1_500),
    max_read=st.integers(0, 1_500),
    phases=st.lists(
        st.tuples(st.integers(500, 3_000), st.lists(st.floats(0, 2 * Q), min_size=10, max_size=10)),
        min_size=1,
        max_size=4,
    ),
    kill=st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 8_000))),
    leaves=st.booleans(),
)
def test_the_shares_enforced_never_add_up_past_the_quota(
    lease, n, buckets, seed, loss, max_write, max_read, phases, kill, leaves
):
    """For any member set, demands (changing in phases), record delays and losses, clock skews within SKEW_MS
    and a member dying or stopping (its farewell record) at any time: at every step, every bucket, the live
    members' shares add up to at most the quota (the strict fallback: a member whose lease ran out enforces
    nothing)."""
    quotas = {i + 1: Q * (i + 1) for i in range(buckets)}

    def write(rng):
        return None if rng.random() < loss else rng.randint(0, max_write)

    sim = fleet(
        n,
        quotas,
        seed=seed,
        skew_ms=SKEW_MS // 2,
        write_delay=write,
        read_delay=lambda rng: rng.randint(0, max_read),
        lease_ms=lease,
    )
    t = 0
    for length, levels in phases:
        t += length

        def demand(now, member, lid, levels=levels):
            return levels[(int(member[1:]) * 3 + lid) % len(levels)]

        if kill is not None and t - length <= kill[1] < t and kill[0] < n:
            sim.run(kill[1], demand)
            if leaves:  # stopped: its farewell record (itself delayed or lost)
                sim.leave(f"m{kill[0]:03d}")
            else:
                sim.kill(f"m{kill[0]:03d}")
        sim.run(t, demand)
        _check(sim)


def test_all_hungry_members_split_the_quota_and_use_it():
    sim = fleet(4, {1: Q}, seed=3, skew_ms=100)
    sim.run(6_000, lambda now, m, lid: Q)
    _check(sim)
    assert sim.rate(1, 2_000, 6_000) > 0.99
    shares = [s[1] / Q for s in sim.shares().values()]
    assert shares == pytest.approx([0.25] * 4, abs=0.01)


def test_a_demand_shift_is_followed_within_two_seconds_without_going_over():
    sim = fleet(10, {1: Q}, seed=5, skew_ms=100, read_delay=lambda rng: rng.randint(50, 300))
    sim.run(5_000, lambda now, m, lid: Q if m in ("m000", "m001") else 0.0)
    assert sim.rate(1, 3_000, 5_000) > 0.9
    sim.run(10_000, lambda now, m, lid: Q if m in ("m008", "m009") else 0.0)  # the load moves elsewhere
    _check(sim)
    assert sim.rate(1, 7_000, 10_000) > 0.9  # followed within 2 s of the shift
    assert max(sim.rate(1, t, t + 250) for t in range(0, 10_000, 250)) <= 1.0 + 1e-6


def test_a_dead_members_share_returns_after_one_lease():
    sim = fleet(3, {1: Q}, seed=7, skew_ms=100, read_delay=lambda rng: rng.randint(20, 200))
    sim.run(4_000, lambda now, m, lid: Q if m == "m000" else 0.0)
    assert sim.shares()["m000"][1] > 0.9 * Q
    sim.kill("m000")
    back = LEASE_MS + SKEW_MS + 1_000  # a lease, the skew, then a boundary, a record and its read-back
    sim.run(4_000 + back, lambda now, m, lid: Q if m == "m001" else 0.0)
    _check(sim)
    assert sim.shares()["m001"][1] > 0.9 * Q
    assert sim.rate(1, 4_000 + back - 250, 4_000 + back) > 0.9


def _followed_in(seed: int, stop: str) -> int:
    """ms from m000, holding nearly all the quota, stopping (``leave``) or dying (``kill``) until m001's clients
    land over 0.9 x the quota in a 100-ms slice."""
    sim = fleet(3, {1: Q}, seed=seed, skew_ms=100, read_delay=lambda rng: rng.randint(20, 200))
    sim.run(4_000, lambda now, m, lid: Q if m == "m000" else 0.0)
    assert sim.shares()["m000"][1] > 0.9 * Q
    getattr(sim, stop)("m000")
    sim.run(4_000 + LEASE_MS + 2_000, lambda now, m, lid: Q if m == "m001" else 0.0)
    _check(sim)
    return next(t + 100 - 4_000 for t in range(4_000, sim.now - 100, 10) if sim.rate(1, t, t + 100) > 0.9)


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_a_member_that_stops_gives_its_share_back_sooner_than_one_that_dies(seed):
    """A rolling restart: a member stopping writes a farewell record (no demand, no hold, the shortest lease), so
    its share comes back at the first boundary after the allowed skew, not when its last lease runs out (the
    sim's quick records ask for ~1 s leases; a dead member's share took 1.5-1.9 s, a stopped one's 0.6-1.1 s)."""
    stopped, died = _followed_in(seed, "leave"), _followed_in(seed, "kill")
    assert stopped <= SKEW_MS + 1_000, stopped  # the skew, a boundary, a record of m001's and its read-back
    assert stopped < died, (stopped, died)


def test_a_farewell_record_demands_and_holds_nothing_and_asks_the_shortest_lease():
    sim = fleet(2, {1: Q, 2: Q}, seed=1)
    sim.run(2_000, lambda now, m, lid: Q)
    holder = sim.members[0].holder
    rec = LeaseRecord.decode(holder.farewell(2_000).encode())
    assert rec.ids.tolist() == [1, 2] and rec.quota.tolist() == [Q, Q]
    assert rec.demand.tolist() == [0.0, 0.0] and rec.hold.tolist() == [0.0, 0.0]
    assert (rec.unclaimed, rec.grant_epoch, rec.lease_ms) == (0.0, NO_EPOCH, FAREWELL_LEASE_MS)


def test_an_idle_member_admits_at_its_floor_at_once():
    sim = fleet(4, {1: Q}, seed=9, skew_ms=100)
    sim.run(3_000, lambda now, m, lid: Q if m == "m000" else 0.0)
    floor = FLOOR_FRACTION * Q / 4
    assert sim.shares()["m003"][1] == pytest.approx(floor, rel=0.01)
    before = len(sim.landed[1])
    sim.run(3_010, lambda now, m, lid: Q)  # m003's clients start: admitted in the very first step
    assert sim.landed[1][before] >= (0.9 * Q + floor) * sim.step_ms / 1000 * 0.99
    _check(sim)


def test_a_throttled_member_keeps_asking_for_more_while_its_clients_are_muted():
    """With Kafka's enforcement a throttled client is muted for whole intervals: no usage then is not "wants
    less". Its demand stays the quota until its wait is over; then, idle, it falls to its recent usage."""
    from quotas.fleet_leases import LeaseHolder

    h = LeaseHolder("m")
    h.observe({1: (Q / 4, Q)}, 1_000, held={1: 900})  # throttled: muted for 900 ms
    assert h.record(1_000).demand.tolist() == [Q]
    h.in_flight = None
    h.observe({}, 1_250)  # muted: no usage
    assert h.record(1_250).demand.tolist() == [Q]
    h.in_flight = None
    h.observe({}, 2_000)  # the wait is over and it sent nothing: it wants less
    assert h.record(2_000).demand[0] < 0.5 * Q


@pytest.mark.parametrize("seed", range(3))
def test_heavy_tailed_delays_reorder_records_without_going_over(seed):
    """Records delayed log-normally (p50 0.22 s, p99 1.45 s: the loaded 100-member fleet's) land out of their
    writers' order; a late, older record must not replace a newer one in the book (it once made the book drop a
    member that still held its share: 1.008 x the quota)."""
    import math
    import random

    rng = random.Random(seed)
    sigma = math.log(1450 / 220) / 2.326
    pool = [max(1, round(rng.lognormvariate(math.log(220), sigma))) for _ in range(4096)]
    sim = fleet(3, {1: Q}, seed=seed, skew_ms=50, write_delay=lambda r: r.choice(pool), read_delay=lambda r: 0)
    sim.run(30_000, lambda now, m, lid: Q)
    sim.run(45_000, lambda now, m, lid: 1.5 * Q if m != "m000" else 0.0)
    _check(sim)
    assert sim.rate(1, 10_000, 30_000) > 0.95


def test_a_bucket_nobody_holds_is_split_so_a_first_burst_is_served_at_once():
    """KIP-599's first burst, a first large Produce: a bucket no member holds more than its floor of is split
    equally among the live members (the unclaimed quota), so a member's first client gets quota / N at once, not
    the floor; once it demands more, the others give their parts up and it holds nearly all, never adding up past
    the quota on the way."""
    sim = fleet(3, {1: Q}, seed=11, skew_ms=100, read_delay=lambda rng: rng.randint(20, 100))
    sim.run(2_000, lambda now, m, lid: 0.0)  # nobody uses the bucket
    assert [s[1] / Q for s in sim.shares().values()] == pytest.approx([1 / 3] * 3, rel=1e-6)
    before = len(sim.landed[1])
    sim.run(2_010, lambda now, m, lid: Q if m == "m000" else 0.0)
    assert sim.landed[1][before] == pytest.approx(Q / 3 * sim.step_ms / 1000, rel=1e-6)  # at once
    sim.run(4_000, lambda now, m, lid: Q if m == "m000" else 0.0)
    _check(sim)
    assert sim.shares()["m000"][1] >= (1 - FLOOR_FRACTION) * Q * 0.999
    assert sim.rate(1, 3_000, 4_000) > 0.94


def test_a_member_joining_takes_its_unclaimed_part_only_as_the_others_give_theirs_up():
    sim = fleet(4, {1: Q}, seed=12, skew_ms=100)
    late = sim.members.pop()  # m003 starts writing a second later
    sim.run(1_000, lambda now, m, lid: 0.0)
    assert [s[1] / Q for s in sim.shares().values()] == pytest.approx([1 / 3] * 3, rel=1e-6)
    sim.members.append(late)
    sim.run(3_000, lambda now, m, lid: 0.0)
    _check(sim)
    assert [s[1] / Q for s in sim.shares().values()] == pytest.approx([1 / 4] * 4, rel=1e-6)


def test_a_record_states_its_unclaimed_share_grant_epoch_and_lease():
    rec = LeaseRecord("m", 5, 2, np.empty(0, dtype="<u8"), *(np.empty(0),) * 3, 0.25, 17, 1_500)
    back = LeaseRecord.decode(rec.encode())
    assert (back.unclaimed, back.grant_epoch, back.lease_ms) == (0.25, 17, 1_500)
    for bad in (replace(rec, unclaimed=1.5), replace(rec, lease_ms=0), replace(rec, lease_ms=MAX_LEASE_MS + 1)):
        with pytest.raises(ReportError):
            LeaseRecord.decode(bad.encode())


def test_a_member_asks_for_a_lease_of_an_interval_and_four_round_trips_within_bounds():
    from quotas.fleet_leases import MIN_LEASE_MS, LeaseHolder

    h = LeaseHolder("m", interval_ms=250)
    assert h.lease_for() == LEASE_MS  # nothing measured yet: the longest
    h.round_trips.extend([40, 60, 50])
    assert h.lease_for() == MIN_LEASE_MS  # 250 + 4 x 60 < 1 s
    h.round_trips.append(300)
    assert h.lease_for() == 250 + 4 * 300
    h.in_flight, h.written_ms = 1, 1
    assert h.due(1 + h.lost_ms)  # a lost record: long leases for a while
    assert h.lease_for() == LEASE_MS


@pytest.mark.parametrize("seed", range(6))
def test_members_joining_a_bucket_one_after_another_never_drop_below_their_floor(seed):
    """A bucket enters the book as one member demands it while the others still enforce their unclaimed parts of
    it; as they demand it too, no share may fall to nothing (a throttle against nothing is endless): a cap counts
    the share a member takes, not the target the others' caps cut (with seed 0 that left a member 10^-6 of the
    quota, and a Java producer behind it timed out)."""
    import random

    rng = random.Random(seed)
    sim = fleet(
        3,
        {1: Q},
        seed=seed,
        skew_ms=50,
        read_delay=lambda r: r.randint(10, 150),
        write_delay=lambda r: r.randint(5, 100),
    )
    sim.run(2_000, lambda now, m, lid: 0.0)
    starts = {f"m{i:03d}": 2_000 + rng.randint(0, 600) for i in range(3)}
    lowest = Q
    for t in range(2_010, 4_000, 10):
        sim.run(t, lambda now, m, lid: Q if now >= starts[m] else 0.0)
        lowest = min(lowest, *(s[1] for s in sim.shares().values()))
    _check(sim)
    assert lowest >= FLOOR_FRACTION * Q / 3 * 0.999


# ------------------------------------------------------------------------------------------------ the store


def _leased_manager(share: float, members: int = 3):
    """A fleet member's manager over a store with alice's producer_byte_rate at 1 MiB/s, its holder granted
    ``share`` of alice's bucket (or, with ``share`` None, no grant yet: it enforces its floor)."""
    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", MIB)
    holder = LeaseHolder("m", fallback="floor")
    holder.members_seen = members
    if share is not None:
        rec = holder.record(0)
        lid = lease_id("producer_byte_rate", BucketKey("alice", ""))
        ids, shares, quotas = np.array([lid], dtype="<u8"), np.array([share]), np.array([MIB])
        grant = Grant(ids, shares, quotas, LEASE_MS, FLOOR_FRACTION / members, unclaimed=1 / members)
        assert holder.read_back(rec, grant, members, 0)
    qm = QuotaManager(LeasedStore(store, holder, lambda: 10))
    return store, qm


def _limits(qm, now_ms=10, top=None):
    """(metric name, user, client id) -> value, for the two limit series."""
    return {(n, u, c): v for _g, n, u, c, _s, v in qm.samples(now_ms, top) if n in ("quota-limit", "lease-limit")}


def test_a_leased_bucket_exports_its_quota_and_its_lease_as_two_series():
    """Issue 48: ``ktp_produce_quota_limit`` showed the member's lease (17,476 B/s, the idle floor of a fleet of
    three, after an alter to 1 MiB/s), not the quota; the lease is a series of its own."""
    store, qm = _leased_manager(MIB / 4)
    c = qm.charge_rate("producer_byte_rate", "alice", "c", "", 1.0, 10)
    assert c.limit == MIB / 4  # the member enforces its lease, as before
    assert _limits(qm) == {("quota-limit", "alice", ""): MIB, ("lease-limit", "alice", ""): MIB / 4}


def test_a_member_without_a_grant_exports_its_floor_as_its_lease_and_an_alter_at_once_as_the_quota():
    store, qm = _leased_manager(None)
    qm.charge_rate("producer_byte_rate", "alice", "c", "", 1.0, 10)
    floor = FLOOR_FRACTION / 3 * MIB
    assert _limits(qm) == pytest.approx({("quota-limit", "alice", ""): MIB, ("lease-limit", "alice", ""): floor})
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", 2 * MIB)
    # The quota as configured now, before any request binds again; the lease as the bucket last enforced it.
    assert _limits(qm) == pytest.approx({("quota-limit", "alice", ""): 2 * MIB, ("lease-limit", "alice", ""): floor})


def test_a_scrape_capped_by_top_names_both_limits_and_folds_neither():
    store, qm = _leased_manager(MIB / 4)
    store.set(QuotaEntity(user=DEFAULT), "producer_byte_rate", MIB)
    for i in range(20):
        qm.charge_rate("producer_byte_rate", f"u{i}", "c", "", 1.0 + i, 10)
    limits = _limits(qm, top=5)
    assert {u for _n, u, _c in limits} == {f"u{i}" for i in range(15, 20)}
    assert {n for n, _u, _c in limits} == {"quota-limit", "lease-limit"} and len(limits) == 10
    assert all(v == MIB for (n, _u, _c), v in limits.items() if n == "quota-limit")


def test_the_two_limits_are_exported_as_ktp_group_quota_limit_and_lease_limit():
    from prometheus_client import generate_latest

    from proxy import metrics
    from proxy.stats import Stats

    _store, qm = _leased_manager(MIB / 4)
    qm.charge_rate("producer_byte_rate", "alice", "c", "", 1.0, 10)
    text = generate_latest(metrics.make_registry(Stats(), lambda: 0, lambda: list(qm.samples(10)))).decode()
    assert 'ktp_produce_quota_limit{client_id="",scope="",user="alice"} 1.048576e+06' in text
    assert 'ktp_produce_lease_limit{client_id="",scope="",user="alice"} 262144.0' in text
    assert "# HELP ktp_produce_lease_limit The limit this fleet member enforces" in text
