"""KIP-219 muting: "this connection may not be read until T", and nothing else.

Why a module of its own: the byte-rate, request and controller-mutation quotas all end the same way (the
response has gone out with ``throttle_time_ms``; the client's next request must wait), and a client that
ignores ``throttle_time_ms`` (old versions, librdkafka) is held to its quota by this alone. Responses keep
flowing while a channel is muted; only reading the client's requests stops.

A request charged over quota *holds* the channel at once (:meth:`ChannelMute.hold`: nothing after it is read,
as a broker mutes the channel it came on), and the mute then runs from when its response is sent
(:meth:`ChannelMute.served`, KIP-219). A KIP-936 producer-id hold is a plain mute for the time the user still
owes; whoever holds the request itself waits for the same ``resume``.

The clock is the event loop's (``loop.time()``, monotonic); deadlines are given in that clock, so callers
that compute throttle times from their own injected clock convert once, at the edge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class ChannelMute:
    """Holds one connection's reads until a deadline; a later deadline extends the mute, an earlier one is
    ignored (the longest throttle of all quotas wins, as the broker does). ``pause()`` is called when reading
    must stop, ``resume(hold_ended)`` when it may go on again (``hold_ended``: a :meth:`hold` is over, so the
    requests read behind the held one may now be processed)."""

    __slots__ = ("_loop", "_pause", "_resume", "_until", "_timer", "held")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pause: Callable[[], None], resume: Callable[[bool], None]
    ) -> None:
        self._loop = loop
        self._pause = pause
        self._resume = resume
        self._until = 0.0
        self._timer: Any = None
        """The mute's timer (None: none runs). ``Any``: compiled, an annotation is checked at run time, and uvloop's
        ``TimerHandle`` is not asyncio's."""
        self.held = False
        """A request over quota is being served: nothing after it is read until :meth:`served`."""

    def hold(self) -> None:
        """The request being processed is over a quota: stop reading now, whatever the clock says."""
        if not self.held:
            self.held = True
            if self._timer is None:
                self._pause()

    def served(self, seconds: float) -> None:
        """The held request's response is on its way: reading resumes ``seconds`` from now (KIP-219)."""
        if not self.held:
            self.mute_for(seconds)
            return
        self.held = False
        now = self._loop.time()
        deadline = max(now + max(seconds, 0.0), self._until if self._timer is not None else 0.0)
        if deadline <= now:
            self._resume(True)
            return
        self._until = deadline
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._expire_hold)

    @property
    def until(self) -> float:
        """Loop time at which reading may resume (0 when never muted)."""
        return self._until

    @property
    def muted(self) -> bool:
        return self._timer is not None

    def mute_for(self, seconds: float) -> None:
        if seconds > 0:
            self.mute_until(self._loop.time() + seconds)

    def mute_until(self, deadline: float) -> None:
        if deadline <= self._until and self._timer is not None:
            return
        if deadline <= self._loop.time():
            return
        self._until = deadline
        if self._timer is None:
            if not self.held:
                self._pause()
        else:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if not self.held:
            self._resume(False)

    def _expire_hold(self) -> None:
        self._timer = None
        if not self.held:  # a new hold may have begun meanwhile; it ends with its own served()
            self._resume(True)

    def cancel(self) -> None:
        """The connection is closing: drop the timer without resuming anything."""
        self.held = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
