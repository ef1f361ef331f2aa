"""Throttle-time plumbing shared by every quota: Java rounding, combining throttles, and KIP-219's table.

Pure policy: no I/O and no clocks.

KIP-219 (Kafka 2.0) made brokers answer at once with ``throttle_time_ms`` set and then mute the connection. A
client only backs off by itself from the request version at which the response's ``shouldClientThrottle``
returns true (Apache Kafka, ``*Response.shouldClientThrottle``); below that version, or for APIs that never
back off, the client sends its next request immediately and only the mute protects the cluster. The proxy
therefore mutes in every case; :func:`should_client_throttle` only tells it whether the client is *expected*
to wait (useful for metrics and for deciding how hard to enforce).

Reference: ``AbstractResponse.shouldClientThrottle`` and its overrides; ``QuotaUtils.throttleTime`` (which
rounds with Java's ``Math.round``). Behaviour is reproduced, code is not copied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "MAX_THROTTLE_MS",
    "NEVER_CLIENT_THROTTLE",
    "SHOULD_CLIENT_THROTTLE_SINCE",
    "combine",
    "java_round",
    "should_client_throttle",
]

MAX_THROTTLE_MS: Final = 2**31 - 1
"""``throttle_time_ms`` is an int32 on the wire: :func:`combine` clamps to it so a huge throttle cannot wrap."""

_JAVA_LONG_MAX: Final = 2**63 - 1
_JAVA_LONG_MIN: Final = -(2**63)


def java_round(x: float) -> int:
    """Round like Java's ``Math.round(double)``: half up (towards +inf), unlike Python's banker's rounding.

    Kafka computes every throttle time with ``Math.round``; ``round(2.5)`` would give 2 here and 3 in Kafka.
    NaN gives 0 and infinities saturate to Java's long range, as ``Math.round`` does.
    """
    if math.isnan(x):
        return 0
    if x >= _JAVA_LONG_MAX:
        return _JAVA_LONG_MAX
    if x <= _JAVA_LONG_MIN:
        return _JAVA_LONG_MIN
    return math.floor(x + 0.5)


def combine(*throttles: float) -> int:
    """The ``throttle_time_ms`` to send: the max over every quota that applies (and the upstream broker's own
    value), never negative, clamped to int32. ``combine()`` is 0.

    Kafka takes the max (``KafkaApis``: request quota vs. byte-rate / controller-mutation quota) rather than the
    sum: the quotas are enforced concurrently by one mute, so the longest one is what the client must wait.
    """
    best = 0
    for t in throttles:
        v = int(t)
        if v > best:
            best = v
    return best if best < MAX_THROTTLE_MS else MAX_THROTTLE_MS


def _table() -> dict[int, int]:
    since: dict[int, int] = {}
    rows = {
        0: (43, 44, 45, 46, 47, 50, 51, 62, 63, 64, 75),
        1: (21, 22, 24, 25, 26, 28, 29, 30, 31, 33, 34, 35, 37, 38, 39, 40, 41, 42),
        2: (10, 12, 13, 14, 15, 16, 18, 20, 32),
        3: (2, 11, 19),
        4: (8, 9),
        6: (0, 3),
        8: (1,),
    }
    for version, keys in rows.items():
        for key in keys:
            since[key] = version
    return since


SHOULD_CLIENT_THROTTLE_SINCE: Final[Mapping[int, int]] = MappingProxyType(_table())
"""api_key -> first request version whose response the client honours by backing off itself (KIP-219)."""

NEVER_CLIENT_THROTTLE: Final[frozenset[int]] = frozenset(
    (4, 5, 6, 7, 17, 23, 27, 36, 48, 49, *range(52, 62), *range(65, 75), *range(76, 88))
)
"""api_keys whose clients never back off on ``throttle_time_ms`` (``shouldClientThrottle`` is false, or the
response has no throttle field): cluster-internal APIs, SaslHandshake/SaslAuthenticate, the quota admin APIs,
KRaft-internal and newer APIs. Only muting restrains these."""


def should_client_throttle(api_key: int, api_version: int) -> bool:
    """True if a client sending ``api_key`` at ``api_version`` is expected to wait ``throttle_time_ms`` itself.

    Unknown (future) API keys answer False: assuming a client cooperates when we cannot know is how a quota gets
    bypassed, and the proxy mutes regardless.
    """
    since = SHOULD_CLIENT_THROTTLE_SINCE.get(api_key)
    return since is not None and api_version >= since
