"""One client connection's request/response ordering, sans-IO: frames in, what to do with them out.

Why: Kafka answers one connection's requests strictly in order, and the proxy adds reasons for a request to
wait or be answered out of the broker's sight (a policy still deciding, a KIP-599 rejection answered here, a
SaslHandshake v0 whose answer decides whether raw tokens follow, a response held until a new broker listener is
up, requests the proxy asks on its own account). All of that ordering state lives here, in one object with no
socket, clock or quota, so it can be driven and tested with bytes alone (h11's ``Connection`` is the model).
The asyncio glue (:mod:`proxy.wire.connection`) feeds it frames, asks the policy, and writes what it is told.

Requests: :meth:`Session.receive` reads one frame (header, SASL state, version caps) and returns a
:class:`~protocol.request.Request` (what every rule reads of it, read once) for the policy, the frame itself to
forward as is (a raw SASL token), or None (answered here). The glue then records what it did with :meth:`forward`
or :meth:`answer`; :meth:`ready_answers` releases the
proxy's own answers once everything before them is answered.

What waits, and until when, is decided here too; the glue only carries it out (pauses the socket, schedules the
next turn, starts the decision). After each request :meth:`after` says whether the frames read behind it go on
or wait, and why (a :class:`Pause` reason: a decision, the mute of a request over quota, a SaslHandshake v0's
answer, the end of a turn); the frames that wait are kept in order. Each reason ends with one event
(:meth:`end_hold`, :meth:`unmuted`), which says whether nothing holds them any more, so the glue takes them back
(:meth:`take_held_requests`) and handles them. Frames read while others wait queue behind them (:meth:`queue`).
A request whose decision must wait out a mute first (a KIP-936 hold) is kept here too (:meth:`defer_decision`).

Responses: :meth:`may_stream` says whether a large response can be forwarded as it arrives;
:meth:`response` matches a whole response to its request (updating the SASL identity); :meth:`streamed` does
the same for the head of a streamed one. Responses held behind one that waits for a new listener queue in
:attr:`held_responses`.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any, Final

from protocol.api_versions import unsupported_version_body
from protocol.apis import Api, api_name
from protocol.endpoint_apis import carries_endpoints_tail, may_carry_addresses
from protocol.errors import MalformedRequest
from protocol.headers import (
    RequestHeader,
    encode_request_header,
    parse_request_header,
    response_body_offset,
    response_correlation_id,
)
from protocol.inflight import InFlight, Pending, requested_wait_ms
from protocol.principal import ConnectionIdentity
from protocol.request import Request, read_request
from protocol.sasl_identity import (
    SaslTokenError,
    decode_authenticate_request,
    decode_authenticate_response,
    decode_handshake_request,
    decode_handshake_response,
)
from protocol.throttle_field import needs_walk
from protocol.topic_guard import LISTING_APIS
from quotas.fair_share import sample_class

RAW = RequestHeader(-1, 0, 0, None, None)
"""The header of a raw SASL token (SaslHandshake v0 is followed by frames without Kafka headers)."""
OWN_CLIENT_ID: Final = "kafka-throttle-proxy"
FRAMES_PER_TURN: Final = 64
"""Requests handled from one read before the event loop serves the other connections (the rest wait for a later
turn, :attr:`Pause.TURN`). One read holds up to 256 KiB: a client pipelining tiny requests could otherwise keep
the loop for thousands of them (issue 30: no connection monopolises the loop); 64 keep a turn near a
millisecond, and a client sending fewer never notices."""
BYTES_PER_TURN: Final = 1 << 20
"""Request bytes handled from one read (or from the requests that stopped waiting) before the event loop serves
the other connections (issue 37): frames alone do not bound a turn, 64 frames of 1 MB are 64 MB to copy and write.
A megabyte is about a millisecond of the loop's work (copied, checked, written to the broker's socket), so a frame
larger than that still goes through whole, but nothing follows it in the same turn."""
_SIZE: Final = struct.Struct(">i")
_SASL_APIS = frozenset({Api.SASL_HANDSHAKE, Api.SASL_AUTHENTICATE})


def needs_whole_body(api_key: int, api_version: int) -> bool:
    """Whether the proxy may rewrite the response to this request anywhere but in its closing endpoints tail
    (``proxy.wire.responses.inspect_response``: broker addresses, ApiVersions caps, the protected topics left out of a
    listing), so it must be assembled before any of it is forwarded. Everything else (the bulk: Fetch, Produce
    and ShareFetch) can be streamed through; its leading bytes are still seen first (``protocol.frames.HEAD_BYTES``),
    and from Fetch v16 / Produce v10, and in every ShareFetch / ShareAcknowledge, its last bytes are held back and
    rewritten by a ``StreamedTail``."""
    if api_key == Api.API_VERSIONS or (api_key == Api.SASL_HANDSHAKE and api_version == 0):
        return True
    if api_key in LISTING_APIS:  # the proxy's own topics are left out of it (protocol.topic_guard)
        return True
    return may_carry_addresses(api_key, api_version) and not carries_endpoints_tail(api_key, api_version)


class Pause:
    """Why one side of a connection is not read. A side keeps the set of reasons that hold it and is read again
    when the set is empty; each reason is set and cleared by the one event named here."""

    CONNECTING: Final = "connecting"
    """The broker connection is being made: the client's first bytes wait for it."""
    MEMORY: Final = "memory"
    """``queued_max_request_bytes`` is spent: a large frame waits until earlier ones were forwarded."""
    DECIDING: Final = "deciding"
    """The policy asks the cluster, or holds a request (a pacing wait, a KIP-936 hold), before deciding."""
    SASL_HANDSHAKE: Final = "sasl-handshake"
    """A SaslHandshake v0 is unanswered: whether raw tokens follow depends on its answer."""
    MUTED: Final = "muted"
    """A throttle is being served (``mute/``)."""
    BACKPRESSURE: Final = "backpressure"
    """The other side's write buffer is above its high-water mark."""
    TURN: Final = "turn"
    """``FRAMES_PER_TURN`` requests of one read were handled: the rest waits for the loop's next turn."""
    NEW_LISTENER: Final = "new-listener"
    """A response names a broker the proxy has no listener for yet: the broker side waits until it has one."""
    REFUSED: Final = "refused"
    """Over a connection limit: never served, closed when the refusal's throttle has run out."""
    DRAINING: Final = "draining"
    """The proxy is shutting down: no more requests are read; the connection closes once every one is answered."""


QUIET_S: Final = 5.0
"""Seconds without traffic after which a connection gives its grown response buffer back (docs/how-it-works.md,
Memory): a connection that fetched a burst should not keep the buffer that burst grew while it idles."""


def _body(frame: Any, header: RequestHeader) -> memoryview:
    """The request's body: a view of ``frame`` after its size prefix and header (read only where a body is)."""
    if header.body_offset is None:
        raise ValueError(f"the body of api {header.api_key} cannot be located")
    return memoryview(frame)[4 + header.body_offset :]


class Session:
    """Ordering state of one client connection (see the module docstring)."""

    __slots__ = (
        "inflight",
        "identity",
        "client_id",
        "version_caps",
        "sasl_hold",
        "_sasl_seen",
        "_held_requests",
        "_holds",
        "deferred",
        "held_responses",
        "_own_corr",
        "_walk_kv",
        "_walk",
        "_turn_bytes",
    )

    def __init__(self, identity: ConnectionIdentity, version_caps: dict[int, int]) -> None:
        self.inflight = InFlight()
        self.identity = identity
        self.client_id = ""
        self.version_caps = version_caps
        self.sasl_hold = False
        """A SaslHandshake v0 is unanswered: what follows it is read only after its answer."""
        self._sasl_seen = identity.attempt is not None
        """A SASL exchange may be in course (a SaslHandshake came through here, or was under way when the session
        began): only then is ``identity.attempt`` read, for every request and response. Why: the identity is not
        compiled, so each read of it is a generic attribute lookup (~180 instructions, twice a round trip), and an
        attempt starts nowhere but at :meth:`ConnectionIdentity.on_handshake_request`, which only :meth:`receive`
        calls."""
        self._held_requests: deque[bytes] | None = None
        self._holds: set[str] = set()
        """Why the frames in ``_held_requests`` wait, besides the mute and ``sasl_hold`` (Pause.DECIDING, TURN)."""
        self.deferred: tuple[Any, Request] | None = None
        """A deferred request (the policy's verdict, the request with its frame copied) whose decision waits until
        the mute is over."""
        self.held_responses: deque[Any] | None = None
        """Responses held behind one that waits for a new broker listener (None when none waits)."""
        self._own_corr = -1
        self._walk_kv = -1  # (api, version) of the last _needs_walk, and its answer
        self._walk = False
        self._turn_bytes = 0
        """Bytes of the frames handled so far in this turn (see :meth:`after`)."""

    # ------------------------------------------------------------------------------------------ requests

    def receive(self, frame: Any, now: float) -> Request | Any | None:
        """Read one request frame: a :class:`Request` for the policy; the frame itself when it is forwarded
        untouched (a raw SASL token); None when it was answered here (see :meth:`ready_answers`). Raises a
        :class:`~protocol.errors.ProtocolError` for a frame that cannot be followed."""
        if self._sasl_seen and self.identity.attempt is not None and self.identity.raw_request_expected:
            self.identity.on_raw_token_request(bytes(memoryview(frame)[4:]))
            self.inflight.push(Pending(RAW, now))
            return frame
        header: RequestHeader | None = None
        try:
            header = parse_request_header(frame, 4)  # bytes for all but large frames: read natively
            cap = self.version_caps.get(header.api_key)
            if cap is not None and header.api_version > cap:
                if header.api_key == Api.API_VERSIONS:  # answered as a broker would: "use one of these"
                    reply = unsupported_version_body(cap)
                    local = _SIZE.pack(4 + len(reply)) + _SIZE.pack(header.correlation_id) + reply
                    self.inflight.push(Pending(header, now, None, local=local))
                    return None
                raise ValueError(f"version is beyond what the proxy decodes (max v{cap})")
            request = read_request(header, frame)
            if header.api_key == Api.SASL_HANDSHAKE:
                self._sasl_seen = True
                self.identity.on_handshake_request(
                    decode_handshake_request(_body(frame, header), header.api_version), header.api_version
                )
                self.sasl_hold = header.api_version == 0
            elif header.api_key == Api.SASL_AUTHENTICATE:
                self.identity.on_authenticate_request(
                    decode_authenticate_request(_body(frame, header), header.api_version)
                )
        except ValueError as exc:  # the readers raise the protocol's errors (ValueErrors), never struct's (#35)
            if isinstance(exc, SaslTokenError):
                raise
            api = "?" if header is None else f"{api_name(header.api_key)} v{header.api_version}"
            raise MalformedRequest(f"malformed request ({api}): {exc}") from None
        if header.client_id is not None and header.client_id != self.client_id:
            self.client_id = header.client_id
        if len(self.inflight):  # (a request the session answers itself returned above: nothing is charged)
            request.alone = False
        return request

    def forward(self, request: Request, decision: Any, frame: Any, now: float, whole: bool = False) -> None:
        """``frame`` (the client's, or the policy's replacement) goes to the broker; its answer, if one comes,
        is matched to ``decision``. ``whole``: the policy rewrites more of the response than its leading
        bytes, so it must be assembled, never streamed."""
        if request.answered:
            header = request.header
            if decision is not None and not whole:
                whole = self._needs_walk(header.api_key, header.api_version)
            # A Produce's timeout was read with its acks (the policy never replaces a Produce's frame).
            wait_ms = request.timeout_ms if header.api_key == Api.PRODUCE else requested_wait_ms(frame, header, 4)
            pending = Pending(header, now, decision, wait_ms=wait_ms, whole=whole)
            pending.sample = sample_class(header.api_key, request.acks, len(frame) - 4)
            self.inflight.push(pending)

    def _needs_walk(self, api_key: int, api_version: int) -> bool:
        """``throttle_field.needs_walk``, remembered for the (api, version) asked last: a client sends the same
        one request after request, and the lookup is an interpreted call."""
        kv = api_key * 65536 + (api_version & 0xFFFF)
        if kv != self._walk_kv:
            self._walk_kv = kv
            self._walk = needs_walk(api_key, api_version)
        return self._walk

    def answer(self, request: Request, decision: Any, frame: bytes, now: float) -> None:
        """The proxy answers ``request`` itself with ``frame``, in its turn (see :meth:`ready_answers`)."""
        self.inflight.push(Pending(request.header, now, decision, local=frame))

    def ready_answers(self) -> list[Pending]:
        """The proxy's own answers that have reached the head of the queue, in order (removed from it)."""
        out = []
        while (head := self.inflight.head()) is not None and head.local is not None:
            out.append(self.inflight.pop(head.header.correlation_id))
        return out

    def after(self, frames: Any, i: int, deferred: bool, muted: bool) -> str | None:
        """``frames[i]`` was handled (forwarded, answered, or ``deferred`` for a decision; ``muted``: the mute holds, a
        request over quota). ``frames`` are one turn's (a read, or the requests that stopped waiting): a turn ends
        after ``FRAMES_PER_TURN`` of them or ``BYTES_PER_TURN`` bytes. None: go on with ``frames[i + 1]``. Otherwise
        the :class:`Pause` reason the frames behind it wait for (kept here, in order), until :meth:`end_hold` or
        :meth:`unmuted` says nothing holds them any more. The order of the checks is the order of the reasons'
        strength: a request being decided is not forwarded yet, so nothing behind it may be; a mute stops reading
        like a broker's; a SaslHandshake v0 decides what the next frames are; a turn only yields to the other
        connections."""
        done = len(frames[i]) + (self._turn_bytes if i else 0)
        self._turn_bytes = done
        if deferred:
            reason: str = Pause.DECIDING
            self._holds.add(reason)
        elif muted:
            reason = Pause.MUTED
        elif self.sasl_hold:
            reason = Pause.SASL_HANDSHAKE
        elif (done >= BYTES_PER_TURN or i + 1 == FRAMES_PER_TURN) and i + 1 < len(frames):  # (cheap tests first)
            reason = Pause.TURN
            self._holds.add(reason)
        else:
            return None
        self.hold_rest(frames[i + 1 :])
        return reason

    def queue(self, frames: Any) -> bool:
        """Frames just read: True when they queue behind requests that wait (kept, in order), False when they are
        to be handled now."""
        if self._held_requests is None:
            return False
        self.hold_rest(frames)
        return True

    def end_hold(self, reason: str, muted: bool) -> bool:
        """``reason`` holds the requests no more (the decision was made, the turn came, the SaslHandshake was
        answered). True when nothing else holds them (``muted``: the mute still does): take them back now."""
        self._holds.discard(reason)
        return not self._holds and not muted and not self.sasl_hold

    def defer_decision(self, deferred: Any, request: Request, muted: bool) -> bool:
        """A deferred request (``after`` said DECIDING) whose decision must first wait out a mute (``muted``):
        True when it is kept for :meth:`unmuted`, False when it is decided now."""
        if not muted:
            return False
        self.deferred = (deferred, request)
        return True

    def unmuted(self, hold_ended: bool) -> tuple[Any, Request] | bool:
        """The mute is over (``hold_ended``: it held a request over quota, whose response has now been served for
        its throttle). The deferred request that waited for it, to decide now; else True when the held requests
        may be taken back (nothing else holds them), False when they still wait."""
        deferred = self.deferred
        if deferred is not None:
            self.deferred = None
            return deferred
        return hold_ended and self.end_hold(Pause.MUTED, False)

    def hold_rest(self, frames: Any) -> None:
        """Frames already read behind one that must wait: kept, copied, in order. Copies: the views may point
        into a receive buffer about to be reused."""
        if self._held_requests is None:
            self._held_requests = deque()
        self._held_requests.extend(bytes(f) for f in frames)

    @property
    def holding_requests(self) -> bool:
        return self._held_requests is not None

    def take_held_requests(self) -> list[bytes]:
        """The frames kept behind the requests that waited, in order; nothing is held afterwards."""
        held, self._held_requests = self._held_requests, None
        return list(held) if held else []

    def own_request(self, api_key: int, api_version: int, body: bytes, now: float, token: Any) -> list[bytes]:
        """A request of the proxy's own on this connection's broker link: the pieces to write. Its answer comes
        back from :meth:`response` with ``pending.internal`` set to ``token``, in order with the client's."""
        corr = self._own_corr
        self._own_corr -= 1
        head = encode_request_header(api_key, api_version, corr, OWN_CLIENT_ID)
        header = RequestHeader(api_key, api_version, corr, OWN_CLIENT_ID, len(head))
        self.inflight.push(Pending(header, now, internal=token))
        return [_SIZE.pack(len(head) + len(body)), head, body]

    # ------------------------------------------------------------------------------------------ responses

    def may_stream(self, head: memoryview) -> bool:
        """Whether a large response, of which ``head`` is the first bytes, can be forwarded as it arrives: only
        when it answers the oldest request, nothing is held before it, and nothing past its leading bytes is
        ever rewritten (:func:`needs_whole_body`: the proxy's own rewrites; ``pending.whole``: the policy's). The
        one place this is decided; the glue carries it out."""
        if self.held_responses is not None:
            return False
        pending = self.inflight.head()
        if pending is None:
            return False
        header = pending.header
        if header is RAW or pending.local is not None or pending.internal is not None:
            return False  # SASL tokens feed the identity tracker; proxy answers and own asks are small, whole
        if header.api_key in _SASL_APIS or pending.whole or needs_whole_body(header.api_key, header.api_version):
            return False
        if header.correlation_id != response_correlation_id(head, 4):
            return False  # assembled, then refused with the usual message
        try:  # a response header that does not parse is refused as an assembled frame would be
            response_body_offset(head[4:], header.api_key, header.api_version)
        except ValueError:
            return False
        return True

    def streamed(self) -> Pending:
        """The head of a streamed response arrived (``may_stream`` said yes): its request, removed."""
        pending = self.inflight.head()
        assert pending is not None  # may_stream said yes: a request is waiting
        self.inflight.pop(pending.header.correlation_id)
        if self._sasl_seen and self.identity.attempt is not None:
            self.identity.on_other_response()
        return pending

    def response(self, frame: Any) -> tuple[Pending, bool]:
        """Match a whole response frame to its request (removed from the queue). Returns the request and
        whether it answered a SaslHandshake v0 that held the requests behind it (they may be read now). Raw
        token answers and answers to the proxy's own requests come back too: ``pending.header is RAW``,
        ``pending.internal``; for the latter nothing else of the frame is read."""
        head = self.inflight.head()
        if head is not None and head.header is RAW:
            self.inflight.pop(head.header.correlation_id)
            self.identity.on_raw_token_response(bytes(memoryview(frame)[4:]))
            return head, False
        pending = self.inflight.pop(response_correlation_id(frame, 4))
        if pending.internal is not None:
            return pending, False
        header = pending.header
        released = False
        key = header.api_key
        if key == Api.SASL_HANDSHAKE or key == Api.SASL_AUTHENTICATE:  # (int compares: native, unlike a set's)
            body = frame[4:]
            body = body[response_body_offset(body, key, header.api_version) :]
            if key == Api.SASL_HANDSHAKE:
                self.identity.on_handshake_response(decode_handshake_response(body, header.api_version))
                released, self.sasl_hold = self.sasl_hold, False
            else:
                self.identity.on_authenticate_response(*decode_authenticate_response(body, header.api_version))
        elif self._sasl_seen and self.identity.attempt is not None:
            self.identity.on_other_response()
        return pending, released

    def expiry(
        self,
        now: float,
        frame_since: float | None,
        reading: bool,
        held_bytes: int,
        last_active: float,
        idle: bool,
        broker: tuple[str, int] | None,
        request_read_timeout_ms: int,
        upstream_timeout_margin_ms: int,
        connections_max_idle_ms: int,
    ) -> tuple[str, str] | None:
        """Whether the connection is to close on a timeout (checked about once a second): ``(kind, reason)``, the
        metric label and the WARNING line (``("idle", "")`` for an idle connection: closed without either), or
        None. A request frame still incomplete after ``request_read_timeout_ms`` of being read (``frame_since``,
        ``reading``: the time unread is not the client's); the broker sitting on the oldest request past the wait
        the request asked for plus the margin; no traffic for ``connections_max_idle_ms`` while nothing is in
        flight, arriving or streaming (``idle``)."""
        if frame_since is not None and reading and now - frame_since > request_read_timeout_ms / 1000:
            return "request_timeout", (
                f"request timeout: a request frame was still incomplete after {request_read_timeout_ms} "
                f"ms ({held_bytes} bytes received)"
            )
        head = self.inflight.head()
        if (
            head is not None
            and head.local is None
            and now - head.sent_at > (head.wait_ms + upstream_timeout_margin_ms) / 1000
        ):
            host, port = broker or ("?", 0)
            header = head.header
            what = "raw SASL token" if header is RAW else f"{api_name(header.api_key)} v{header.api_version}"
            return "broker_timeout", (
                f"broker timeout: broker {host}:{port} did not answer {what} within "
                f"{head.wait_ms + upstream_timeout_margin_ms} ms (its own wait "
                f"{head.wait_ms} ms + upstream_timeout_margin_ms)"
            )
        if now - last_active > connections_max_idle_ms / 1000 and idle and not self.inflight:
            return "idle", ""
        return None

    def quiet(self, now: float, last_active: float) -> bool:
        """Quiet for :data:`QUIET_S`, and no response is held: the receive buffer may shrink (when the client's
        write buffer is empty too, which the glue knows)."""
        return now - last_active > QUIET_S and self.held_responses is None

    def hold_responses(self) -> str:
        """A response waits for a new broker listener: later ones queue behind it, in order, and the broker side
        is not read until it has one (the reason returned)."""
        self.held_responses = deque()
        return Pause.NEW_LISTENER

    def queue_response(self, frame: Any) -> bool:
        """A response (or a piece of one) just read: True when it queues behind one that waits for a listener."""
        if self.held_responses is None:
            return False
        self.held_responses.append(frame)
        return True

    def take_held_responses(self) -> list[Any]:
        held, self.held_responses = self.held_responses, None
        return list(held) if held else []
