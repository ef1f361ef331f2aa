"""Fair share's seat in the policy: each request's work counted to its tenant on its broker, held while the broker is
limited and the tenant over its share; each answer's service time fed to the broker's loop (``quotas.fair_share``).

Why a module of its own: it is one job of the dispatcher (``proxy.rules.policy``), like smooth pacing or KIP-599, and
the one that runs with no quota configured at all, so it has its own fast path. What it does per request:

- **every request** (but SASL, ApiVersions and the quota APIs, never charged) is counted to its tenant: its bytes
  plus ``REQUEST_WORK``, a mutation request ``MUTATION_WORK`` a topic more (on every broker its tenant is active on:
  ``FairShare.charge_mutation``); a Fetch's answer is counted when it arrives;
- while the broker is limited, a Produce or a mutation request over its tenant's share **waits** before the broker
  sees it (the connection reads nothing behind it, as with smooth pacing), asked again at least every
  ``PACE_RECHECK_MS`` so the wait follows the share; a Fetch asks for no more than the tenant's bucket holds
  (``max_bytes``), and an answer that overdraws it is **throttled** (``throttle_time_ms``, then the mute:
  KIP-219). Other requests are counted, never held (a held heartbeat would cost the group a rebalance);
- every answer that measures the broker (``quotas.fair_share.sample_class``) is a sample of its service time.

Compiled with the dispatcher (``proxy.build_info.COMPILED``): :meth:`FairSeat.request` and :meth:`FairSeat.answer`
run on every request and every answer while fair share is on.
"""

from __future__ import annotations

import math
from typing import Final

from config.model import FairShareConfig
from protocol.apis import Api
from protocol.inflight import Pending
from protocol.request import Request
from proxy.rules.decisions import ConnState
from proxy.rules.verdicts import PolicyConnection
from quotas.fair_share import MUTATION_WORK, REQUEST_WORK, TICK_MS, BrokerLoad, FairShare, FairShareSettings, Tenant

FETCH_APIS: Final = frozenset({Api.FETCH, Api.SHARE_FETCH})
TENANT_SEP: Final = "\x1f"
"""Between a ``user_client`` tenant key's user and client id (a byte no principal or client id is expected to hold;
one that does can only name a tenant of its own)."""


def settings_of(config: FairShareConfig) -> FairShareSettings:
    return FairShareSettings(
        config.enabled,
        config.target_delay_ms,
        float(config.min_work_rate),
        config.burst_seconds,
        config.tenant,
        config.slow_start,
    )


def broker_key(conn: PolicyConnection) -> str:
    """The broker a connection's requests go to: its listener's label, or the address a bootstrap connection
    reached."""
    if conn.label != "bootstrap":
        return conn.label
    host, port = conn.upstream_addr or ("?", 0)
    return f"{host}:{port}"


def tenant_key(kind: str, user: str, client_id: str, peer: str) -> str:
    """The tenant a request is counted to (``quotas.fair_share.tenant``)."""
    if kind == "user":
        return user
    if kind == "address":
        host = peer.rpartition(":")[0]
        return host.strip("[]") or peer
    return user + TENANT_SEP + client_id


def tenant_labels(kind: str, key: str) -> tuple[str, str]:
    """A tenant key as (user, client id) for metric labels (an address tenant is its address in ``user``)."""
    if kind == "user_client":
        user, _, client_id = key.partition(TENANT_SEP)
        return user, client_id
    return key, ""


BrokerSample = tuple[str, float, float, float, float, float, float, int, int, int, int, int]
"""(broker, limit, level, delay ms, averaged delay ms, baseline ms, target ms, tenants, cuts, grows, starts,
samples)."""
TenantSample = tuple[str, str, str, float, float, int, float, int]
"""(broker, user, client id, demand B/s, share B/s (0: not paced), sparse, held seconds total, held total)."""


class FairSeat:
    """Fair share for one proxy process: the loop's state (:class:`FairShare`) and the per-request steps."""

    def __init__(self, config: FairShareConfig) -> None:
        self.state = FairShare(settings_of(config), config.weight_keys())
        self.kind = config.tenant
        self.enforce = config.enforce

    def configure(self, config: FairShareConfig) -> None:
        self.state.configure(settings_of(config), config.weight_keys())
        self.kind = config.tenant
        self.enforce = config.enforce

    def retire(self) -> None:
        """Fair share turned off: every connection bound to one of these brokers binds again at its next request
        (the broker's epoch moves, as when the table is cleared), so that turned on again it is counted on the new
        seat's loops, not held by these, which nobody ticks or shows any more."""
        for b in self.state.brokers.values():
            b.epoch += 1

    def bind(self, conn: PolicyConnection, st: ConnState, client_id: str, now_ms: int) -> Tenant:
        """The connection's tenant on its broker, kept on its state until the client id, the principal or the
        broker's epoch moves."""
        user = st.identity.principal
        b = self.state.broker(broker_key(conn), now_ms)
        t = self.state.tenant(
            b, tenant_key(self.kind, user, client_id, conn.peer if self.kind == "address" else ""), now_ms
        )
        st.fair, st.fair_client_id, st.fair_user, st.fair_stamp = t, client_id, user, b.epoch
        return t

    def request(
        self, conn: PolicyConnection, st: ConnState, request: Request, now_ms: int
    ) -> tuple[Tenant | None, float]:
        """Count one request: its tenant (None for the requests never charged), and its pacing mark (-1: it need not
        wait, or is not held). Also runs the
        loop's tick when one is due (``FairShare.tick``). Compiled and on every request: API keys are compared as
        ints, not looked up in sets (a boxed key and a hash each)."""
        header = request.header
        frame = request.frame
        key = header.api_key
        if key == Api.SASL_HANDSHAKE or key == Api.SASL_AUTHENTICATE or key == Api.API_VERSIONS:
            # Never charged (NEVER_CHARGED_APIS; the quota APIs never reach here). After an authentication the
            # principal may have changed: the next request binds again. Only then: the principal is not compared
            # on every request (a generic attribute read, compiled), as it cannot change otherwise (a TLS one is
            # known before any request; KIP-368 re-authentication keeps the principal).
            st.fair = None
            return None, -1.0
        client_id = header.client_id
        if client_id is None:
            client_id = ""
        t = st.fair
        if t is None or st.fair_client_id != client_id or st.fair_stamp != t.broker.epoch:
            t = self.bind(conn, st, client_id, now_ms)
        state = self.state
        if now_ms - state.last_tick_ms >= TICK_MS:
            state.tick(now_ms)
        if key == Api.PRODUCE:
            return t, t.broker.charge(t, float(len(frame) - 4 + REQUEST_WORK), now_ms)
        if key == Api.CREATE_TOPICS or key == Api.DELETE_TOPICS or key == Api.CREATE_PARTITIONS:
            spread = float(MUTATION_WORK * request.mutation_topics())  # charged on every broker it is active on
            return state.charge_mutation(t, float(len(frame) - 4 + REQUEST_WORK) + spread, spread, now_ms)
        t.broker.charge(t, float(len(frame) - 4 + REQUEST_WORK), now_ms)
        return t, -1.0  # counted (its debt paces the tenant's next held request), never held itself

    def fetch_room(self, t: Tenant, now_ms: int) -> float | None:
        """How many bytes a Fetch from a paced tenant may ask for now (its bucket; ``Request.capped_fetch``), None
        when the tenant is not paced."""
        if not t.paced:
            return None
        room = t.broker.tokens(t, now_ms)
        return None if room == math.inf else room

    def answer(self, st: ConnState, pending: Pending, nbytes: int, now: float, start: float) -> None:
        """An answer of ``nbytes`` read at ``now`` for a request the broker could start on at ``start`` (sent, and
        the connection's previous answer back; ``start == now``: read in the same read as the previous answer, so
        no time of its own). A sample of the broker's service time; a Fetch's bytes counted to its tenant, unless
        its decision charges them (a paced tenant's Fetch, throttled at its answer)."""
        t = st.fair
        if t is None:
            return
        b: BrokerLoad = t.broker
        if pending.sample >= 0 and now > start:
            b.sample(pending.sample, (now - start) * 1000.0, pending.sent_at, now)
        key = pending.header.api_key
        if key == Api.FETCH or key == Api.SHARE_FETCH:
            d = pending.decision
            if d is None or d.fair is None:
                b.charge(t, float(nbytes), int(now * 1000 + 0.5))

    def snapshot(self, top: int) -> tuple[list[BrokerSample], list[TenantSample]]:
        """What the metrics show: every broker's loop, and per broker its ``top`` tenants that matter most (held
        now, then the heaviest), the others left out (their sum is the broker's; bounded labels whatever the
        client ids). Read from the metrics thread: copies first, as the quota samples do."""
        brokers: list[BrokerSample] = []
        tenants: list[TenantSample] = []
        for b in list(self.state.brokers.values()):
            brokers.append(
                (b.key, b.limit, b.level, b.q, b.q_avg, b.base, b.target, len(b.tenants), b.cuts, b.grows,
                 b.starts, b.samples_total)
            )  # fmt: skip
            ts = list(b.tenants.values())
            if len(ts) > top:
                ts.sort(key=lambda t: (t.paced and not t.sparse, t.demand), reverse=True)
                ts = ts[:top]
            for t in ts:
                user, client_id = tenant_labels(self.kind, t.key)
                tenants.append(
                    (b.key, user, client_id, t.demand, t.rate(), 1 if t.sparse else 0, t.held_ms_total / 1000,
                     t.held_total)
                )  # fmt: skip
        return brokers, tenants
