"""Which Kafka APIs the proxy knows, taken from kafka-python's JSON-schema message classes.

The share-group APIs (KIP-932), which kafka-python lacks, come from this project's own specs through the same
machinery (``protocol.share_messages``). Everything the proxy decodes, it decodes with these classes; an API
they lack is still forwarded, as opaque bytes, because nothing in the proxy needs to look inside it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final, TypeVar

import kafka.protocol.admin  # noqa: F401  (imports register the message classes)
import kafka.protocol.consumer  # noqa: F401
import kafka.protocol.metadata  # noqa: F401
import kafka.protocol.producer  # noqa: F401
import kafka.protocol.sasl  # noqa: F401
from kafka.protocol.api_message import ApiMessage

import protocol.share_messages  # noqa: F401  (the KIP-932 share-group APIs kafka-python lacks)
from protocol.errors import ProtocolError


class Api:
    """The API keys the proxy itself names somewhere in its code.

    Plain ``Final`` ints, not an IntEnum: mypyc folds a final literal into its compiled callers, while every
    ``Api.X`` of an enum was an attribute lookup and a rich compare, several of them on the per-request path.
    :data:`API_NAMES` names them.
    """

    PRODUCE: Final = 0
    FETCH: Final = 1
    METADATA: Final = 3
    FIND_COORDINATOR: Final = 10
    JOIN_GROUP: Final = 11
    SYNC_GROUP: Final = 14
    SASL_HANDSHAKE: Final = 17
    API_VERSIONS: Final = 18
    CREATE_TOPICS: Final = 19
    DELETE_TOPICS: Final = 20
    DELETE_RECORDS: Final = 21
    INIT_PRODUCER_ID: Final = 22
    ADD_PARTITIONS_TO_TXN: Final = 24
    END_TXN: Final = 26
    SASL_AUTHENTICATE: Final = 36
    CREATE_PARTITIONS: Final = 37
    ELECT_LEADERS: Final = 43
    ALTER_PARTITION_REASSIGNMENTS: Final = 45
    DESCRIBE_CLIENT_QUOTAS: Final = 48
    ALTER_CLIENT_QUOTAS: Final = 49
    DESCRIBE_CLUSTER: Final = 60
    SHARE_GROUP_HEARTBEAT: Final = 76
    SHARE_GROUP_DESCRIBE: Final = 77
    SHARE_FETCH: Final = 78
    SHARE_ACKNOWLEDGE: Final = 79


API_NAMES: dict[int, str] = {v: k for k, v in vars(Api).items() if k.isupper()}
"""Key → name (``PRODUCE``) of every API in :class:`Api`."""


_C = TypeVar("_C")


def _all_subclasses(cls: type[_C]) -> list[type[_C]]:
    out: list[type[_C]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def _collect() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    for sub in _all_subclasses(ApiMessage):
        if getattr(sub, "_class_version", None) is not None:
            continue  # versioned wrapper, not the primary class
        (requests if sub.is_request() else responses)[sub.API_KEY] = sub
    return requests, responses


REQUESTS, RESPONSES = _collect()


def request_class(api_key: int) -> type[ApiMessage] | None:
    return REQUESTS.get(api_key)


def response_class(api_key: int) -> type[ApiMessage] | None:
    return RESPONSES.get(api_key)


@lru_cache(maxsize=4096)  # keyed on what clients send: bounded (known pairs are ~1,500)
def request_is_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether the request uses header v2 and compact encodings; None when the API is unknown."""
    cls = REQUESTS.get(api_key)
    if cls is None:
        return None
    return bool(cls.flexible_version_q(api_version))


@lru_cache(maxsize=4096)  # keyed on what clients send: bounded (known pairs are ~1,500)
def response_header_is_flexible(api_key: int, api_version: int) -> bool | None:
    """Response header v1 (with tagged fields) for flexible versions, except ApiVersions, always v0."""
    if api_key == Api.API_VERSIONS:
        return False
    cls = RESPONSES.get(api_key)
    if cls is None:
        return None
    return bool(cls.flexible_version_q(api_version))


@lru_cache(maxsize=4096)  # keyed on what clients send: bounded (known pairs are ~1,500)
def api_name(api_key: int) -> str:
    cls = REQUESTS.get(api_key)
    if cls is not None:
        return str(cls.name).removesuffix("Request")
    name = API_NAMES.get(api_key)
    return f"Api{api_key}" if name is None else name.title().replace("_", "")


def api_label(api_key: int) -> str:
    """``api_name`` for an API the proxy knows, else ``unknown``: for metric labels, whose set must not grow with
    what clients send."""
    return api_name(api_key) if api_key in REQUESTS or api_key in _API_KEYS else "unknown"


_API_KEYS = frozenset(API_NAMES)


class DecodeError(ProtocolError):
    """A body does not parse as the message it claims to be."""


def decode_body(cls: type[ApiMessage], body: bytes | memoryview, version: int) -> ApiMessage:
    """kafka-python's decode, with whatever it raises on bad bytes turned into one DecodeError."""
    try:
        return cls.decode(body, version=version)
    except Exception as exc:  # noqa: BLE001 - IndexError, struct.error, UnicodeDecodeError, ...
        raise DecodeError(f"{cls.name} v{version} does not parse: {type(exc).__name__}: {exc}") from None
