"""Quota scope fleet, the pure half (issue 16, item 2): ledgers, reports, and folding remote usage in."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.entities import QuotaEntity, QuotaStore
from quotas.fleet import MAX_ENTRIES, MAX_REPORT_BYTES, FleetLedger, ReportError, Usage, UsageReport
from quotas.manager import QuotaManager


def _member(limit: float = 500.0) -> QuotaManager:
    store = QuotaStore()
    store.set(QuotaEntity(user="alice"), "producer_byte_rate", limit)
    store.set(QuotaEntity(user="alice"), "controller_mutation_rate", 10)
    qm = QuotaManager(store)
    qm.ledger = FleetLedger()
    return qm


def _sync(src: QuotaManager, dst: QuotaManager, now_ms: int) -> None:
    for report in src.ledger.drain("src", now_ms):
        for usage in UsageReport.decode(report.encode()).usage:
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
@given(st.lists(st.tuples(st.sampled_from(["alice", "bob", "carol"]), st.sampled_from(["c1", "c2"]),
                          st.integers(0, 10_000)), max_size=60))
def test_drained_reports_carry_exactly_what_was_charged(charges):
    store = QuotaStore()
    for user in ("alice", "bob", "carol"):
        store.set(QuotaEntity(user=user), "producer_byte_rate", 1e6)
    qm = QuotaManager(store)
    qm.ledger = FleetLedger()
    for i, (user, cid, amount) in enumerate(charges):
        qm.charge_rate("producer_byte_rate", user, cid, "", amount, i)
    reports = qm.ledger.drain("m", 100)
    per_user: dict[str, float] = {}
    for r in reports:
        for u in UsageReport.decode(r.encode()).usage:
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
    assert [len(r.usage) for r in ledger.drain("m", 0)] == [MAX_ENTRIES, 10]
    long = "x" * 60_000  # client ids are the client's choice
    for i in range(40):
        ledger.add(("k", i), "producer_byte_rate", f"u{i}", long, 1.0)
    reports = ledger.drain("m", 0)
    assert len(reports) > 1 and all(len(r.encode()) <= MAX_REPORT_BYTES for r in reports)
    assert sum(len(r.usage) for r in reports) == 40


@pytest.mark.parametrize("data, why", [
    (b"not json", "malformed"),
    (json.dumps({"v": 2, "m": "x", "t": 0, "u": []}).encode(), "version"),
    (json.dumps({"v": 1, "m": "x", "t": 0, "u": [["no_such_quota", "u", "c", 1]]}).encode(), "unknown quota key"),
    (json.dumps({"v": 1, "m": "x", "t": 0, "u": [["producer_byte_rate", "u", "c", -5]]}).encode(), "finite"),
    (json.dumps({"v": 1, "m": "x", "t": 0, "u": [["producer_byte_rate", "u"]]}).encode(), "malformed"),
    (b" " * (MAX_REPORT_BYTES + 1), "over"),
])
def test_bad_reports_are_refused_with_a_reason(data, why):
    with pytest.raises(ReportError, match=why):
        UsageReport.decode(data)


def test_quota_records_round_trip_and_are_checked_like_an_alter():
    from quotas.entities import DEFAULT
    from quotas.fleet import decode_quota_record, encode_quota_record

    entity = QuotaEntity(user="alice", client_id=DEFAULT)
    layer = {"producer_byte_rate": 1048576.0, "consumer_byte_rate": None}
    assert decode_quota_record(*encode_quota_record(entity, layer)) == (entity, layer)
    key, _ = encode_quota_record(entity, layer)
    for bad in (b'{"v":1,"quotas":{"producer_byte_rate":-1}}', b'{"v":1,"quotas":{"nope":5}}',
                b'{"v":1,"quotas":{"nope":null}}', b'{"v":9,"quotas":{}}', b"[]"):
        with pytest.raises(ReportError):
            decode_quota_record(key, bad)
    with pytest.raises(ReportError):
        decode_quota_record(None, b"{}")


def test_a_member_takes_in_another_members_alter(tmp_path):
    from config.quota_sources import QuotaSources

    published = []
    a, b = QuotaSources(QuotaStore(), tmp_path / "a.json"), QuotaSources(QuotaStore())
    a.on_alter = lambda entity, layer: published.append((entity, layer))
    alice = QuotaEntity(user="alice")
    a.alter(alice, {"producer_byte_rate": 2e6})
    assert published == [(alice, {"producer_byte_rate": 2e6})]
    assert b.set_api_entity(*published[0]) is True
    assert b.store.entities() == {alice: {"producer_byte_rate": 2e6}}
    assert b.set_api_entity(*published[0]) is False  # the same record again (an echo, a replay): no change


def test_the_ledger_is_bounded_whatever_client_ids_arrive(monkeypatch):
    import quotas.fleet as fleet

    monkeypatch.setattr(fleet, "MAX_PENDING", 10)
    ledger = FleetLedger()
    for i in range(25):
        ledger.add(("k", i), "controller_mutation_rate", "u", f"client-{i}", 1.0)
    ledger.add(("k", 3), "controller_mutation_rate", "u", "client-3", 1.0)  # a known bucket still adds up
    assert len(ledger) == 10 and ledger.dropped == 15
    assert sum(u.amount for r in ledger.drain("m", 0) for u in r.usage) == 11
