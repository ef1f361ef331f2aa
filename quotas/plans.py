"""What each API is charged (a plan), and that plan bound to one client's quota handles: the policy's lookup.

Why here, beside :class:`quotas.manager.QuotaManager`: a plan is read off the quota catalogue (``quotas.kinds``) and
the keys the store configures, and binding is the manager's lookup; both are pure (no I/O, time passed in), as
Kafka keeps its lookup in ``ClientQuotaManager``. ``proxy.rules.policy`` keeps one :class:`BoundPlan` per connection
(the last API and client id it saw) and asks :class:`Plans` again only when those or the quotas change.
"""

from __future__ import annotations

from typing import NamedTuple

from quotas.entities import QuotaStore
from quotas.kinds import (
    BIT,
    BUILTIN_COSTS,
    CONTROLLER_MUTATION_RATE,
    MUTATION_APIS,
    NEVER_CHARGED_APIS,
    PRODUCE,
    PRODUCER_IDS_RATE,
    Basis,
    QuotaKind,
    RequestCosts,
    basis,
    charged_at,
)
from quotas.manager import Bound, QuotaManager


class Plan(NamedTuple):
    """What one API is charged, given the quota keys configured (see :meth:`Plans.plan`)."""

    at_request: tuple[QuotaKind, ...]
    at_response: tuple[QuotaKind, ...]
    pids: bool
    mutation: bool
    exempt_replicas: bool
    """Some kind charged at response exempts replica fetches: read the request's replica id."""


Charged = tuple[QuotaKind, Bound, Basis]
"""(kind, handle, basis): one quota a bound plan charges (typed: compiled, its fields are read natively)."""


class BoundPlan:
    """One API's :class:`Plan` bound to one connection's user, client id and scope: the quota handles its
    requests are charged through (see :class:`quotas.manager.Bound`), kept until the manager's stamp moves."""

    __slots__ = (
        "at_request",
        "at_request_kinds",
        "later",
        "later_kinds",
        "later_replica",
        "later_replica_kinds",
        "out_term",
        "pids",
        "plan",
    )

    def __init__(
        self, plan: Plan, at_request: tuple[Charged, ...], later: tuple[Charged, ...], pids: Bound | None
    ) -> None:
        self.plan = plan
        self.at_request = at_request
        """(kind, handle, basis) for every kind charged when the request arrives and applying to this client
        (the basis: what the request is charged from, :func:`quotas.kinds.basis`)."""
        self.later = later
        """(kind, handle, basis) charged when the response arrives."""
        self.later_replica = tuple(khb for khb in later if not khb[0].exempt_replicas)
        """``later`` for a replica fetch."""
        self.at_request_kinds = kind_bits(at_request)
        """The kinds of ``at_request`` as a set of ``quotas.kinds.BIT``: what every decision on it notes."""
        self.later_kinds = kind_bits(later)
        self.later_replica_kinds = kind_bits(self.later_replica)
        self.pids = pids
        self.out_term = False
        """request_percentage is charged and its estimate grows with the response (quotas.kinds.has_response_term):
        the connection keeps this API's last response size for the next request's charge."""


def kind_bits(charged: tuple[Charged, ...]) -> int:
    """The kinds of ``charged`` as a set of ``quotas.kinds.BIT``."""
    kinds = 0
    for kind, _h, _how in charged:
        kinds |= BIT[kind.key]
    return kinds


class Plans:
    """Every API's plan for the quota keys now configured, kept per API until the store's quotas change."""

    def __init__(self, store: QuotaStore, quotas: QuotaManager) -> None:
        self.store = store
        self.quotas = quotas
        self._keys: frozenset[str] = frozenset()
        self._keys_generation = -1
        self._plans: dict[int, Plan | None] = {}
        self._plans_generation = -1

    def _active_keys(self) -> frozenset[str]:
        stamp = self.quotas.stamp()  # moves with every change of the store's quotas (and a little more often)
        if self._keys_generation != stamp:
            self._keys = frozenset(k for quotas in self.store.entities().values() for k in quotas)
            self._keys_generation = stamp
        return self._keys

    def plan(self, key: int) -> Plan | None:
        """What requests of API ``key`` are charged; None when nothing is, so such a request costs a dict lookup
        and nothing more."""
        active = self._active_keys()
        plans = self._plans
        if self._plans_generation != self._keys_generation:
            plans.clear()
            self._plans_generation = self._keys_generation
        try:
            return plans[key]
        except KeyError:
            pass
        plan = None
        if active and key not in NEVER_CHARGED_APIS:
            plan = Plan(
                charged_at(key, "request", active),
                charged_at(key, "response", active),
                key == PRODUCE and PRODUCER_IDS_RATE in active,
                key in MUTATION_APIS and CONTROLLER_MUTATION_RATE in active,
                False,
            )
            plan = plan._replace(exempt_replicas=any(k.exempt_replicas for k in plan.at_response))
            if not (plan.at_request or plan.at_response or plan.pids or plan.mutation):
                plan = None
        if len(plans) >= 4096:  # api keys come from clients
            plans.clear()
        plans[key] = plan
        return plan


def bind(
    q: QuotaManager,
    plan: Plan,
    key: int,
    user: str,
    client_id: str,
    scope: str,
    now_ms: int,
    costs: RequestCosts = BUILTIN_COSTS,
) -> BoundPlan | None:
    """API ``key``'s plan bound to ``user``, ``client_id`` and ``scope``; None: no quota applies to this client.
    ``costs``: the request-cost table in force (whether this API's request_percentage grows with its response)."""
    at_request = tuple(
        (k, h, basis(k, key))
        for k in plan.at_request
        if (h := q.bind(k.key, user, client_id, scope, now_ms)) is not None
    )
    later = tuple(
        (k, h, basis(k, key))
        for k in plan.at_response
        if (h := q.bind(k.key, user, client_id, scope, now_ms)) is not None
    )
    pids = q.bind(PRODUCER_IDS_RATE, user, client_id, scope, now_ms) if plan.pids else None
    if not (at_request or later or pids is not None or plan.mutation):
        return None
    b = BoundPlan(plan, at_request, later, pids)
    b.out_term = costs.has_response_term(key) and any(how == "thread_time" for _k, _h, how in at_request)
    return b
