"""KIP-599 ``controller_mutation_rate``: a CreateTopics / CreatePartitions / DeleteTopics request parsed, charged
its partitions, split into what is admitted and what is refused, and its answer learnt from.

Why a module of its own: Kafka keeps this rule in ``ControllerMutationQuotaManager``, apart from the byte and
request quotas, and it is the one charge that needs the cluster asked first (``proxy.rules.partition_counts``, the I/O
side) and that rewrites both the request and its answer (``protocol.mutations``, the wire side).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from protocol import mutations
from protocol.apis import Api
from protocol.headers import RequestHeader
from protocol.mutations import MutationRequest
from protocol.text import printable
from proxy.rules.decisions import SIZE, Buffer, Decision, Verdict, local_frame
from proxy.rules.partition_counts import PartitionCounts
from proxy.rules.topic_counts import RecentTopics
from proxy.rules.verdicts import Answer, Defer, PolicyConnection, Replace
from quotas.manager import QuotaManager

log = logging.getLogger(__name__)


class MutationQuota:
    """Charges mutations to the quota manager; ``charge_validate_only`` follows reloads (shadow mode is the
    decision's own, :attr:`proxy.rules.decisions.Decision.shadow`)."""

    def __init__(self, quotas: QuotaManager, counts: PartitionCounts, now_ms: Callable[[], int]) -> None:
        self.quotas = quotas
        self.counts = counts
        self._now_ms = now_ms
        """The policy's clock in ms (injected)."""
        self.charge_validate_only = False

    @property
    def recent(self) -> RecentTopics:
        return self.counts.recent

    def request(
        self, conn: PolicyConnection, d: Decision, header: RequestHeader, body: memoryview, now_ms: int
    ) -> Verdict:
        """A mutation request with its other kinds already charged in ``d``: deferred until the cluster has said
        what it would change, unless no mutation quota applies (or it only validates, uncharged)."""
        tracker = self.quotas.mutation_tracker(d.user, d.client_id, d.scope, now_ms)
        if tracker is None:
            return d if d.later else None
        request = mutations.parse_request(header.api_key, header.api_version, body[header.body_offset :])
        if request.validate_only and not self.charge_validate_only:
            return d if d.later else None
        frame_body = body.tobytes()
        return Defer(lambda: self.decide(conn, d, header, frame_body, request))

    async def decide(
        self, conn: PolicyConnection, d: Decision, header: RequestHeader, body: bytes, request: MutationRequest
    ) -> Verdict:
        counts = await self.counts.of(conn, request)
        now_ms = self._now_ms()
        # In shadow mode the same decision is made and recorded, and the request still goes through whole.
        charge = self.quotas.charge_mutations(d.user, d.client_id, d.scope, counts, now_ms, request.splittable)
        if charge is None:  # the quota was removed while we asked
            return d
        admitted, throttle, rejected = charge.admitted, charge.throttle_ms, charge.rejected
        d.mutations_charged(now_ms, list(counts), charge.mutations, len(rejected), charge.limit, throttle)
        if rejected:
            log.info(
                "%s: %s by %s/%s: %d of %d topics over controller_mutation_rate (throttle %d ms)%s",
                conn.peer,
                request.label,
                printable(d.user),
                printable(d.client_id),
                len(rejected),
                len(counts),
                throttle,
                " [shadow: not enforced]" if d.shadow else "",
            )
        if not rejected or d.shadow:
            if request.validate_only:  # nothing changes on the cluster: nothing to learn from its answer
                return d
            # The answer says what the cluster now has, before the brokers' metadata does: learn it (whole: a
            # merge needs the whole response, never a streamed one).
            d.answered_through(lambda broker_body: self.learn(request, counts, broker_body))
            return Replace(d, SIZE.pack(len(body)) + body, whole=True)
        assert header.body_offset is not None  # a mutation API's header always has its body located
        head = body[: header.body_offset]
        if len(rejected) == len(counts):
            return Answer(d, local_frame(header, mutations.reject_all(request, throttle)))
        admitted_idx = [i for i, ok in enumerate(admitted) if ok]
        sub = head + mutations.subset_request(request, admitted_idx)
        d.answered_through(
            lambda broker_body: self.learn(
                request, counts, mutations.merge_response(request, broker_body, rejected, throttle)
            )
        )
        return Replace(d, SIZE.pack(len(sub)) + sub, whole=True)

    def learn(self, request: MutationRequest, counts: list[int], body: Buffer) -> bytes:
        """Keep what the cluster answered it created, grew or deleted (:class:`proxy.rules.topic_counts.RecentTopics`),
        so the next mutation of those topics is charged their real count even before the client's broker has
        caught up with the controller; ``body`` (the response body going to the client) is returned as it is."""
        answer = bytes(body)  # a view of the receive buffer, or the merged answer (bytes already: not copied)
        if request.validate_only:
            return answer
        try:
            results = mutations.parse_results(request.api_key, request.version, answer)
        except ValueError as exc:  # DecodeError: the client gets the answer as it is, the proxy learns nothing
            log.warning("%s answer does not parse, its partition counts are not kept: %s", request.label, exc)
            return answer
        now_ms = self._now_ms()
        recent = self.recent
        recent.expire(now_ms)
        key = request.api_key
        asked = {t.name: i for i, t in enumerate(request.topics) if t.name is not None}
        for r in results:
            if r.error_code != 0:
                continue
            i = asked.get(r.name) if r.name is not None else None
            if key == Api.DELETE_TOPICS:
                recent.deleted(r.name, r.topic_id)
            elif key == Api.CREATE_TOPICS:
                n = r.num_partitions if r.num_partitions > 0 else counts[i] if i is not None else 0
                recent.changed(r.name, r.topic_id, n, now_ms)
            elif i is not None:  # CreatePartitions: the topic now has the count asked for
                topic = request.topics[i]
                assert isinstance(topic, mutations.NewPartitions)
                recent.changed(r.name, None, topic.count, now_ms)
        return answer
