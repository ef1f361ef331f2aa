"""Quota scope fleet, the pure half (issue 16, item 2): ledgers, reports, and folding remote usage in."""

from __future__ import annotations

import contextlib
import json
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.entities import QuotaEntity, QuotaStore
from quotas.fleet_reports import (
    MAGIC,
    MAX_ENTRIES,
    MAX_REPORT_BYTES,
    NAMES_REFRESH_MS,
    FleetFold,
    FleetLedger,
    ReportError,
    Usage,
    UsageReport,
    bucket_id,
)
from quotas.kinds import BY_KEY
from quotas.manager import QuotaManager


def _member(limit: float = 500.0) -> QuotaManager:
    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", limit)
    store.set(QuotaEntity(user="alice"), "controller_mutation_rate", 10)
    return QuotaManager(store, ledger=FleetLedger())


_folds: dict[int, FleetFold] = {}  # per receiving manager: the names it learnt stay with it, as on a member


def _sync(src: QuotaManager, dst: QuotaManager, now_ms: int) -> None:
    fold = _folds.setdefault(id(dst), FleetFold())
    assert src.ledger is not None  # a fleet member's manager (_manager)
    for report in src.ledger.drain("src", now_ms):
        fold.add(UsageReport.decode(report.encode()))
    for usage in fold.drain():
        dst.apply_remote(usage, now_ms)


def test_two_members_together_hit_the_single_member_reference_vector():
    # the reference vector of test_quota_manager, split over two members that sync every second
    a, b = _member(), _member()
    for s in range(10):
        member = a if s % 2 else b
        assert member.charge_rate("producer_byte_rate", "alice", f"c{s}", "", 400, s * 1000).throttle_ms == 0
        _sync(a, b, s * 1000)
        _sync(b, a, s * 1000)
    c = a.charge_rate("producer_byte_rate", "alice", "c9", "", 2300, 10_500)
    assert c.throttle_ms == 2100  # the fleet's usage, as one member alone would have measured it


def test_without_syncing_each_member_sees_only_its_own_half():
    a, b = _member(), _member()
    for s in range(10):
        (a if s % 2 else b).charge_rate("producer_byte_rate", "alice", "c", "", 400, s * 1000)
    assert a.charge_rate("producer_byte_rate", "alice", "c", "", 2300, 10_500).throttle_ms < 2100


def test_mutations_of_other_members_spend_this_members_tokens():
    a, b, alone = _member(), _member(), _member()
    # burst 10/s x 11 s = 110 tokens; a request is admitted while tokens are not negative (KIP-599)
    assert a.charge_mutations("alice", "c", "", [120], 0, strict=True).admitted == [True]
    _sync(a, b, 0)
    assert b.charge_mutations("alice", "c", "", [1], 0, strict=True).admitted == [False]  # A's debt, seen by B
    assert alone.charge_mutations("alice", "c", "", [1], 0, strict=True).admitted == [True]  # unsynced member


def test_remote_usage_for_an_entity_without_a_quota_here_is_ignored():
    b = _member()
    assert b.apply_remote(Usage("producer_byte_rate", "bob", "c", 1e9), 0) is False
    assert len(b) == 0
    assert b.ledger is not None and len(b.ledger) == 0  # remote usage is never re-published


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alice", "bob", "carol"]), st.sampled_from(["c1", "c2"]), st.integers(0, 10_000)),
        max_size=60,
    )
)
def test_drained_reports_carry_exactly_what_was_charged(charges):
    store = QuotaStore()
    for user in ("alice", "bob", "carol"):
        store.set(QuotaEntity(user=user), "producer_byte_rate", 1e6)
    qm = QuotaManager(store, ledger=FleetLedger())
    for i, (user, cid, amount) in enumerate(charges):
        qm.charge_rate("producer_byte_rate", user, cid, "", amount, i)
    reports = qm.ledger.drain("m", 100)
    per_user: dict[str, float] = {}
    for r in reports:
        for u in UsageReport.decode(r.encode()).usage():
            per_user[u.user] = per_user.get(u.user, 0) + u.amount
    want: dict[str, float] = {}
    for user, _cid, amount in charges:
        if amount:
            want[user] = want.get(user, 0) + amount
    assert per_user == want
    assert qm.ledger.drain("m", 200) == []


def test_reports_are_split_by_entries_and_by_size():
    ledger = FleetLedger()
    for i in range(MAX_ENTRIES + 10):
        ledger.add(("k", i), "producer_byte_rate", f"u{i}", "c", 1.0)
    first = ledger.drain("m", 0)  # every bucket named: split by size
    assert all(len(r.encode()) <= MAX_REPORT_BYTES for r in first) and sum(len(r.usage) for r in first) == 20_010
    for i in range(MAX_ENTRIES + 10):
        ledger.add(("k", i), "producer_byte_rate", f"u{i}", "c", 1.0)
    assert [len(r.usage) for r in ledger.drain("m", 1)] == [MAX_ENTRIES, 10]  # ids only: by entries
    long = "x" * 60_000  # client ids are the client's choice
    for i in range(40):
        ledger.add(("k", i), "producer_byte_rate", f"u{i}", long, 1.0)
    reports = ledger.drain("m", 0)
    assert len(reports) > 1 and all(len(r.encode()) <= MAX_REPORT_BYTES for r in reports)
    assert sum(len(r.usage) for r in reports) == 40


def _report(usage: list[Usage], member: str = "x", ts: int = 0) -> bytes:
    return UsageReport(member, ts, usage).encode()


def _decoded(data: bytes) -> dict:
    """Everything a receiver reads of a report: the framing, then the names."""
    return UsageReport.decode(data).names()


def _renamed(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and data.count(old) == 1
    return data.replace(old, new)


_GOOD = _report([Usage("producer_byte_rate", "u", "victim", 1.0)])


@pytest.mark.parametrize(
    "data, why",
    [
        (b"not json", "malformed"),
        (json.dumps({"v": 1, "m": "x", "t": 0, "u": []}).encode(), "version"),  # format 1: members upgrade together
        (b"KTP\x01" + _GOOD[4:], "version"),
        (_renamed(_GOOD, b"producer_byte_rate", b"producer_byte_ratf"), "unknown quota key"),
        (_renamed(_GOOD, b"victim", b"victin"), "not its id"),  # a name that is not the id's
        (_GOOD.replace(struct.pack("<d", 1.0), struct.pack("<d", -5.0)), "finite"),
        (_GOOD.replace(struct.pack("<d", 1.0), struct.pack("<d", math.nan)), "finite"),
        (_GOOD[:-3], "malformed"),
        (_GOOD + b"\x00", "after its names"),
        (MAGIC + b"\x00" * 8 + struct.pack("<IIH", 10**6, 0, 0), "malformed"),  # more entries than bytes
        (b" " * (MAX_REPORT_BYTES + 1), "over"),
    ],
)
def test_bad_reports_are_refused_with_a_reason(data, why):
    with pytest.raises(ReportError, match=why):
        _decoded(data)


_names = st.text(max_size=40)
_usages = st.lists(
    st.builds(
        Usage,
        st.sampled_from(sorted(BY_KEY)),
        _names,
        _names,
        st.floats(0, 1e15, allow_nan=False, allow_infinity=False),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(_usages, st.text(max_size=50), st.integers(-(2**63), 2**63 - 1), st.data())
def test_reports_round_trip_what_they_name(usage, member, ts, data):
    named = data.draw(st.lists(st.booleans(), min_size=len(usage), max_size=len(usage)))
    got = UsageReport.decode(UsageReport(member, ts, usage, named).encode())
    assert (got.member, got.ts_ms) == (member, ts)
    pairs = sorted((bucket_id(u.key, u.user, u.client_id), u.amount) for u in usage)
    assert sorted(zip(got.ids.tolist(), got.amounts.tolist(), strict=True)) == pairs
    assert got.ids.tolist() == sorted(got.ids.tolist())  # sorted by id, for the receivers' binary search
    assert got.names() == {
        bucket_id(u.key, u.user, u.client_id): (u.key, u.user, u.client_id)
        for u, yes in zip(usage, named, strict=True)
        if yes
    }
    if all(named):

        def order(us):
            return sorted(us, key=lambda u: (bucket_id(u.key, u.user, u.client_id), u.amount))

        assert order(UsageReport.decode(UsageReport(member, ts, usage).encode()).usage()) == order(usage)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_hostile_bytes_raise_report_error_and_nothing_else(data):
    for candidate in (data, MAGIC + data, _GOOD[:22] + data, _GOOD[: len(data) % len(_GOOD)] + data):
        with contextlib.suppress(ReportError):
            _decoded(candidate)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(_GOOD) - 1), st.integers(0, 255), st.integers(1, len(_GOOD)))
def test_altered_reports_raise_report_error_or_decode(at, byte, cut):
    altered = _GOOD[:at] + bytes((byte,)) + _GOOD[at + 1 :]
    for candidate in (altered, altered[:cut]):
        with contextlib.suppress(ReportError):
            FleetFold().add(UsageReport.decode(candidate))


def test_the_fold_sums_each_bucket_over_reports_and_drops_the_unnamed_ones():
    fold = FleetFold()
    a, b = Usage("producer_byte_rate", "", "a", 1.5), Usage("producer_byte_rate", "", "b", 2.0)
    fold.add(UsageReport.decode(_report([a, b], "m1")))
    unnamed = Usage("consumer_byte_rate", "", "c", 4.0)
    fold.add(UsageReport.decode(UsageReport("m2", 0, [a, unnamed], [True, False]).encode()))
    got = sorted(fold.drain(), key=lambda u: u.client_id)
    assert got == [Usage("producer_byte_rate", "", "a", 3.0), b]
    assert fold.unnamed == 1 and fold.entries == 0 and fold.drain() == []


def test_a_ledger_names_a_bucket_first_then_every_few_seconds():
    ledger = FleetLedger()

    def named_at(now_ms: int) -> list[bool]:
        ledger.add(("k",), "producer_byte_rate", "u", "c", 1.0)
        (report,) = ledger.drain("m", now_ms)
        return report.named

    assert [named_at(t) for t in (0, 250, NAMES_REFRESH_MS - 1, NAMES_REFRESH_MS, NAMES_REFRESH_MS + 250)] == [
        [True],
        [False],
        [False],
        [True],
        [False],
    ]


def test_quota_records_round_trip_and_are_checked_like_an_alter():
    from quotas.entities import DEFAULT
    from quotas.fleet_reports import decode_quota_record, encode_quota_record

    entity = QuotaEntity(user="alice", client_id=DEFAULT)
    layer = {"producer_byte_rate": 1048576.0, "consumer_byte_rate": None}
    assert decode_quota_record(*encode_quota_record(entity, layer)) == (entity, layer)
    key, _ = encode_quota_record(entity, layer)
    for bad in (
        b'{"v":1,"quotas":{"producer_byte_rate":-1}}',
        b'{"v":1,"quotas":{"nope":5}}',
        b'{"v":1,"quotas":{"nope":null}}',
        b'{"v":9,"quotas":{}}',
        b"[]",
    ):
        with pytest.raises(ReportError):
            decode_quota_record(key, bad)
    with pytest.raises(ReportError):
        decode_quota_record(None, b"{}")


def test_a_member_takes_in_another_members_alter(tmp_path):
    from config.quota_sources import QuotaSources

    published = []
    a = QuotaSources(
        QuotaStore(), tmp_path / "a.json", on_alter=lambda entity, layer: published.append((entity, layer))
    )
    b = QuotaSources(QuotaStore())
    alice = QuotaEntity(user="alice")
    a.alter(alice, {"producer_byte_rate": 2e6})
    assert published == [(alice, {"producer_byte_rate": 2e6})]
    assert b.set_api_entity(*published[0]) is True
    assert b.store.entities() == {alice: {"producer_byte_rate": 2e6}}
    assert b.set_api_entity(*published[0]) is False  # the same record again (an echo, a replay): no change


def test_the_ledger_is_bounded_whatever_client_ids_arrive(monkeypatch):
    import quotas.fleet_reports as fleet

    monkeypatch.setattr(fleet, "MAX_PENDING", 10)
    ledger = FleetLedger()
    for i in range(25):
        ledger.add(("k", i), "controller_mutation_rate", "u", f"client-{i}", 1.0)
    ledger.add(("k", 3), "controller_mutation_rate", "u", "client-3", 1.0)  # a known bucket still adds up
    assert len(ledger) == 10 and ledger.dropped == 15
    assert sum(u.amount for r in ledger.drain("m", 0) for u in r.usage) == 11


def test_a_member_refuses_usage_reports_it_enforces_leases(monkeypatch):
    """Since issue 39 a member enforces its lease, not the fleet's usage: a usage report (an older member's) is
    refused and counted, and changes nothing here."""
    import asyncio

    from tests.unit.test_fleet_member import fleet_config, fleet_sync

    config = fleet_config(monkeypatch, "me")
    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", 500.0)

    async def run():
        sync = fleet_sync(config, store, lambda: 1000)
        qm = sync.manager
        value = _report([Usage("producer_byte_rate", "alice", "c", 300.0)], member="other", ts=900)
        sync.take(sync.topic, None, value, sync._mac(sync.topic, None, value))
        assert sync.bad == 1 and sync.received == 0
        assert qm.charge_rate("producer_byte_rate", "alice", "c", "", 0, 1000).observed == 0

    asyncio.run(run())
