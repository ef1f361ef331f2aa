"""Partition counts of the topics this proxy itself just created, grew or deleted, from the cluster's answers.

Why: KIP-599 charges a DeleteTopics the topic's current partitions and a CreatePartitions the new count minus the
current one, and the proxy learns current counts from a Metadata request on the client's broker link. On KRaft a
broker's metadata is a replica of the controller's log, applied asynchronously: the CreateTopics answer comes once
the controller has committed the topic, and the broker that forwarded it may learn of the topic tens of
milliseconds later. A client that deletes what it just created (a churn) met the topic unknown to the broker, so
it was charged 0 while the controller deleted it all. What the proxy saw the cluster answer is newer than any
broker's metadata for a while; this keeps it for that while.

Kept by topic name and by topic id (DeleteTopics v6 may name a topic by id). An entry lasts ``ttl_ms`` (metadata
reaches the brokers far sooner) and at most ``max_topics`` are kept, oldest dropped first. Not thread-safe: one
per policy, used on its event loop.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

DEFAULT_TTL_MS = 60_000
DEFAULT_MAX_TOPICS = 10_000


class Known(NamedTuple):
    """What the cluster answered about one topic: its partitions after the change, its id when the answer said it."""

    partitions: int
    topic_id: uuid.UUID | None
    until_ms: int


class RecentTopics:
    def __init__(self, ttl_ms: int = DEFAULT_TTL_MS, max_topics: int = DEFAULT_MAX_TOPICS) -> None:
        if ttl_ms <= 0 or max_topics <= 0:
            raise ValueError(f"ttl_ms and max_topics must be > 0, got {ttl_ms} and {max_topics}")
        self.ttl_ms = ttl_ms
        self.max_topics = max_topics
        self._by_name: dict[str, Known] = {}
        self._by_id: dict[uuid.UUID, Known] = {}

    def __len__(self) -> int:
        return len(self._by_name) + len(self._by_id)

    def changed(self, name: str | None, topic_id: uuid.UUID | None, partitions: int, now_ms: int) -> None:
        """The cluster answered that topic ``name`` / ``topic_id`` now has ``partitions`` (created or grown)."""
        if partitions <= 0 or (name is None and topic_id is None):
            return
        if topic_id is None and name is not None:  # grown by name: keep the id a create told us
            before = self._by_name.get(name)
            topic_id = before.topic_id if before is not None else None
        known = Known(partitions, topic_id, now_ms + self.ttl_ms)
        if name is not None:
            self._by_name.pop(name, None)  # re-inserted last: the dict stays in order of expiry
            self._by_name[name] = known
            _trim(self._by_name, self.max_topics)
        if topic_id is not None:
            self._by_id.pop(topic_id, None)
            self._by_id[topic_id] = known
            _trim(self._by_id, self.max_topics)

    def deleted(self, name: str | None, topic_id: uuid.UUID | None) -> None:
        """The cluster answered that the topic was deleted: what was known of it no longer holds."""
        if name is not None:
            known = self._by_name.pop(name, None)
            if known is not None and known.topic_id is not None:
                self._by_id.pop(known.topic_id, None)
        if topic_id is not None:
            self._by_id.pop(topic_id, None)
            for other, known in list(self._by_name.items()):
                if known.topic_id == topic_id:
                    del self._by_name[other]

    def get(self, key: str | uuid.UUID | None, now_ms: int) -> Known | None:
        """What is known of a topic named ``key`` (a name, or an id), unless it expired."""
        if key is None:
            return None
        table: dict[Any, Known] = self._by_id if isinstance(key, uuid.UUID) else self._by_name
        known = table.get(key)
        if known is None:
            return None
        if known.until_ms <= now_ms:
            del table[key]
            return None
        return known

    def expire(self, now_ms: int) -> None:
        """Drop what is out of date (entries are in order of expiry: stop at the first that is not)."""
        tables: tuple[dict[Any, Known], ...] = (self._by_name, self._by_id)
        for table in tables:
            for key, known in list(table.items()):
                if known.until_ms > now_ms:
                    break
                del table[key]


def _trim(table: dict[Any, Known], limit: int) -> None:
    while len(table) > limit:
        del table[next(iter(table))]
