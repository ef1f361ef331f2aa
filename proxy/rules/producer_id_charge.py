"""KIP-936: the producer ids a Produce brings, charged to ``producer_ids_rate``, and the user-wide hold that follows.

Why a module of its own: it is the one charge that reads into the record batches (their headers, never the
records) and keeps per-connection memory (the last id and request shape), and it is what makes a user's next
Produce wait on every connection. The dispatcher calls :func:`charge_producer_ids` for a Produce whose plan binds
``producer_ids_rate``; compiled with it (``proxy.build_info.COMPILED``).
"""

from __future__ import annotations

from mute import KeyedHolds
from protocol.record_batches import NO_PRODUCER_ID
from protocol.request import Request
from proxy.rules.decisions import Decision, PidMemo
from quotas.manager import Bound, QuotaManager
from quotas.producer_ids import ProducerIdTracker


def charge_producer_ids(
    quotas: QuotaManager,
    tracker: ProducerIdTracker,
    holds: KeyedHolds,
    hold_max_ms: int,
    d: Decision,
    h: Bound,
    request: Request,
    now_ms: int,
) -> None:
    """Each producer id new to the user (per broker, as a broker would see it) within the window charges
    producer_ids_rate by one. Ids come from the record-batch headers; the records are not read. Over quota, the
    user's next Produce / InitProducerId waits in ``holds``, at most ``hold_max_ms``."""
    st = d.state
    pid = None
    if st.produce_shape is not None:  # the skeleton the last one had: no walk
        pid = request.shaped_producer_id(st.produce_shape)
    if pid is None:
        pids, st.produce_shape = request.producer_ids()
        if len(pids) == 1:
            (pid,) = pids
        elif not pids:
            return
    elif pid == NO_PRODUCER_ID:
        return
    if pid is not None:  # the usual producer: one id, request after request, on one connection
        seen = st.pid_memo
        if (
            seen is not None
            and seen.tracker is tracker
            and seen.pid == pid
            and now_ms < seen.until
            and seen.user == d.user
            and seen.scope == d.scope
        ):
            return  # known to the user's filters until seen.until: asking again would change nothing
        fresh, until = tracker.observe_until((d.user, d.scope), pid, now_ms)
        st.pid_memo = PidMemo(tracker, d.user, d.scope, pid, until)
        new = int(fresh)
    else:
        new = tracker.observe_many((d.user, d.scope), pids, now_ms)
    if not new:
        return
    throttle = quotas.charge(h, new, now_ms)
    d.producer_ids_charged(new, h.limit, throttle)
    if throttle > 0:
        # Muting one connection does not stop the KIP's misbehaving pattern (a new producer, on new
        # connections, per batch), so the user's next Produce / InitProducerId on ANY connection waits too,
        # up to producer_id_hold_max_ms (kept below client request timeouts).
        holds.hold(d.user, now_ms / 1000 + min(throttle, hold_max_ms) / 1000)
