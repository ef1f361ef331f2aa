"""KIP-936 user holds: "this user's next Produce / InitProducerId, on any connection, is not read until T".

Why here and not with the quota: muting one connection does not stop the KIP's misbehaving pattern (a new
producer, on a new connection, per batch), so the hold belongs to the user, across connections. The quota says
how long; this keeps the deadlines, bounded by the users that currently owe time. Time is passed in (seconds of
the caller's monotonic clock).
"""

from __future__ import annotations


class KeyedHolds:
    """Deadlines by key; a later deadline extends a hold, an earlier one is ignored."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def __len__(self) -> int:
        return len(self._until)

    def hold(self, key: str, until: float) -> None:
        if until > self._until.get(key, 0.0):
            self._until[key] = until

    def remaining(self, key: str, now: float) -> float:
        """Seconds ``key`` must still wait (0 when it need not; an expired hold is dropped)."""
        until = self._until.get(key)
        if until is None:
            return 0.0
        if until <= now:
            del self._until[key]
            return 0.0
        return until - now

    def expire(self, now: float) -> None:
        for key in [k for k, until in self._until.items() if until <= now]:
            del self._until[key]
