"""KIP-219 muting: "this connection may not be read until T", and nothing else.

Why a module of its own: the byte-rate, request and controller-mutation quotas all end the same way (the
response has gone out with ``throttle_time_ms``; the client's next request must wait), and a client that
ignores ``throttle_time_ms`` (old versions, librdkafka) is held to its quota by this alone. Responses keep
flowing while a channel is muted; only reading the client's requests stops.

The clock is the event loop's (``loop.time()``, monotonic); deadlines are given in that clock, so callers
that compute throttle times from their own injected clock convert once, at the edge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ChannelMute:
    """Holds one connection's reads until a deadline; a later deadline extends the mute, an earlier one is
    ignored (the longest throttle of all quotas wins, as the broker does)."""

    __slots__ = ("_loop", "_pause", "_resume", "_until", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self._loop = loop
        self._pause = pause
        self._resume = resume
        self._until = 0.0
        self._timer: asyncio.TimerHandle | None = None

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
            self._pause()
        else:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._resume()

    def cancel(self) -> None:
        """The connection is closing: drop the timer without resuming anything."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
