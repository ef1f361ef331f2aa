"""What the policy may answer for a request, and the little of a connection it may touch.

Why a module of its own: the connection applies verdicts and the policy makes them; with the types here the policy
never imports the connection (the connection holds the concrete ``proxy.rules.policy.Policy``: compiled, its methods are
called natively), and :class:`PolicyConnection` names the whole of what a policy may read or do to a connection
(so a policy can be unit-tested against a plain object, without sockets).

A verdict (``proxy.rules.policy.Verdict``, the one type the connection executes) is one of: ``None`` (forward the frame,
nothing to follow), a decision object (forward, and hand the response to ``on_response`` with it),
:class:`Replace`, :class:`Answer`, or :class:`Defer`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from protocol.request import Request
from proxy.stats import Traffic

V = TypeVar("V")
"""What a deferred decision gives (``proxy.rules.decisions.Verdict``: typed there, where the policy's Decision is)."""
D = TypeVar("D")
"""The policy's decision carried to the response (``proxy.rules.decisions.Decision``)."""


@dataclass(slots=True)
class Defer(Generic[V]):
    """The policy needs to ask the cluster, or to wait, before it can decide: the request, and every request
    after it on this connection, wait (unread, in order) until the awaitable that ``decide()`` returns gives
    the verdict. ``decide`` is a function, not an awaitable: the connection starts it when it is ready, after
    ``wait_s`` seconds during which the connection is muted (a KIP-936 hold)."""

    decide: Callable[[], Awaitable[V]]
    """Gives the verdict (``proxy.rules.decisions.Verdict``)."""
    wait_s: float = 0.0
    request: Request | None = None
    """The request it decides, set by the connection that carries the wait out: the
    decision, when it comes, is applied to it as read, never to the frame read again."""

    def __post_init__(self) -> None:
        if not callable(self.decide):  # a coroutine object handed over by mistake would fail only when awaited
            raise TypeError(f"Defer takes a function returning an awaitable, not {type(self.decide).__name__}")


@dataclass(slots=True)
class Replace(Generic[D]):
    """Forward ``frame`` (a whole request frame, size prefix included) instead of the client's. ``whole``: the
    policy will rewrite the response past its leading bytes (a KIP-599 merge), so it is never streamed."""

    decision: D
    frame: bytes
    whole: bool = False


@dataclass(slots=True)
class Answer(Generic[D]):
    """The proxy answers this request itself with ``frame``; the cluster never sees the request."""

    decision: D | None
    """None: no quota decision follows it to the response (a refusal, a quota API's answer)."""
    frame: bytes


class Identity(Protocol):
    @property
    def principal(self) -> str: ...


class Mute(Protocol):
    def mute_for(self, seconds: float) -> None: ...
    def hold(self) -> None: ...
    def served(self, seconds: float) -> None: ...


class PolicyConnection(Protocol):
    """All a policy reads of a connection, or does to it."""

    # Read only (properties here, so that the connection's own, more specific types satisfy them).
    @property
    def id(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def identity(self) -> Identity: ...
    @property
    def upstream_addr(self) -> tuple[str, int] | None: ...
    @property
    def mute(self) -> Mute: ...

    traffic: Traffic
    """Its traffic since the last decision-log summary (the policy leaves out what it logged on its own)."""
    # Written by the policy too.
    policy_state: Any
    """What the policy keeps per connection (None at first): the last producer id seen and until when it is known."""

    def ask(self, api_key: int, api_version: int, body: bytes) -> Awaitable[bytes]:
        """Send a request of the proxy's own on this connection's broker link; the response body (after its
        header) comes back, in order with the client's requests."""
        ...
