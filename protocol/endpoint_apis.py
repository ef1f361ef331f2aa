"""Which responses can name a broker, and the per-response check for the usual case that one does not.

Why a module of its own: every Produce v10+ and Fetch v16+ response may carry KIP-951 ``node_endpoints`` (a
top-level tagged field), and almost none does. That check runs on every such response, so it is compiled (see
``proxy.build_info``) and kept apart from ``protocol.addresses``, which decodes and rewrites the rare response
that does name brokers with kafka-python's schema classes and stays interpreted.
"""

from __future__ import annotations

from typing import Final

from protocol.apis import RESPONSES, Api
from protocol.skim import top_level_tags

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


def tags_endpoints(api_key: int, version: int, body: bytes | memoryview) -> bool:
    """Whether a Produce v10+ or Fetch v16+ response ``body`` has the ``node_endpoints`` tag (one skip over the
    body, see ``skim.top_level_tags``). Raises TruncatedError (a ValueError) for a body that does not parse."""
    return NODE_ENDPOINTS_TAG in top_level_tags(RESPONSES[api_key], version, body)
