"""The proxy's own topics, out of every client's reach (sans-IO: request bodies in, refusals out).

Why: the fleet keeps its shared state (usage reports, quota alters) and the decision log its events in topics on
the very cluster the proxy fronts. Forwarded like any other topic, one Produce by any tenant could give itself
any quota fleet-wide, and one Fetch could read every tenant's usage. So a request that names one of them is
refused as a broker refuses a topic the principal may not touch: TOPIC_AUTHORIZATION_FAILED (29) for that
topic, in the API's own response shape; the proxy's members write through their own clients, never through a
listener of the proxy.

What is protected: the names the configuration gives (the fleet's two topics, the decision-log topic) and every
topic starting with :data:`RESERVED_PREFIX` (the proxy's namespace: a tenant cannot create or squat one either),
and the ids of those topics once known (Produce v13+ and Fetch v13+ name topics by id only): learned from the
Metadata responses that pass through and from the members' own look-ups.

How a request is treated (:func:`check`):
- no protected topic in it: nothing (the usual case, decided by a byte search before anything is decoded:
  :meth:`ProtectedTopics.may_name`);
- only protected topics: answered here, every topic refused (:attr:`Refusal.answer`), except Metadata, whose
  answer must still list the brokers: that is forwarded without them;
- protected and other topics: forwarded without the protected ones (:attr:`Refusal.forward`), and the refusals
  merged into the broker's answer (:meth:`Refusal.merge`);
- an API whose response has no per-topic place for an error: refused whole through its top-level
  ``error_code`` when it has one, else :class:`ProtectedTopicError` (the connection is closed, as a broker
  closes an acks=0 producer's on an error).
Rewritten messages go through kafka-python's classes, so a tagged field it does not know is dropped from them;
only requests that name a protected topic are ever rewritten.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from protocol.apis import REQUESTS, Api, DecodeError, api_name, decode_body, request_class, response_class
from protocol.errors import ProtocolError
from protocol.request import Request

TOPIC_AUTHORIZATION_FAILED: Final = 29
RESERVED_PREFIX: Final = "__ktp_"
"""Every topic whose name starts with this belongs to the proxy (the fleet's are ``__ktp_fleet_<name>``)."""
TOPIC_RESOURCE: Final = 2
"""``resource_type`` of a topic in the config APIs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs)."""
MAX_KNOWN_IDS: Final = 64
"""Ids kept for protected topics, the oldest dropped first: each is one more byte search on every request that can
name a topic, and a fleet has two topics (a few more ids only when they are deleted and created again)."""

_NAME_FIELDS: Final = ("name", "topic", "topic_name")
_INDEX_FIELDS: Final = ("partition_index", "partition", "index", "partition_id")
_ERROR_FIELDS: Final = ("error_code", "partition_error_code")
_RESOURCE_APIS: Final = (32, 33, 44)  # DescribeConfigs, AlterConfigs, IncrementalAlterConfigs
_ZERO_ID: Final = uuid.UUID(int=0)
_ON_ERROR: Final = {"base_offset": -1, "committed_offset": -1, "high_watermark": -1, "low_watermark": -1}
"""Offsets a broker answers as -1 next to an error (the schema's default is 0)."""


class ProtectedTopicError(ProtocolError):
    """A request names one of the proxy's own topics and cannot be answered per topic: its connection is closed."""


@dataclass(frozen=True, slots=True)
class _Spec:
    """Where an API's topics are, in its request and in its response. ``outer``: an array of groups (OffsetFetch
    v8+) whose entries hold the topic arrays, matched between request and response by ``outer_key``."""

    request: str
    response: str
    versions: tuple[int, int] = (0, 32767)
    answer_here: bool = True
    """False for Metadata: its answer lists the brokers, so the request is forwarded, even without topics."""
    outer: tuple[str, str, str] | None = None
    """(request array, response array, key field) of the outer level, when there is one."""


_SPECS: Final[dict[int, tuple[_Spec, ...]]] = {
    Api.PRODUCE: (_Spec("topic_data", "responses"),),
    Api.FETCH: (_Spec("topics", "responses"),),
    2: (_Spec("topics", "topics"),),  # ListOffsets
    Api.METADATA: (_Spec("topics", "topics", answer_here=False),),
    8: (_Spec("topics", "topics"),),  # OffsetCommit
    9: (
        _Spec("topics", "topics", (0, 7)),  # OffsetFetch
        _Spec("topics", "topics", (8, 32767), outer=("groups", "groups", "group_id")),
    ),
    Api.CREATE_TOPICS: (_Spec("topics", "topics"),),
    Api.DELETE_TOPICS: (_Spec("topic_names", "responses", (0, 5)), _Spec("topics", "responses", (6, 32767))),
    Api.DELETE_RECORDS: (_Spec("topics", "topics"),),
    23: (_Spec("topics", "topics"),),  # OffsetForLeaderEpoch
    Api.ADD_PARTITIONS_TO_TXN: (_Spec("v3_and_below_topics", "results_by_topic_v3_and_below", (0, 3)),),
    28: (_Spec("topics", "topics"),),  # TxnOffsetCommit
    32: (_Spec("resources", "results"),),  # DescribeConfigs
    33: (_Spec("resources", "responses"),),  # AlterConfigs
    Api.CREATE_PARTITIONS: (_Spec("topics", "results"),),
    Api.ELECT_LEADERS: (_Spec("topic_partitions", "replica_election_results"),),
    44: (_Spec("resources", "responses"),),  # IncrementalAlterConfigs
    Api.ALTER_PARTITION_REASSIGNMENTS: (_Spec("topics", "responses"),),
    47: (_Spec("topics", "topics"),),  # OffsetDelete
    61: (_Spec("topics", "topics"),),  # DescribeProducers
    75: (_Spec("topics", "topics"),),  # DescribeTopicPartitions
}


def _names_topics(fields: Iterable[Any]) -> bool:
    for f in fields:
        if getattr(f, "_entity_type", None) == "topicName" or (f.type_str == "uuid" and "topic" in f.name):
            return True
        if f.fields and _names_topics(f.fields.values() if isinstance(f.fields, dict) else f.fields):
            return True
    return False


def _guarded_apis() -> frozenset[int]:
    out = {key for key, cls in REQUESTS.items() if _names_topics(cls._struct.fields.values())}
    return frozenset(out | set(_SPECS) | set(_RESOURCE_APIS))


GUARDED_APIS: Final = _guarded_apis()
"""Every API whose request can name a topic (by name, id or config resource), from kafka-python's schemas: the
versions of these are capped to what kafka-python decodes while topics are protected."""


class ProtectedTopics:
    """The names (and, once known, ids) of the proxy's own topics."""

    __slots__ = ("names", "prefix", "ids", "_markers")

    def __init__(self, names: Iterable[str], prefix: str = RESERVED_PREFIX) -> None:
        self.names = frozenset(names)
        self.prefix = prefix
        self.ids: dict[uuid.UUID, str] = {}
        self._markers: tuple[bytes, ...] = ()
        self._rebuild()

    def _rebuild(self) -> None:
        markers = [self.prefix.encode()] if self.prefix else []
        markers += [n.encode() for n in sorted(self.names) if not (self.prefix and n.startswith(self.prefix))]
        markers += [i.bytes for i in self.ids]
        self._markers = tuple(markers)

    def protects(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.names or bool(self.prefix) and name.startswith(self.prefix))

    def protects_id(self, topic_id: object) -> bool:
        return isinstance(topic_id, uuid.UUID) and topic_id in self.ids

    def learn(self, pairs: Mapping[uuid.UUID, str | None]) -> None:
        """Topic id → name pairs seen (a Metadata response, a member's look-up): the protected ones are kept."""
        changed = False
        for topic_id, name in pairs.items():
            if topic_id is None or topic_id == _ZERO_ID or not self.protects(name) or topic_id in self.ids:
                continue
            if len(self.ids) >= MAX_KNOWN_IDS:
                del self.ids[next(iter(self.ids))]
            self.ids[topic_id] = str(name)
            changed = True
        if changed:
            self._rebuild()

    def may_name(self, request: Request) -> bool:
        """Whether the request (as the session read it) may name a protected topic: a byte search of its frame for
        every protected name (and the prefix) and id. False is certain; True is checked by :func:`check`. Why a
        search and not the request's topics: it is native and costs a few hundred instructions a request, where
        reading the topics of every guarded API would cost more than the rest of the plain path; the check that
        follows a hit reads them. A large Produce is searched outside its records only (the names and ids sit
        between them), with the record fields' spans the request walked once for every rule that needs them."""
        header = request.header
        api_key = header.api_key
        if api_key not in GUARDED_APIS:
            return False
        frame = request.frame
        if isinstance(frame, bytes):
            for m in self._markers:  # noqa: SIM110 - a loop, not any(): no generator on every request
                if m in frame:
                    return True
            return False
        data = bytes(frame) if api_key != Api.PRODUCE else _outside_records(request)
        return any(m in data for m in self._markers)


def _outside_records(request: Request) -> bytes:
    """A large Produce frame without its record sets: where its topic names and ids are."""
    view = memoryview(request.frame)[4:]
    if request.header.body_offset is None:
        return bytes(view)
    out = bytearray()
    pos = 0
    for start, end in request.record_spans():
        out += view[pos:start]
        pos = end
    out += view[pos:]
    return bytes(out)


# ------------------------------------------------------------------------------------------ refusals


@dataclass(slots=True)
class Refusal:
    """What to do with a request that names protected topics (see the module docstring)."""

    topics: list[str]
    """What was refused, for the log line (names, or ids as text)."""
    answer: bytes | None = None
    """The whole response body, when the proxy answers the request itself."""
    forward: bytes | None = None
    """The request body without the protected topics, when the rest goes to the broker."""
    merge: Callable[[Any], bytes] | None = None
    """With ``forward``: the broker's response body → the client's, the refusals added."""


@dataclass(slots=True)
class _Ident:
    name: str | None
    topic_id: uuid.UUID | None
    partitions: list[int] | None
    resource_type: int | None = None


def _spec(api_key: int, version: int) -> _Spec | None:
    for spec in _SPECS.get(api_key, ()):
        if spec.versions[0] <= version <= spec.versions[1]:
            return spec
    return None


def _ident(item: Any, api_key: int) -> _Ident:
    if isinstance(item, str) or item is None:  # DeleteTopics v0-5: a plain array of names
        return _Ident(item, None, None)
    if api_key in _RESOURCE_APIS:
        return _Ident(item.resource_name, None, None, item.resource_type)
    name = next((getattr(item, f) for f in _NAME_FIELDS if hasattr(item, f)), None)
    topic_id = getattr(item, "topic_id", None)
    return _Ident(name, topic_id if topic_id != _ZERO_ID else None, _partitions_of(item))


def _partitions_of(item: Any) -> list[int] | None:
    for field in ("partitions", "partition_indexes", "partition_data"):
        parts = getattr(item, field, None)
        if isinstance(parts, list):
            out = []
            for p in parts:
                if isinstance(p, int):
                    out.append(p)
                else:
                    out.append(next((getattr(p, f) for f in _INDEX_FIELDS if hasattr(p, f)), -1))
            return out
    return None


def _is_protected(guard: ProtectedTopics, ident: _Ident, api_key: int) -> bool:
    if api_key in _RESOURCE_APIS:
        return ident.resource_type == TOPIC_RESOURCE and guard.protects(ident.name)
    return guard.protects(ident.name) or guard.protects_id(ident.topic_id)


def _label(ident: _Ident) -> str:
    return ident.name if ident.name is not None else str(ident.topic_id)


def _struct_fields(cls: Any, version: int) -> list[Any]:
    return [f for f in cls._struct.fields.values() if f.for_version_q(version)]


def _element_class(owner: Any, field: str) -> Any:
    return owner._struct.fields[field].array_of.data_class


def _refused_entry(cls: Any, version: int, ident: _Ident) -> Any:
    """One response entry (kafka-python object of ``cls``) refusing ``ident``: its name or id, error 29 wherever
    the entry (or each of its partitions) has an error code, everything else the schema's default."""
    kw: dict[str, Any] = {}
    for f in _struct_fields(cls, version):
        n = f.name
        if n in _NAME_FIELDS and f.type_str == "string" or n == "resource_name":
            kw[n] = ident.name
        elif n == "resource_type" and ident.resource_type is not None:
            kw[n] = ident.resource_type
        elif n == "topic_id":
            kw[n] = ident.topic_id
        elif n in _ERROR_FIELDS:
            kw[n] = TOPIC_AUTHORIZATION_FAILED
        elif n == "error_message":
            kw[n] = None if f.nullable_for_version_q(version) else ""
        elif n in _ON_ERROR:
            kw[n] = _ON_ERROR[n]
        elif f.is_struct_array() and ident.partitions:
            inner = f.array_of.data_class
            index = next((g.name for g in _struct_fields(inner, version) if g.name in _INDEX_FIELDS), None)
            if index is not None:
                kw[n] = [_refused_partition(inner, version, index, p) for p in ident.partitions]
    return cls(version=version, **kw)


def _refused_partition(cls: Any, version: int, index: str, partition: int) -> Any:
    kw: dict[str, Any] = {index: partition}
    for f in _struct_fields(cls, version):
        if f.name in _ERROR_FIELDS:
            kw[f.name] = TOPIC_AUTHORIZATION_FAILED
        elif f.name == "error_message":
            kw[f.name] = None if f.nullable_for_version_q(version) else ""
        elif f.name in _ON_ERROR:
            kw[f.name] = _ON_ERROR[f.name]
    return cls(version=version, **kw)


@cache
def _top_level_error(api_key: int, version: int) -> bool:
    cls = response_class(api_key)
    return cls is not None and any(f.name == "error_code" for f in _struct_fields(cls, version))


def check(guard: ProtectedTopics, api_key: int, version: int, body: bytes | memoryview) -> Refusal | None:
    """The refusal for a request body (after its header) that names protected topics; None when it names none.
    Raises DecodeError for a body that does not parse, :class:`ProtectedTopicError` when the request names a
    protected topic and its API has no way to refuse it (see the module docstring)."""
    req_cls, resp_cls = request_class(api_key), response_class(api_key)
    if req_cls is None or resp_cls is None or not req_cls.min_version <= version <= req_cls.max_version:
        raise ProtectedTopicError(
            f"{api_name(api_key)} v{version} may name the proxy's own topics and cannot be decoded to tell"
        )
    msg = decode_body(req_cls, bytes(body), version)
    acks_zero = api_key == Api.PRODUCE and msg.acks == 0
    spec = _spec(api_key, version)
    if spec is None:
        return _whole(guard, api_key, version, msg, resp_cls)
    outers = getattr(msg, spec.outer[0]) or [] if spec.outer else [msg]
    refused: list[tuple[Any, list[_Ident]]] = []  # (outer entry, its refused topics)
    kept_any = False
    for outer in outers:
        items = getattr(outer, spec.request, None)
        if not items:
            kept_any = kept_any or items is None  # null: every topic (Metadata, OffsetFetch): others are asked
            continue
        keep: list[tuple[Any, _Ident]] = []
        out: list[tuple[Any, _Ident]] = []
        for item in items:
            ident = _ident(item, api_key)
            (out if _is_protected(guard, ident, api_key) else keep).append((item, ident))
        if out:
            refused.append((outer, [i for _, i in out]))
            setattr(outer, spec.request, [item for item, _ in keep])
        kept_any = kept_any or bool(keep)
    if api_key == Api.FETCH and getattr(msg, "forgotten_topics_data", None):  # nothing to forget at the broker
        msg.forgotten_topics_data = [
            t for t in msg.forgotten_topics_data if not _is_protected(guard, _ident(t, api_key), api_key)
        ]
    if not refused:
        return None
    labels = [_label(i) for _, ids in refused for i in ids]
    if acks_zero and not kept_any:  # no answer is read: a broker closes such a producer's connection on an error
        raise ProtectedTopicError(f"Produce acks=0 to the proxy's own topic {labels[0]!r}")
    if kept_any or not spec.answer_here:
        forward = bytes(msg.encode())
        return Refusal(labels, forward=forward, merge=lambda b: _merge(resp_cls, version, spec, b, refused))
    answer = resp_cls(version=version)
    _add(answer, version, spec, refused)
    return Refusal(labels, answer=bytes(answer.encode()))


def _add(resp: Any, version: int, spec: _Spec, refused: list[tuple[Any, list[_Ident]]]) -> None:
    """Append the refused entries to ``resp`` (under their outer entries, matched by key or made)."""
    for outer, idents in refused:
        if spec.outer is None:
            holder = resp
        else:
            _req_outer, resp_outer, key = spec.outer
            value = getattr(outer, key)
            holder = next((o for o in getattr(resp, resp_outer) or [] if getattr(o, key) == value), None)
            if holder is None:
                holder = _element_class(resp, resp_outer)(version=version, **{key: value})
                setattr(resp, resp_outer, [*(getattr(resp, resp_outer) or []), holder])
        entry_cls = _element_class(holder, spec.response)
        entries = [_refused_entry(entry_cls, version, i) for i in idents]
        setattr(holder, spec.response, [*(getattr(holder, spec.response) or []), *entries])


def _merge(resp_cls: Any, version: int, spec: _Spec, body: Any, refused: list[tuple[Any, list[_Ident]]]) -> bytes:
    resp = decode_body(resp_cls, bytes(body), version)
    _add(resp, version, spec, refused)
    return bytes(resp.encode())


def _whole(guard: ProtectedTopics, api_key: int, version: int, msg: Any, resp_cls: Any) -> Refusal | None:
    """An API without a per-topic answer: does the request name a protected topic anywhere? Then refuse it whole
    through the response's top-level error code, or close the connection."""
    found: list[str] = []
    _find(guard, msg, found)
    if not found:
        return None
    if not _top_level_error(api_key, version):
        raise ProtectedTopicError(f"{api_name(api_key)} v{version} names the proxy's own topic {found[0]!r}")
    kw: dict[str, Any] = {"error_code": TOPIC_AUTHORIZATION_FAILED}
    if any(f.name == "error_message" for f in _struct_fields(resp_cls, version)):
        kw["error_message"] = "Topic authorization failed."
    return Refusal(found, answer=bytes(resp_cls(version=version, **kw).encode()))


def _find(guard: ProtectedTopics, value: Any, found: list[str], depth: int = 0) -> None:
    """Every protected name or id anywhere in a decoded request (bounded by the message's own nesting)."""
    if depth > 8 or len(found) >= 16:
        return
    if isinstance(value, list):
        for v in value:
            _find(guard, v, found, depth + 1)
        return
    if isinstance(value, str):
        if guard.protects(value):
            found.append(value)
        return
    if isinstance(value, uuid.UUID):
        if guard.protects_id(value):
            found.append(str(value))
        return
    fields = getattr(type(value), "_struct", None)
    if fields is None:
        return
    for f in fields.fields.values():
        _find(guard, getattr(value, f.name, None), found, depth + 1)


__all__ = ["GUARDED_APIS", "ProtectedTopicError", "ProtectedTopics", "Refusal", "check", "DecodeError"]


# ------------------------------------------------------------------------------------------ listings

LISTING_APIS: Final = frozenset({Api.METADATA, 75})
"""Responses that list topics the request did not name (Metadata for all topics, DescribeTopicPartitions with a
cursor): the protected ones are left out, as a broker leaves out topics the principal may not describe."""


def drop_listed(guard: ProtectedTopics, message: Any) -> bool:
    """Remove the protected topics from a decoded Metadata or DescribeTopicPartitions response (their ids are
    learned first); whether anything was removed."""
    topics = getattr(message, "topics", None) or []
    guard.learn({t.topic_id: t.name for t in topics if getattr(t, "topic_id", None) is not None})
    kept = [t for t in topics if not guard.protects(t.name)]
    if len(kept) == len(topics):
        return False
    message.topics = kept
    return True


def filter_listing(guard: ProtectedTopics, api_key: int, version: int, body: bytes | memoryview) -> bytes | None:
    """A listing response body (:data:`LISTING_APIS`) without the protected topics; None when it has none.
    Raises DecodeError for a body that does not parse."""
    cls = response_class(api_key)
    if cls is None:
        return None
    message = decode_body(cls, bytes(body), version)
    return bytes(message.encode()) if drop_listed(guard, message) else None
