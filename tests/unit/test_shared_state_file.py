"""Workers on one host share quotas altered through the proxy via the state file (issue 16, item 1)."""

from __future__ import annotations

import threading

from config.quota_sources import QuotaSources
from quotas.entities import QuotaEntity, QuotaStore

ALICE, BOB = QuotaEntity("alice", None), QuotaEntity("bob", None)


def test_an_alter_through_one_worker_reaches_the_other_on_refresh(tmp_path):
    path = tmp_path / "state.json"
    a, b = QuotaSources(QuotaStore(), path), QuotaSources(QuotaStore(), path)
    a.alter(ALICE, {"producer_byte_rate": 1e6})
    assert b.store.entities() == {}
    assert b.refresh() is True
    assert b.store.entities() == {ALICE: {"producer_byte_rate": 1e6}}
    assert b.refresh() is False  # nothing new: a stat, no read
    assert a.refresh() is False  # its own write is not news to it
    b.alter(ALICE, {"producer_byte_rate": None})  # a removal travels the same way
    assert a.refresh() is True and a.store.entities() == {}


def test_concurrent_alters_of_different_entities_are_all_kept(tmp_path):
    path = tmp_path / "state.json"
    workers = [QuotaSources(QuotaStore(), path) for _ in range(4)]
    entities = [QuotaEntity(f"user-{i}", None) for i in range(40)]

    def alter(worker: QuotaSources, mine: list[QuotaEntity]) -> None:
        for entity in mine:
            worker.alter(entity, {"consumer_byte_rate": 5e5})

    threads = [threading.Thread(target=alter, args=(w, entities[i::4])) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh = QuotaSources(QuotaStore(), path)
    assert set(fresh.api) == set(entities)
    for w in workers:
        w.refresh()
        assert set(w.api) == set(entities)


def test_a_broken_state_file_keeps_the_quotas_in_force(tmp_path, caplog):
    path = tmp_path / "state.json"
    a = QuotaSources(QuotaStore(), path)
    a.alter(BOB, {"producer_byte_rate": 2e6})
    path.write_text("{not json")
    assert a.refresh() is False
    assert a.store.entities() == {BOB: {"producer_byte_rate": 2e6}}
    assert "cannot be read" in caplog.text
