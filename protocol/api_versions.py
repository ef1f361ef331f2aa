"""Cap the ApiVersions the broker advertises at what the proxy can handle.

The proxy decodes some APIs with kafka-python's schemas; a client that negotiated a newer version
than those schemas know would send frames the proxy cannot read. APIs whose responses carry broker
addresses the proxy cannot rewrite are withdrawn altogether: without the proxy's address rewriting
a client would be sent straight to a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from protocol.apis import Api, decode_body, response_class

# APIs never offered to clients. ShareFetch/ShareAcknowledge used to be here (their responses carry broker
# addresses and kafka-python has no schema for them); protocol/share_messages.py now supplies the schemas, so
# they are rewritten like Fetch's and capped like every API the proxy decodes (``decode_caps``).
WITHDRAWN: frozenset[int] = frozenset()


def decode_caps(api_keys: Iterable[int]) -> dict[int, int]:
    """Highest version of each API the proxy decodes, from the schemas it decodes them with."""
    caps = {}
    for key in api_keys:
        cls = response_class(key)
        if cls is None:
            raise ValueError(f"the proxy decodes api {key} but has no schema for it")
        caps[key] = cls.max_version
    return caps


def cap_api_versions(body: bytes | memoryview, version: int, caps: Mapping[int, int]) -> bytes | None:
    """The ApiVersions response body with versions capped, or None when nothing changes."""
    cls = response_class(Api.API_VERSIONS)
    assert cls is not None  # ApiVersions is one of kafka-python's classes
    msg = decode_body(cls, body, version)
    if msg.error_code != 0:
        return None  # an error answer (e.g. unsupported version) is v0-shaped: pass it on as is
    changed = False
    kept = []
    for entry in msg.api_keys:
        if entry.api_key in WITHDRAWN:
            changed = True
            continue
        cap = caps.get(entry.api_key)
        if cap is not None and entry.max_version > cap:
            if entry.min_version > cap:
                changed = True
                continue  # nothing both sides speak: withdraw it
            entry.max_version = cap
            changed = True
        kept.append(entry)
    if not changed:
        return None
    msg.api_keys = kept
    return bytes(msg.encode())  # kafka-python encodes to a bytearray; compiled callers check for bytes


def unsupported_version_body(cap: int) -> bytes:
    """What a broker answers an ApiVersions request newer than it knows: UNSUPPORTED_VERSION (35) in the v0
    layout, listing the ApiVersions versions it does speak, so the client retries at one of them. The proxy
    answers so itself when a client (kafka-clients 4.4 sends v5 first) goes beyond the schemas it decodes."""
    cls = response_class(Api.API_VERSIONS)
    assert cls is not None  # ApiVersions is one of kafka-python's classes
    entry = cls._struct.fields["api_keys"].array_of.data_class
    msg = cls(error_code=35, api_keys=[entry(api_key=Api.API_VERSIONS, min_version=0, max_version=cap)])
    return bytes(msg.encode(version=0))
