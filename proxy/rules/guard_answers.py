"""The protected-topic guard's answers: a request naming the proxy's own topics refused here, or stripped of them
and its answer merged with the refusal.

Why a module of its own: ``protocol.topic_guard`` finds the protected names without I/O; what to answer, how a
stripped request is still charged as what it became, and how often to say so in the log is the proxy's, apart
from the quota decision the dispatcher makes for what is left.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from protocol.apis import api_label
from protocol.headers import RequestHeader, response_body_offset
from protocol.request import Request, read_request
from protocol.text import printable
from protocol.topic_guard import ProtectedTopics, Refusal
from protocol.topic_guard import check as check_topics
from proxy.rules.decisions import SIZE, ConnState, Decision, ResponseMerge, Verdict, local_frame
from proxy.rules.verdicts import Answer, Defer, PolicyConnection, Replace
from proxy.stats import Stats

log = logging.getLogger(__name__)

Decide = Callable[[PolicyConnection, Request, float], Verdict]
BuildDecision = Callable[[ConnState, str, RequestHeader, int], Decision]
"""``Policy.new_decision``: (the connection's state, client id, header, request size) -> a decision."""
"""The dispatcher's quota decision for a request (``Policy._decide``): what the stripped request is charged as."""


class GuardAnswers:
    """Refusals of requests naming the proxy's own topics: counted, logged at most once per 10 s."""

    def __init__(self, stats: Stats, clock: Callable[[], float]) -> None:
        self.stats = stats
        self._clock = clock
        """The policy's monotonic seconds (injected: the log's rate limit is testable)."""
        self._logged_at = float("-inf")
        self._since = 0
        """The last line's time (none yet: the first refusal is logged whatever the clock reads) and the refusals
        since: one line per 10 s at most."""

    def refusal(self, conn: PolicyConnection, request: Request, guard: ProtectedTopics) -> Refusal | None:
        """The request names a protected topic (``protocol.topic_guard``): counted, and logged at most once per
        10 s with the number refused meanwhile (a client can send one such request after another)."""
        header = request.header
        if header.body_offset is None:
            return None
        refusal = check_topics(
            guard, header.api_key, header.api_version, memoryview(request.frame)[4 + header.body_offset :]
        )
        if refusal is None:
            return None
        self.stats.protected_refusals[api_label(header.api_key)] += 1
        self._since += 1
        now = self._clock()
        if now - self._logged_at >= 10:
            more = f" ({self._since - 1} more refused since the last such line)" if self._since > 1 else ""
            log.warning(
                "%s: refused %s v%d by %s naming the proxy's own topic(s) %s%s",
                conn.peer,
                api_label(header.api_key),
                header.api_version,
                printable(conn.identity.principal),
                printable(", ".join(refusal.topics[:3])),
                more,
            )
            self._logged_at, self._since = now, 0
        return refusal

    def refuse(
        self,
        conn: PolicyConnection,
        request: Request,
        refusal: Refusal,
        now: float,
        decide: Decide,
        build: BuildDecision,
    ) -> Verdict:
        """Answer the protected topics' refusal here, or forward the rest of the request (charged as what it
        became, by ``decide``: a new request, read as the session reads one) and merge the refusal into whatever
        answers it: the broker, or the policy itself."""
        header = request.header
        if refusal.answer is not None:
            return Answer(None, local_frame(header, refusal.answer))
        assert refusal.forward is not None and refusal.merge is not None and header.body_offset is not None
        head = bytes(memoryview(request.frame)[4 : 4 + header.body_offset])
        stripped = SIZE.pack(len(head) + len(refusal.forward)) + head + refusal.forward
        verdict = decide(conn, read_request(header, stripped), now)
        return merged(conn, header, verdict, stripped, refusal.merge, build)


def merged(
    conn: PolicyConnection,
    header: RequestHeader,
    verdict: Verdict,
    frame: bytes,
    merge: ResponseMerge,
    build: BuildDecision,
) -> Verdict:
    """``verdict`` (for the stripped request ``frame``) with ``merge`` applied to its answer; ``build``: the policy's
    own way to make a decision, for a request no quota charged (only the policy builds one)."""
    if type(verdict) is Defer:
        inner = verdict.decide
        return Defer(lambda: _merged_later(conn, header, inner, frame, merge, build), wait_s=verdict.wait_s)
    if type(verdict) is Answer:
        body = memoryview(verdict.frame)[4:]
        body = body[response_body_offset(body, header.api_key, header.api_version) :]
        return Answer(verdict.decision, local_frame(header, merge(body)))
    if type(verdict) is Replace:
        d: Decision = verdict.decision
        d.answered_through(merge)
        return Replace(d, verdict.frame, whole=True)
    if verdict is None:
        st = conn.policy_state
        if st is None:
            st = conn.policy_state = ConnState(conn.identity)
        verdict = build(st, header.client_id or "", header, len(frame) - 4)
    assert type(verdict) is Decision
    verdict.answered_through(merge)
    return Replace(verdict, frame, whole=True)


async def _merged_later(
    conn: PolicyConnection,
    header: RequestHeader,
    inner: Callable[[], Awaitable[Verdict]],
    frame: bytes,
    merge: ResponseMerge,
    build: BuildDecision,
) -> Verdict:
    return merged(conn, header, await inner(), frame, merge, build)
