"""Which responses can name a broker, and the per-response check for the usual case that one does not.

Why a module of its own: every Produce v10+ and Fetch v16+ response may carry KIP-951 ``node_endpoints`` (a
top-level tagged field), and almost none does. That check runs on every such response, so it is compiled (see
``proxy.build_info``) and kept apart from ``protocol.addresses``, which decodes and rewrites the rare response
that does name brokers with kafka-python's schema classes and stays interpreted.
"""

from __future__ import annotations

from typing import Final

from protocol.apis import RESPONSES, Api
from protocol.skim import SMALL_BODY_BYTES, top_level_tags

NODE_ENDPOINTS_TAG: Final = 0
"""The tag of ``node_endpoints`` in Produce and Fetch responses."""
SHARE_ADDRESS_APIS: Final = frozenset({Api.SHARE_FETCH, Api.SHARE_ACKNOWLEDGE})
"""Responses whose ``node_endpoints`` is a regular top-level field (the last one), in every version."""
ADDRESS_APIS: Final = frozenset(
    {Api.METADATA, Api.FIND_COORDINATOR, Api.DESCRIBE_CLUSTER, Api.PRODUCE, Api.FETCH} | SHARE_ADDRESS_APIS
)
"""Every API whose response can name a broker, at some version."""
PRODUCE_ENDPOINTS_SINCE: Final = 10
FETCH_ENDPOINTS_SINCE: Final = 16


def tagged_endpoints_since(api_key: int) -> int | None:
    """The first version of Produce and Fetch responses with the ``node_endpoints`` tag; None for other APIs."""
    if api_key == Api.PRODUCE:
        return PRODUCE_ENDPOINTS_SINCE
    if api_key == Api.FETCH:
        return FETCH_ENDPOINTS_SINCE
    return None


def may_carry_addresses(api_key: int, version: int) -> bool:
    """Whether a response to this request can hold a broker address (Produce and Fetch only from the
    KIP-951 versions on); the proxy streams big responses only when this is False."""
    if api_key not in ADDRESS_APIS:
        return False
    since = tagged_endpoints_since(api_key)
    return since is None or version >= since


def carries_endpoints_tail(api_key: int, version: int) -> bool:
    """Whether the only addresses a response can carry are in its ``node_endpoints``, at its end: the
    top-level tagged field of Produce v10+ and Fetch v16+, the last regular field of ShareFetch and
    ShareAcknowledge. Such a response may stream through with ``protocol.tail_watch`` and have just
    that tail (``protocol.addresses.tail_watch_class``) rewritten at the end."""
    if api_key in SHARE_ADDRESS_APIS:
        return True
    since = tagged_endpoints_since(api_key)
    return since is not None and version >= since


def tags_endpoints(api_key: int, version: int, body: bytes | memoryview, shape: ResponseShape | None = None) -> bool:
    """Whether a Produce v10+ or Fetch v16+ response ``body`` has the ``node_endpoints`` tag (one skip over the
    body, see ``skim.top_level_tags``). Raises TruncatedError (a ValueError) for a body that does not parse.

    ``shape``: the connection's memo. A small body shaped like the last one it remembers has no tag, and is
    not walked: a producer's responses repeat one shape, so the walk, a large part of a plain Produce round
    trip, is nearly always saved."""
    if shape is None or len(body) > SMALL_BODY_BYTES:
        return NODE_ENDPOINTS_TAG in top_level_tags(RESPONSES[api_key], version, body)
    data = body if isinstance(body, bytes) else bytes(body)  # compiled, bytes() is a generic call
    if shape.matches(api_key, version, data):
        return False
    free: list[int] = []
    if NODE_ENDPOINTS_TAG in top_level_tags(RESPONSES[api_key], version, data, free):
        return True
    shape.remember(api_key, version, data, free)
    return False


class ResponseShape:
    """One connection's last small Produce or Fetch response body that carried no ``node_endpoints``, reduced to
    the bytes that steer a walk of it (the ``free`` spans of ``skim.skip`` are left out).

    Why: a producer's responses repeat one shape (the same topics and partitions, no errors), and only offsets,
    timestamps and the throttle time change, all fixed-size fields. A body of the same API, version and length
    whose every other byte is the same walks the same way, so it has no tag either. An error, a new partition or
    a tagged field changes a length, a count or a tag section, and the body is walked again. Per connection:
    one body of at most ``skim.SMALL_BODY_BYTES`` and its gaps.
    """

    __slots__ = ("api_key", "version", "body", "gaps")

    def __init__(self) -> None:
        self.api_key = -1
        self.version = -1
        self.body = b""
        self.gaps: list[int] = []
        """Spans (start, stop, flat) of ``body`` that must be equal: everything outside the walk's free spans."""

    def matches(self, api_key: int, version: int, body: bytes) -> bool:
        """Whether ``body`` agrees with the remembered one on every byte that steers the walk."""
        prev = self.body
        if api_key != self.api_key or version != self.version or len(body) != len(prev):
            return False
        gaps = self.gaps
        for k in range(0, len(gaps), 2):
            j: int = gaps[k]
            stop: int = gaps[k + 1]
            while j < stop:
                if body[j] != prev[j]:
                    return False
                j += 1
        return True

    def remember(self, api_key: int, version: int, body: bytes, free: list[int]) -> None:
        """Keep ``body``, walked without a tag, and the complement of its ``free`` spans (in walk order)."""
        gaps: list[int] = []
        at = 0
        for k in range(0, len(free), 2):
            start: int = free[k]
            stop: int = free[k + 1]
            if start > at:
                gaps.append(at)
                gaps.append(start)
            if stop > at:
                at = stop
        if at < len(body):
            gaps.append(at)
            gaps.append(len(body))
        self.api_key, self.version, self.body, self.gaps = api_key, version, body, gaps
