"""What the policy decides for one request, and what it keeps per connection: the types its modules share.

Why a module of its own: the dispatcher (``proxy.rules.policy``), the producer-id charge, smooth pacing, the KIP-599
mutation quota, the guard's answers and the recording all read and fill one :class:`Decision`; here none of them
imports another to reach it. Compiled with them (``proxy.build_info.COMPILED``): its fields are read natively.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, TypeAlias

from protocol.apis import response_header_is_flexible
from protocol.headers import RequestHeader, encode_response_header
from protocol.record_batches import Shape
from proxy.rules.verdicts import Answer, Defer, Identity, Replace
from quotas.fair_share import Tenant
from quotas.kinds import BIT, CONTROLLER_MUTATION_RATE, PRODUCER_IDS_RATE
from quotas.manager import Bound
from quotas.plans import BoundPlan, Charged
from quotas.producer_ids import ProducerIdTracker
from quotas.throttle import MAX_THROTTLE_MS

Buffer: TypeAlias = bytes | bytearray | memoryview
"""A request frame as the connection hands it on (``protocol.frames.FrameReader``)."""

_MUTATION_BIT: Final = BIT[CONTROLLER_MUTATION_RATE]
_PIDS_BIT: Final = BIT[PRODUCER_IDS_RATE]

SIZE: Final = struct.Struct(">i")
"""A frame's size prefix (and any other big-endian int32)."""

ResponseMerge: TypeAlias = Callable[[memoryview], "bytes | bytearray"]
"""What a response body goes through before the client gets it (a KIP-599 split, a protected topic's refusal)."""


def ms(seconds: float) -> int:
    """Monotonic seconds to whole ms, half up. Not ``round()``: compiled, that is a call through the builtins
    module on every charge; this is native. (Half up instead of half even: the clock is never negative, and
    the charges compare times with each other only.)"""
    return int(seconds * 1000 + 0.5)


def local_frame(header: RequestHeader, body: bytes | bytearray) -> bytes:
    """A whole response frame (size prefix, response header, ``body``) answering ``header``. ``body`` may be a
    bytearray (kafka-python encodes into one): compiled, a ``bytes`` parameter would refuse it."""
    head = encode_response_header(
        header.correlation_id, bool(response_header_is_flexible(header.api_key, header.api_version))
    )
    return SIZE.pack(len(head) + len(body)) + head + body


class PidMemo:
    """The producer id a connection sent last, for whom it was observed, and until when (monotonic ms) the KIP-936
    filters know it: a plain class, so the per-request check reads native fields (a tuple's are objects)."""

    __slots__ = ("tracker", "user", "scope", "pid", "until")

    def __init__(self, tracker: ProducerIdTracker, user: str, scope: str, pid: int, until: int) -> None:
        self.tracker = tracker
        self.user = user
        self.scope = scope
        self.pid = pid
        self.until = until


class ConnState:
    """What the policy keeps per connection (``PolicyConnection.policy_state``)."""

    __slots__ = (
        "identity",
        "fair",
        "fair_client_id",
        "fair_stamp",
        "fair_user",
        "last",
        "last_client_id",
        "last_key",
        "last_out",
        "pid_memo",
        "plain_key",
        "plain_stamp",
        "produce_shape",
        "produce_head",
        "produce_stamp",
        "produce_rf",
        "scope",
        "stamp",
        "user",
    )

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        """The connection's identity (one object for its life): its principal is read from here, one lookup
        where ``conn.identity.principal`` was two."""
        self.stamp = -1
        self.user = ""
        self.scope = ""
        self.last_key = -1
        self.last_client_id = ""
        self.last: BoundPlan | None = None
        """The API key and client id of the last request that had a plan, and its bound plan (None: no quota
        applies to that client): valid while ``stamp`` and ``user`` are current. The one memo of the charging
        path. A producer sends one API with one client id, request after request, and a consumer mostly Fetch, so
        the decision finds its handles here; a request of another API binds its plan again (a few lookups in the
        manager's tables), which clients do seconds apart (metadata, heartbeats, commits)."""
        self.plain_key = -1
        self.plain_stamp = -1
        """The API key of the last request no quota charged, and the quotas' stamp then: the same API again under
        the same quotas is not looked up in the plans (the path of every request with fair share on and no quota;
        compiled, the plans' lookup boxes the key and costs ~250 instructions)."""
        self.pid_memo: PidMemo | None = None
        """The last producer id seen and until when the filters know it."""
        self.last_out: dict[int, int] = {}
        """API key -> the size of its last response on this connection, for APIs whose request_percentage estimate
        has a response term (Fetch, Metadata, ...; never Produce): charged with the next request of that API."""
        self.produce_head = b""
        """The last single-topic Produce's head (transactional id to its topic's key, ``produce_topics_head``; empty:
        none), with the topics' stamp then and its replication factor: the request quota's replicated term for the
        next Produce to that topic without reading its topic again (``Policy._replication``). Three fields, not a
        tuple: compiled, a tuple attribute is unboxed and checked item by item at every read (~60 instructions)."""
        self.produce_stamp = -1
        self.produce_rf = -1
        self.produce_shape: Shape | None = None
        """The skeleton of the last Produce request (protocol.record_batches.Shape), to read the next one's id."""
        self.fair: Tenant | None = None
        """Fair share (quotas.fair_share): the tenant this connection's requests are counted to on its broker,
        for the client id and user it was bound with, while ``fair_stamp`` is the policy's fair-share stamp."""
        self.fair_client_id = ""
        self.fair_user = ""
        self.fair_stamp = -1


class Decision:
    """What the policy decided for one request, carried to its response."""

    __slots__ = (
        "user",
        "client_id",
        "scope",
        "state",
        "throttle_ms",
        "later",
        "later_kinds",
        "merge",
        "values",
        "noted",
        "mutations",
        "rejected",
        "new_pids",
        "bytes_in",
        "api_key",
        "api_version",
        "charged_ms",
        "holds",
        "topic_partitions",
        "paced_ms",
        "pace_marks",
        "out_term",
        "fair",
        "fair_mark",
        "fair_ms",
        "fair_shadow",
        "shadow",
    )

    def __init__(
        self, state: ConnState, client_id: str, header: RequestHeader, bytes_in: int, keep_values: bool, shadow: bool
    ) -> None:
        self.state = state
        self.shadow = shadow
        """Shadow mode (``quotas.enforce: false``) as the policy found it when the request came: its throttles are
        computed and recorded, never served. Chosen once a request, so a reload between a request and its answer
        cannot serve half a throttle."""
        """The connection's policy state (read natively at the response; the connection's own fields are not)."""
        user, scope = state.user, state.scope
        self.user = user
        self.client_id = client_id
        self.scope = scope
        self.api_key = header.api_key
        self.api_version = header.api_version
        self.bytes_in = bytes_in
        self.charged_ms = 0
        """The clock value (monotonic ms) the request-time charges used, for an exact replay of the log."""
        self.topic_partitions: list[int] | None = None
        self.throttle_ms = 0
        self.later: tuple[Charged, ...] = ()
        """(kind, handle, basis) charged when the response arrives (response bytes, service time)."""
        self.merge: ResponseMerge | None = None
        self.values: dict[str, tuple[float, float, int]] | None = {} if keep_values else None
        """quota key -> (amount recorded, limit, throttle): the decision log's, kept only while it is on
        (``Policy.keep_values``); without it a decision allocates no dict (a request's kinds are :attr:`noted`)."""
        self.noted = 0
        """The keys of ``values`` as a set of ``quotas.kinds.BIT``, for counting the decision per kind (the
        bound plan's sets, or'ed in by the caller of :meth:`note`)."""
        self.later_kinds = 0
        """The kinds of ``later``: noted when the response comes."""
        self.holds = False
        """The connection's reads are held until this request's throttle is served (ChannelMute.hold, then served)."""
        self.mutations = 0
        self.rejected = 0
        self.new_pids = 0
        self.out_term = False
        """Its response's size is kept for the next request's request_percentage charge (``ConnState.last_out``)."""
        self.paced_ms = 0
        """Smooth enforcement: the wait decided when the request arrived, before it goes to the broker (its
        throttle, served before the broker saw it, so nothing of it is left for the response). What the log
        records; the wait served follows the rate while it runs (:attr:`pace_marks`)."""
        self.fair: Tenant | None = None
        """Fair share held this request back (its mark, :attr:`fair_mark`) or charges its answer (a Fetch while the
        broker is limited): the tenant it is counted to."""
        self.fair_mark = -1.0
        """Where the tenant's fair-share bucket must have refilled to for this request to go (-1: it need not wait)."""
        self.fair_ms = 0
        """The wait or throttle fair share gave this request (the decision log's ``fair_share`` action)."""
        self.fair_shadow = False
        """Fair share in shadow mode (``quotas.fair_share.enforce: false``): :attr:`fair_ms` is the wait it would
        have given; the decision is recorded as shadow."""
        self.pace_marks: list[tuple[Bound, float]] | None = None
        """Smooth enforcement, a paced request: per pacing bucket it owes, where that bucket's refill total stands
        once the request is paid (``QuotaManager.pace_mark``); ``proxy.rules.pacing.paced`` asks again how long that is
        at the rate then in force."""

    def note(self, key: str, amount: float, limit: float, throttle_ms: int) -> None:
        if self.values is not None:
            self.values[key] = (amount, limit, throttle_ms)
        if throttle_ms > self.throttle_ms:  # quotas.throttle.combine, inlined: called on every charge
            self.throttle_ms = throttle_ms if throttle_ms < MAX_THROTTLE_MS else MAX_THROTTLE_MS

    # What the rules that charge after the policy's own step report, through the decision's methods: only this
    # module and the policy that builds a decision assign its fields (issue 49), so what a field holds is read in one
    # place, not followed through the rules that fill it.

    def mutations_charged(
        self, now_ms: int, partitions: list[int], mutations: int, rejected: int, limit: float, throttle_ms: int
    ) -> None:
        """KIP-599's charge (``proxy.rules.mutation_quota``), made once the cluster said what the request would change
        (``now_ms``: when; ``partitions``: per topic in the request)."""
        self.charged_ms = now_ms
        self.topic_partitions = partitions
        self.mutations = mutations
        self.rejected = rejected
        self.note(CONTROLLER_MUTATION_RATE, mutations, limit, throttle_ms)
        self.noted |= _MUTATION_BIT

    def producer_ids_charged(self, new: int, limit: float, throttle_ms: int) -> None:
        """KIP-936's charge (``proxy.rules.producer_id_charge``): ``new`` producer ids new to the user."""
        self.new_pids = new
        self.note(PRODUCER_IDS_RATE, new, limit, throttle_ms)
        self.noted |= _PIDS_BIT

    def answered_through(self, merge: ResponseMerge) -> None:
        """The response body goes through ``merge`` after whatever merge the decision already has (a KIP-599 split,
        then what the cluster created learnt from it)."""
        inner = self.merge
        if inner is None:
            self.merge = merge
        else:
            self.merge = lambda body: merge(memoryview(bytes(inner(body))))


Verdict: TypeAlias = Decision | Replace[Decision] | Answer[Decision] | Defer["Verdict"] | None
"""Everything :meth:`Policy.on_request` may return (``proxy.rules.verdicts``): the one type the connection executes."""
