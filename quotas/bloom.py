"""Bloom filters for KIP-936: "have we seen this producer id for this user recently?".

Why a bloom filter and not a set: KIP-936 exists to stop one misbehaving principal from exhausting a broker's
memory with producer ids; a per-user ``set`` of ids would move that exhaustion into the proxy. A bloom filter's
size is fixed when it is created (``bytearray`` of ``m`` bits), whatever the user sends. The price is false
positives (a genuinely new id reported as known, so not charged); there are never false negatives, so a known id
is never charged twice inside its window (KIP-936, "Known Limitations").

Sizing, the textbook formulas for ``n`` expected items and false-positive rate ``p``::

    m = ceil(-n ln p / (ln 2)^2)    bits
    k = round(m / n * ln 2)         hash functions (at least 1)

Hashing: one MurmurHash3 x64 128-bit hash of the id's 8 big-endian bytes, split into two 64-bit halves ``h1`` and
``h2``, and the ``k`` bit positions ``(h1 + i * h2) mod m`` (Kirsch & Mitzenmacher double hashing: the same
asymptotic false-positive rate as ``k`` independent hashes, for one hash call). The positions depend only on
``m`` and ``k``, so a :class:`TimeControlledBloomFilter` computes them once and probes both its filters.

Time: nothing here reads a clock. Every time-dependent call takes ``now_ms`` from the caller (the proxy's event
loop time, or a test's counter), which keeps the module deterministic and testable.

Not thread-safe: the proxy runs one asyncio loop, so no locking is paid for.
"""

from __future__ import annotations

import math
import struct

import mmh3

_PID = struct.Struct(">q")
_MASK64 = (1 << 64) - 1


def bloom_size(expected_items: int, false_positive_rate: float) -> tuple[int, int]:
    """``(bits, hashes)`` for ``expected_items`` ids at ``false_positive_rate`` (the formulas in the module doc)."""
    if expected_items < 1:
        raise ValueError(f"expected_items must be >= 1, got {expected_items}")
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"false_positive_rate must be in (0, 1), got {false_positive_rate}")
    ln2 = math.log(2)
    bits = max(8, math.ceil(-expected_items * math.log(false_positive_rate) / (ln2 * ln2)))
    hashes = max(1, round(bits / expected_items * ln2))
    return bits, hashes


def bit_positions(key: int, bits: int, hashes: int) -> list[int]:
    """The ``hashes`` bit indexes of ``key`` (a signed 64-bit producer id) in a filter of ``bits`` bits."""
    h = mmh3.hash128(_PID.pack(key))
    h1 = (h & _MASK64) % bits  # reduced first: small-int arithmetic below is ~3x faster than 128-bit
    h2 = (h >> 64) % bits
    return [(h1 + i * h2) % bits for i in range(hashes)]


class BloomFilter:
    """A fixed-size bloom filter over signed 64-bit ints; memory is ``ceil(bits / 8)`` bytes, forever."""

    __slots__ = ("bits", "hashes", "_array", "count")

    def __init__(self, bits: int, hashes: int) -> None:
        if bits < 1 or hashes < 1:
            raise ValueError(f"a bloom filter needs bits >= 1 and hashes >= 1, got {bits}, {hashes}")
        self.bits = bits
        self.hashes = hashes
        self._array = bytearray((bits + 7) >> 3)
        self.count = 0
        """Ids added (duplicates included when the caller adds them twice); for saturation metrics only."""

    @classmethod
    def for_capacity(cls, expected_items: int, false_positive_rate: float) -> BloomFilter:
        return cls(*bloom_size(expected_items, false_positive_rate))

    @property
    def nbytes(self) -> int:
        """Bytes of the bit array (the only part that grows with the configuration)."""
        return len(self._array)

    def add_positions(self, positions: list[int]) -> None:
        arr = self._array
        for p in positions:
            arr[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def contains_positions(self, positions: list[int]) -> bool:
        arr = self._array
        for p in positions:  # noqa: SIM110 - a plain loop is faster than all(<genexpr>) here
            if not arr[p >> 3] & (1 << (p & 7)):
                return False
        return True

    def add(self, key: int) -> None:
        self.add_positions(bit_positions(key, self.bits, self.hashes))

    def might_contain(self, key: int) -> bool:
        """False means certainly never added; True means added, or a false positive (rate ≈ the configured p)."""
        return self.contains_positions(bit_positions(key, self.bits, self.hashes))


class TimeControlledBloomFilter:
    """KIP-936's per-user pair of bloom filters: at most two live, the newer written, both read.

    Schedule (``window_ms`` is ``producer.id.quota.window.size.seconds``): a filter is written for at most half a
    window after it is created and dropped once it is a full window old. An id added at ``t`` therefore stays
    known until some time in ``(t + window/2, t + window]``, then is new again. Windows are per user and start
    at the user's first id, as in the KIP.

    One deliberate difference from the KIP's scheduler: the next filter is created lazily, when the first id that
    needs writing arrives at least half a window after the newest filter was created, instead of exactly at that
    half-window mark. An empty filter answers nothing, so the answers are the same; an idle user just holds no
    empty filter, and the bound above still holds because a filter is never written more than half a window after
    its creation. Times that go backwards are clamped to the latest time seen.
    """

    __slots__ = ("bits", "hashes", "window_ms", "_half_ms", "_old", "_old_created", "_new", "_new_created", "_now")

    def __init__(self, bits: int, hashes: int, window_ms: int) -> None:
        if window_ms < 2:
            raise ValueError(f"window_ms must be >= 2, got {window_ms}")
        self.bits = bits
        self.hashes = hashes
        self.window_ms = window_ms
        self._half_ms = (window_ms + 1) // 2  # ceil: old + new ages always sum to >= a window
        self._old: BloomFilter | None = None
        self._old_created = 0
        self._new: BloomFilter | None = None
        self._new_created = 0
        self._now = -(1 << 62)

    def _expire(self, now_ms: int) -> int:
        if now_ms < self._now:
            now_ms = self._now
        else:
            self._now = now_ms
        if self._old is not None and now_ms - self._old_created >= self.window_ms:
            self._old = None
        if self._new is not None and now_ms - self._new_created >= self.window_ms:
            self._new = None
        return now_ms

    def _known(self, positions: list[int]) -> bool:
        return (self._new is not None and self._new.contains_positions(positions)) or (
            self._old is not None and self._old.contains_positions(positions)
        )

    def might_contain(self, key: int, now_ms: int) -> bool:
        """Whether ``key`` was added within its window (false positives possible, false negatives never)."""
        self._expire(now_ms)
        return self._known(bit_positions(key, self.bits, self.hashes))

    def add_if_absent(self, key: int, now_ms: int) -> bool:
        """True if ``key`` was not known (it is then written to the newest filter); False if already known.

        A known id is not re-written, as in the KIP ("no need to update the cache"), so a producer that keeps
        producing is counted again once its filter ages out, i.e. once every half to one window.
        """
        return self.add_if_absent_until(key, now_ms)[0]

    def add_if_absent_until(self, key: int, now_ms: int) -> tuple[bool, int]:
        """:meth:`add_if_absent`, and until when ``key`` stays known with no further write: the expiry of the
        newest filter holding it. A caller that sees the same key again before then may skip asking."""
        now_ms = self._expire(now_ms)
        positions = bit_positions(key, self.bits, self.hashes)
        if self._new is not None and self._new.contains_positions(positions):
            return False, self._new_created + self.window_ms
        if self._old is not None and self._old.contains_positions(positions):
            return False, self._old_created + self.window_ms
        if self._new is None or now_ms - self._new_created >= self._half_ms:
            # Rotate: the current newest becomes read-only. The previous old one is at least a window old by now
            # (it was created >= half a window before the newest), so _expire already dropped it.
            self._old, self._old_created = self._new, self._new_created
            self._new, self._new_created = BloomFilter(self.bits, self.hashes), now_ms
        self._new.add_positions(positions)
        return True, self._new_created + self.window_ms

    def expired(self, now_ms: int) -> bool:
        """True once no filter is live any more (the user's entry can be dropped)."""
        self._expire(now_ms)
        return self._new is None and self._old is None

    @property
    def newest_created_ms(self) -> int | None:
        return self._new_created if self._new is not None else None

    @property
    def newest_count(self) -> int:
        """Ids written to the newest filter; above the sizing ``n`` its false-positive rate exceeds ``p``."""
        return self._new.count if self._new is not None else 0

    @property
    def filters(self) -> int:
        return (self._new is not None) + (self._old is not None)

    @property
    def nbytes(self) -> int:
        """Bytes of the live bit arrays: at most ``2 * ceil(bits / 8)``."""
        return sum(f.nbytes for f in (self._new, self._old) if f is not None)
