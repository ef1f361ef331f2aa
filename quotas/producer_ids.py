"""KIP-936's producer-id cache: per user, "is this producer id new within the window?".

Why: every idempotent or transactional producer instance gets a producer id, and the broker keeps state for each
one until ``producer.id.expiration.ms``; a user whose producers restart in a loop (or who create one producer
per batch) grows that state until the broker runs out of memory. KIP-936 charges each user for the *new*
producer ids it brings, at a rate ``producer_ids_rate`` measured over ``window.num × window.size`` (like the
controller-mutation quota). This module answers only the "is it new?" question and accounts for its own
memory; the rate, the token bucket and the throttle time are computed elsewhere from the ids it reports new.

Structure (as in the KIP): a map from user (KafkaPrincipal name) to a :class:`~quotas.bloom.TimeControlledBloomFilter`
(two bloom filters; a new one every half ``window.size``, the oldest dropped after a full ``window.size``), and a
cleanup pass that drops users left with no live filter.

Configuration (:class:`ProducerIdQuotaConfig`):

``window_num`` (11), ``window_size_s`` (3600), ``cleanup_interval_ms`` (10)
    ``producer.id.quota.window.num``, ``producer.id.quota.window.size.seconds`` and
    ``producer.id.quota.cache.cleanup.scheduler.interval.ms``, with the KIP's defaults. Only ``window_size_s``
    affects the filters; ``window_num`` is carried for the rate computed elsewhere (:attr:`rate_window_ms`).
``expected_ids`` (1000) and ``false_positive_rate`` (0.01)
    Bloom sizing per filter. The KIP does not name values. 1000 ids per half hour per user is far above what a
    healthy user creates (a few long-lived producers) and still well above any useful ``producer_ids_rate``, so
    the filter only saturates for a user who is already throttled hard. 1 % false positives means at most about
    1 new id in 100 goes uncharged, always in the user's favour (a known id is never charged twice). This costs
    9 586 bits = 1 199 bytes and 7 hashes per filter, so at most 2 398 bytes of bit arrays per user (about
    3.0 KB with Python's object overhead, measured by ``bench/pid_scan.py``). Past ``expected_ids`` ids per half window
    the false-positive rate climbs (≈ 16 % at 2×, ≈ 83 % at 5×): under-counting, never over-counting, and only
    for a user already far over any sensible quota, whose measured rate stays high anyway.

Cleanup schedule: :meth:`ProducerIdTracker.cleanup` costs O(filters expired since the last call) — it pops a
queue ordered by expiry time — so the caller can run it every ``cleanup_interval_ms`` as the KIP's scheduler
does (or less often; an idle user's entry then lives a little longer, and nothing else changes).

Time is always passed in (``now_ms``); times that go backwards are clamped to the latest seen. Not thread-safe.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from quotas.bloom import TimeControlledBloomFilter, bloom_size


@dataclass(frozen=True, slots=True)
class ProducerIdQuotaConfig:
    """KIP-936's broker configs plus the bloom sizing (see the module doc for the defaults' reasons)."""

    window_num: int = 11
    window_size_s: int = 3600
    cleanup_interval_ms: int = 10
    expected_ids: int = 1000
    false_positive_rate: float = 0.01

    def __post_init__(self) -> None:
        if self.window_num < 1:
            raise ValueError(f"producer.id.quota.window.num must be >= 1, got {self.window_num}")
        if self.window_size_s < 1:
            raise ValueError(f"producer.id.quota.window.size.seconds must be >= 1, got {self.window_size_s}")
        if self.cleanup_interval_ms < 1:
            raise ValueError(f"cleanup interval must be >= 1 ms, got {self.cleanup_interval_ms}")
        bloom_size(self.expected_ids, self.false_positive_rate)  # validates both

    @property
    def window_ms(self) -> int:
        """One filter's lifetime: ``producer.id.quota.window.size.seconds`` in ms."""
        return self.window_size_s * 1000

    @property
    def rate_window_ms(self) -> int:
        """The span ``producer_ids_rate`` is measured over (``window.num × window.size``), for the rate keeper."""
        return self.window_num * self.window_size_s * 1000


class ProducerIdTracker:
    """Per-user time-controlled bloom filters deciding whether a producer id is new; bounded memory per user."""

    __slots__ = ("config", "bits", "hashes", "_filter_bytes", "_users", "_expiries", "_filters", "_now")

    def __init__(self, config: ProducerIdQuotaConfig | None = None) -> None:
        self.config = config or ProducerIdQuotaConfig()
        self.bits, self.hashes = bloom_size(self.config.expected_ids, self.config.false_positive_rate)
        """Bits and hash functions of each bloom filter at this configuration (read only)."""
        self._filter_bytes = (self.bits + 7) >> 3
        self._users: dict[Hashable, TimeControlledBloomFilter] = {}
        # (expiry_ms, user) for every filter created, in creation order. Creation times never go backwards (the
        # clock is clamped), so this is sorted by expiry and cleanup only ever pops from the left.
        self._expiries: deque[tuple[int, Hashable]] = deque()
        self._filters = 0  # live bloom filters across all users, kept exact for O(1) memory_bytes()
        self._now = -(1 << 62)

    def _clamp(self, now_ms: int) -> int:
        if now_ms > self._now:
            self._now = now_ms
        return self._now

    def observe(self, user: Hashable, pid: int, now_ms: int) -> bool:
        """True if ``pid`` is new to ``user`` within the window (it is then recorded); False if already known.

        Charge the user's ``producer_ids_rate`` by one for each True. ``pid`` is a signed 64-bit producer id;
        callers pass only real ids (the record-batch scanner already leaves out −1, "no producer id").
        """
        return self.observe_until(user, pid, now_ms)[0]

    def observe_until(self, user: Hashable, pid: int, now_ms: int) -> tuple[bool, int]:
        """:meth:`observe`, and until when ``pid`` stays known to ``user`` (ms) if nothing else is written: seeing
        it again before then would answer False and change nothing, so a caller may skip asking."""
        now_ms = self._clamp(now_ms)
        pair = self._users.get(user)
        if pair is None:
            pair = self._users[user] = TimeControlledBloomFilter(self.bits, self.hashes, self.config.window_ms)
        before_filters = pair.filters
        before_created = pair.newest_created_ms
        new, until = pair.add_if_absent_until(pid, now_ms)
        self._filters += pair.filters - before_filters
        created = pair.newest_created_ms
        if created is not None and created != before_created:
            self._expiries.append((created + self.config.window_ms, user))
        return new, until

    def observe_many(self, user: Hashable, pids: Iterable[int], now_ms: int) -> int:
        """How many of ``pids`` are new to ``user`` (each recorded): the amount to charge for one request."""
        return sum(self.observe(user, pid, now_ms) for pid in pids)

    def contains(self, user: Hashable, pid: int, now_ms: int) -> bool:
        """Whether ``pid`` is known for ``user`` right now, without recording it (for tests and diagnostics)."""
        pair = self._users.get(user)
        return pair is not None and pair.might_contain(pid, self._clamp(now_ms))

    def cleanup(self, now_ms: int) -> int:
        """Drop filters a full window old and users left with none; returns how many users were removed.

        Cost is proportional to the filters that expired since the last call, not to the number of users.
        """
        now_ms = self._clamp(now_ms)
        removed = 0
        expiries = self._expiries
        while expiries and expiries[0][0] <= now_ms:
            _, user = expiries.popleft()
            pair = self._users.get(user)
            if pair is None:
                continue
            before = pair.filters
            gone = pair.expired(now_ms)
            self._filters += pair.filters - before
            if gone:
                del self._users[user]
                removed += 1
        return removed

    def users(self) -> int:
        """Users currently holding an entry (idle ones disappear at the next :meth:`cleanup` after expiry)."""
        return len(self._users)

    def memory_bytes(self) -> int:
        """Bytes of bloom bit arrays held across all users (exact; excludes Python object overhead)."""
        return self._filters * self._filter_bytes

    def user_memory_bytes(self, user: Hashable) -> int:
        """Bytes of bloom bit arrays held for ``user``: 0, one filter, or at most :attr:`max_bytes_per_user`."""
        pair = self._users.get(user)
        return pair.nbytes if pair is not None else 0

    @property
    def filter_bytes(self) -> int:
        """Bytes of one bloom filter's bit array at this configuration."""
        return self._filter_bytes

    @property
    def max_bytes_per_user(self) -> int:
        """Upper bound of :meth:`user_memory_bytes`: two filters, whatever the user sends."""
        return 2 * self._filter_bytes
