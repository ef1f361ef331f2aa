"""The cluster asked, on the client's own broker link, how many partitions a KIP-599 mutation would change.

Why a module of its own: this is the policy's only I/O and its only waiting (``conn.ask``, ``asyncio.sleep``);
the mutation quota (``proxy.rules.mutation_quota``) decides on the counts without either, as h11 keeps every wait in
its I/O layer. The asks go on the client's own link, so the view and the authorisation are the client's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from protocol.apis import Api, decode_body
from protocol.mutations import CreateTopic, MutationRequest, NewPartitions, TopicMutation
from proxy.rules.topic_counts import RecentTopics
from proxy.rules.verdicts import PolicyConnection

_METADATA_VERSION: Final = 12
_PROBE_CREATE_VERSION: Final = 5  # the first CreateTopics version whose answer says how many partitions a topic gets
_NOT_SEEN_YET: Final = frozenset((3, 5, 100))
"""Metadata errors of a topic a broker may not have learned of yet: UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_ID."""
LAG_RECHECKS_S: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
"""Waits before asking a broker again about a topic to be deleted or grown that it does not know (see
:meth:`PartitionCounts.current`): 0.75 s in all, the most a delete of a topic that does not exist is held up."""

TopicKey = str | uuid.UUID | None


class PartitionCounts:
    """Asks the cluster for the partition counts a mutation changes, with what this proxy saw it answer lately."""

    def __init__(
        self,
        recent: RecentTopics,
        now_ms: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.recent = recent
        self._now_ms = now_ms
        self._sleep = sleep
        self.lag_rechecks_s: tuple[float, ...] = LAG_RECHECKS_S
        """Waits before asking again about a topic the client's broker does not know (:meth:`current`)."""

    async def of(self, conn: PolicyConnection, request: MutationRequest) -> list[int]:
        """Partitions each topic of the request would create or delete."""
        key = request.api_key
        if key == Api.CREATE_TOPICS:
            creates = [t for t in request.topics if isinstance(t, CreateTopic)]
            unknown = [t for t in creates if t.partitions is None]
            defaults: dict[str, int] = {}
            if unknown:
                defaults = await self._default_partitions(conn, unknown)
            return [t.partitions if t.partitions is not None else defaults.get(t.name, 0) for t in creates]
        current = await self.current(conn, request.topics)
        if key == Api.CREATE_PARTITIONS:
            grown = [t for t in request.topics if isinstance(t, NewPartitions)]
            return [max(t.count - current.get(t.name, t.count), 0) for t in grown]
        return [current.get(t.key, 0) for t in request.topics]

    async def current(self, conn: PolicyConnection, topics: Sequence[TopicMutation]) -> dict[TopicKey, int]:
        """Each topic's current partition count, under its key (name, or id for DeleteTopics v6 by id); a topic
        the cluster does not have is left out.

        A broker's metadata lags the controller's (KRaft applies the metadata log asynchronously): a topic created
        a moment ago may be unknown to the client's broker although the controller will delete it whole, and one
        grown a moment ago may show its old count. So what this proxy saw the cluster answer lately
        (``recent``) counts too: for the same topic id the larger count is the newer (partitions are never removed
        from a topic). A topic neither knows is asked for again after each of ``lag_rechecks_s``: it may have been
        created a moment ago elsewhere (another proxy or worker)."""
        out: dict[TopicKey, int] = {}
        todo = list(topics)
        rechecks = self.lag_rechecks_s
        attempt = 0
        while True:
            md = await self._metadata(conn, todo)
            now_ms = self._now_ms()
            by_name: dict[str, Any] = {}
            by_id: dict[uuid.UUID, Any] = {}
            for mt in md.topics:
                if mt.name is not None:
                    by_name[mt.name] = mt
                if mt.topic_id is not None:
                    by_id[mt.topic_id] = mt
            unseen = []
            for t in todo:
                key = t.key
                mt = by_id.get(key) if isinstance(key, uuid.UUID) else by_name.get(key) if key is not None else None
                known = self.recent.get(key, now_ms)
                if mt is not None and mt.error_code == 0:
                    count = len(mt.partitions)
                    if known is not None and (
                        known.topic_id is None or mt.topic_id is None or known.topic_id == mt.topic_id
                    ):
                        count = max(count, known.partitions)
                    out[key] = count
                elif mt is not None and mt.error_code not in _NOT_SEEN_YET:
                    pass  # not authorised, ...: the mutation fails the same way and changes nothing, charged 0
                elif known is not None:
                    out[key] = known.partitions
                else:
                    unseen.append(t)
            if not unseen or attempt >= len(rechecks):
                return out
            await self._sleep(rechecks[attempt])
            attempt += 1
            todo = unseen

    async def _metadata(self, conn: PolicyConnection, topics: Sequence[TopicMutation]) -> Any:
        wanted = [
            MetadataRequest.MetadataRequestTopic(topic_id=getattr(t, "topic_id", None), name=t.name) for t in topics
        ]
        req = MetadataRequest(topics=wanted, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        reply = await conn.ask(Api.METADATA, _METADATA_VERSION, bytes(req.encode(version=_METADATA_VERSION)))
        return decode_body(MetadataResponse, reply, _METADATA_VERSION)

    async def _default_partitions(self, conn: PolicyConnection, topics: Sequence[CreateTopic]) -> dict[str, int]:
        """The cluster's default partition count for topics created with -1, by asking it to validate them."""
        probe = CreateTopicsRequest(
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name=t.name, num_partitions=-1, replication_factor=t.replication_factor, assignments=[], configs=[]
                )
                for t in topics
            ],
            timeout_ms=30_000,
            validate_only=True,
        )
        reply = await conn.ask(
            Api.CREATE_TOPICS, _PROBE_CREATE_VERSION, bytes(probe.encode(version=_PROBE_CREATE_VERSION))
        )
        answer = decode_body(CreateTopicsResponse, reply, _PROBE_CREATE_VERSION)
        return {t.name: t.num_partitions for t in answer.topics if t.error_code == 0 and t.num_partitions > 0}
