"""proxy.rules.topic_counts.RecentTopics: what the cluster answered the proxy's own mutations, for a while."""

from __future__ import annotations

import uuid

import pytest

from proxy.rules.topic_counts import RecentTopics


def test_a_created_topic_is_known_by_name_and_id_until_it_expires():
    recent = RecentTopics(ttl_ms=1000)
    tid = uuid.uuid4()
    recent.changed("a", tid, 3, now_ms=0)
    assert recent.get("a", 999).partitions == 3 and recent.get(tid, 999).topic_id == tid
    assert recent.get("a", 1000) is None and recent.get(tid, 1000) is None


def test_growing_by_name_keeps_the_id_and_a_delete_forgets_both_keys():
    recent = RecentTopics()
    tid = uuid.uuid4()
    recent.changed("a", tid, 2, now_ms=0)
    recent.changed("a", None, 5, now_ms=10)  # CreatePartitions answers by name only
    assert recent.get("a", 20) == recent.get(tid, 20) and recent.get("a", 20).partitions == 5
    recent.deleted(None, tid)  # DeleteTopics v6 by id
    assert recent.get("a", 20) is None and recent.get(tid, 20) is None
    recent.changed("b", tid, 1, now_ms=30)
    recent.deleted("b", None)
    assert len(recent) == 0


def test_the_oldest_are_dropped_past_the_limit_and_on_expiry():
    recent = RecentTopics(ttl_ms=100, max_topics=2)
    for i, name in enumerate("abc"):
        recent.changed(name, None, 1, now_ms=i)
    assert recent.get("a", 3) is None and recent.get("c", 3) is not None
    recent.expire(101)
    assert recent.get("b", 0) is None and recent.get("c", 0) is not None  # b expired at 101, c at 102
    with pytest.raises(ValueError, match="ttl_ms"):
        RecentTopics(ttl_ms=0)
