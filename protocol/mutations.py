"""KIP-599 surgery on CreateTopics (19), DeleteTopics (20) and CreatePartitions (37).

Why: under a strict controller-mutation quota Kafka admits or rejects each *topic* of a request in
request order. The proxy reproduces that in front of a broker that enforces nothing, so it must:

1. read what each topic would cost (``parse_request``);
2. forward only the admitted topics (``subset_request``);
3. answer the rejected topics itself with THROTTLING_QUOTA_EXCEEDED (89), either alone
   (``reject_all``) or merged into the broker's answer for the admitted ones (``merge_response``),
   in the original request order and with throttle_time_ms = max(broker's, proxy's).

Error 89 exists only from CreateTopics v6, DeleteTopics v5 and CreatePartitions v3 (``is_strict``); for
older versions the caller admits everything and throttles by muting, so the response builders refuse them.

Bodies are edited by splicing, not by decode-and-re-encode: the array of topics is cut into its elements
(located with kafka-python's own compiled element decoders, which also yield the decoded values) and the
bytes around the array are kept as they were. kafka-python decodes unknown tagged fields into
``unknown_tags`` but does not encode them again, so re-encoding a whole message would drop any tagged
field a newer peer sent; splicing keeps timeout, validate_only and every tagged field byte for byte. The
elements the proxy writes itself (its rejections) are encoded with kafka-python's classes.

Duplicates: Kafka answers a topic named twice in one request with INVALID_REQUEST for that topic (the
others proceed). Splitting such a request would make the proxy's per-topic answers and the broker's
disagree, so a request with duplicates is reported (``MutationRequest.duplicates``) and is not
``splittable``: the caller forwards it whole, and ``subset_request`` refuses it.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32

from protocol.apis import Api, DecodeError, api_name, decode_body, request_class, response_class
from protocol.skim import layout
from protocol.throttle_field import INT32_MAX, raise_throttle, throttle_offset
from protocol.varint import read_length
from quotas.kinds import MUTATION_APIS as KIND_MUTATION_APIS
from quotas.kinds import MUTATION_STRICT_SINCE, mutation_is_strict

THROTTLING_QUOTA_EXCEEDED = 89
MUTATION_APIS = KIND_MUTATION_APIS
STRICT_SINCE = MUTATION_STRICT_SINCE
"""First version whose clients understand error 89 (KIP-599's boundary, kept in the quota catalogue)."""
is_strict = mutation_is_strict

# Name of the per-topic result array in each response.
_RESULTS = {Api.CREATE_TOPICS: "topics", Api.DELETE_TOPICS: "responses", Api.CREATE_PARTITIONS: "results"}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _request_topics_field(api_key: int, api_version: int) -> str:
    if api_key == Api.DELETE_TOPICS and api_version < 6:
        return "topic_names"
    return "topics"


# --- what each topic costs --------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class _NamedTopic:
    index: int
    """Position in the request."""
    name: str

    @property
    def key(self) -> str:
        """What the cluster's partition counts are looked up by."""
        return self.name


@dataclass(slots=True, frozen=True)
class CreateTopic(_NamedTopic):
    """One topic of a CreateTopics request."""

    num_partitions: int
    """As sent: -1 means the broker's default (or that ``assignments`` say it)."""
    replication_factor: int
    assignments: int
    """Number of explicit partition assignments; 0 for automatic assignment."""

    @property
    def partitions(self) -> int | None:
        """Partitions this topic would create: the assignment count when assignments are given (that is what
        the broker creates), else ``num_partitions``; None for the broker default, which the caller resolves."""
        if self.assignments > 0:
            return self.assignments
        return None if self.num_partitions < 0 else self.num_partitions


@dataclass(slots=True, frozen=True)
class NewPartitions(_NamedTopic):
    """One topic of a CreatePartitions request; it costs ``count`` − the topic's current count."""

    count: int
    """The new total partition count."""
    assignments: int
    """Number of new-partition assignments sent (0 when null)."""


@dataclass(slots=True, frozen=True)
class DeleteTopic:
    """One topic of a DeleteTopics request: by name (v0–5 always), by id or by name (v6+)."""

    index: int
    name: str | None
    topic_id: uuid.UUID | None = None
    """Non-zero id in v6+ (kafka-python reads the all-zero id as None)."""

    @property
    def key(self) -> str | uuid.UUID | None:
        """What Kafka identifies the topic by: the id when one is given, else the name."""
        return self.topic_id if self.topic_id is not None else self.name


TopicMutation = CreateTopic | NewPartitions | DeleteTopic


@dataclass(slots=True, frozen=True)
class _ArrayCut:
    """A top-level array located in a body: its header and the byte span of each element."""

    start: int
    end: int
    spans: tuple[tuple[int, int], ...]
    items: tuple[Any, ...] = field(repr=False, compare=False)
    """The decoded elements (kafka-python's data objects, or the names of a string array)."""


@dataclass(slots=True, frozen=True)
class MutationRequest:
    """A decoded CreateTopics / DeleteTopics / CreatePartitions request body."""

    api_key: int
    version: int
    topics: tuple[TopicMutation, ...]
    """In request order; ``topics[i].index == i``."""
    timeout_ms: int
    validate_only: bool
    """Request-wide in the protocol (CreateTopics v1+, CreatePartitions); always False for DeleteTopics."""
    duplicates: frozenset[str | uuid.UUID | None]
    """Keys (name, or id for DeleteTopics v6 by id) that occur more than once."""
    body: bytes = field(repr=False)
    _cut: _ArrayCut = field(repr=False, compare=False)

    @property
    def strict(self) -> bool:
        return is_strict(self.api_key, self.version)

    @property
    def splittable(self) -> bool:
        """Whether the proxy may admit some topics and reject others; else forward the request whole."""
        return self.strict and not self.duplicates and len(self.topics) > 0

    @property
    def label(self) -> str:
        return f"{api_name(self.api_key)} v{self.version}"


# --- cutting arrays -----------------------------------------------------------------------------------


def _read_string(buf: memoryview, pos: int, flexible: bool) -> tuple[str | None, int]:
    n, pos = read_length(buf, pos, flexible, 2)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise ValueError("string runs past the end of the body")
    return bytes(buf[pos : pos + n]).decode("utf-8"), pos + n


def _cut_array(cls: type[ApiMessage], version: int, body: memoryview, name: str) -> _ArrayCut:
    """Locate top-level array ``name`` and each of its elements; raises DecodeError naming api and version."""
    try:
        start, end = layout(cls, version, body).fields[name]
        fld = cls._struct.fields[name]
        flexible = bool(cls.flexible_version_q(version))
        count, pos = read_length(body, start, flexible)
        if count < 0:
            raise ValueError(f"{name} is null")
        spans: list[tuple[int, int]] = []
        items: list[Any] = []
        if fld.is_struct_array():
            decode = fld.array_of.compiled_decode_from(version, compact=flexible, tagged=flexible)
            for _ in range(count):
                item, new = decode(body, pos)
                spans.append((pos, new))
                items.append(item)
                pos = new
        else:
            for _ in range(count):
                item, new = _read_string(body, pos, flexible)
                spans.append((pos, new))
                items.append(item)
                pos = new
        if pos != end:
            raise ValueError(f"{name} elements end at {pos}, the array at {end}")
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - TruncatedError, struct.error, IndexError, UnicodeDecodeError, ...
        raise DecodeError(f"{cls.name} v{version} does not parse: {type(exc).__name__}: {exc}") from None
    return _ArrayCut(start, end, tuple(spans), tuple(items))


def _array_header(count: int, flexible: bool) -> bytes:
    return UnsignedVarInt32.encode(count + 1) if flexible else _I32.pack(count)


def _splice(
    body: bytes | memoryview, cut: _ArrayCut, elements: Sequence[bytes | memoryview], flexible: bool
) -> bytearray:
    out = bytearray(body[: cut.start])
    out += _array_header(len(elements), flexible)
    for element in elements:
        out += element
    out += body[cut.end :]
    return out


# --- requests -----------------------------------------------------------------------------------------


@cache
def _classes(api_key: int) -> tuple[type[ApiMessage], type[ApiMessage]]:
    if api_key not in MUTATION_APIS:
        raise ValueError(f"api {api_key} is not CreateTopics, DeleteTopics or CreatePartitions")
    req, resp = request_class(api_key), response_class(api_key)
    assert req is not None and resp is not None  # all three are kafka-python classes
    return req, resp


def _check_version(cls: type[ApiMessage], api_key: int, version: int) -> None:
    if not 0 <= version <= cls.max_version:
        raise DecodeError(f"{api_name(api_key)} v{version} is not a version kafka-python knows (max {cls.max_version})")


def parse_request(api_key: int, api_version: int, body: bytes | bytearray | memoryview) -> MutationRequest:
    """Decode a request body (after the request header) into its topics, in request order.

    Raises DecodeError (a ValueError) naming the api and version when the body does not parse.
    """
    req_cls, _ = _classes(api_key)
    _check_version(req_cls, api_key, api_version)
    data = bytes(body)
    msg = decode_body(req_cls, data, api_version)
    cut = _cut_array(req_cls, api_version, memoryview(data), _request_topics_field(api_key, api_version))
    topics: list[TopicMutation] = []
    for i, item in enumerate(cut.items):
        if api_key == Api.CREATE_TOPICS:
            topics.append(
                CreateTopic(i, item.name, item.num_partitions, item.replication_factor, len(item.assignments or ()))
            )
        elif api_key == Api.CREATE_PARTITIONS:
            topics.append(NewPartitions(i, item.name, item.count, len(item.assignments or ())))
        elif api_version >= 6:
            topics.append(DeleteTopic(i, item.name, item.topic_id))
        else:
            topics.append(DeleteTopic(i, item))
    seen: set[str | uuid.UUID | None] = set()
    dups: set[str | uuid.UUID | None] = set()
    for t in topics:
        (dups if t.key in seen else seen).add(t.key)
    validate_only = bool(msg.validate_only) if api_key != Api.DELETE_TOPICS else False
    return MutationRequest(
        api_key, api_version, tuple(topics), msg.timeout_ms, validate_only, frozenset(dups), data, cut
    )


def _indices(request: MutationRequest, indices: Iterable[int], what: str) -> list[int]:
    out = sorted(set(indices))
    if out and (out[0] < 0 or out[-1] >= len(request.topics)):
        raise ValueError(f"{what} indices {out} out of range for {len(request.topics)} topics of {request.label}")
    return out


def subset_request(request: MutationRequest, admitted: Iterable[int]) -> bytes:
    """The request body (same version) naming only the topics at ``admitted`` indices, in request order;
    everything else (timeout, validate_only, tagged fields, each kept topic's bytes) is unchanged.

    Raises ValueError for a request with duplicate topics (it must be forwarded whole).
    """
    if request.duplicates:
        raise ValueError(f"{request.label} names topics more than once; forward it whole")
    keep = _indices(request, admitted, "admitted")
    req_cls, _ = _classes(request.api_key)
    flexible = bool(req_cls.flexible_version_q(request.version))
    spans = request._cut.spans
    return bytes(_splice(request.body, request._cut, [request.body[slice(*spans[i])] for i in keep], flexible))


# --- responses ----------------------------------------------------------------------------------------


def quota_message(throttle_ms: int) -> str:
    """The error message of a rejected topic: Kafka's text for error 89, plus which quota and for how long."""
    return f"The throttling quota has been exceeded: controller_mutation_rate, throttled for {throttle_ms} ms."


def _clamp(ms: int) -> int:
    return min(max(int(ms), 0), INT32_MAX)


def _rejection_response(
    request: MutationRequest, indices: list[int], throttle_ms: int, message: str | None, error_code: int
) -> ApiMessage:
    """A kafka-python response message with a rejection for each topic at ``indices``."""
    _, resp_cls = _classes(request.api_key)
    version = request.version
    results = _RESULTS[request.api_key]
    result_cls = resp_cls._struct.fields[results].array_of.data_class
    text = quota_message(throttle_ms) if message is None else message
    items = []
    for i in indices:
        t = request.topics[i]
        if request.api_key == Api.CREATE_TOPICS:
            # Kafka's error result: no topic id, num_partitions/replication_factor -1, no configs
            item = result_cls(
                version=version,
                name=t.name,
                topic_id=None,
                error_code=error_code,
                error_message=text,
                num_partitions=-1,
                replication_factor=-1,
                configs=[],
            )
        elif isinstance(t, DeleteTopic):  # DeleteTopics (parse_request makes DeleteTopic for that api only)
            # by id: echo the id, the name is unknown (null); by name: the name, no id
            item = result_cls(
                version=version, name=t.name, topic_id=t.topic_id, error_code=error_code, error_message=text
            )
        else:
            item = result_cls(version=version, name=t.name, error_code=error_code, error_message=text)
        items.append(item)
    return resp_cls(version=version, throttle_time_ms=throttle_ms, **{results: items})


def _require_strict(request: MutationRequest) -> None:
    if not request.strict:
        raise ValueError(f"{request.label} predates THROTTLING_QUOTA_EXCEEDED; admit it and mute instead")


def reject_all(
    request: MutationRequest, throttle_ms: int, message: str | None = None, error_code: int = THROTTLING_QUOTA_EXCEEDED
) -> bytes:
    """The proxy's own response body (same version) rejecting every topic, in request order, with
    ``throttle_time_ms`` = ``throttle_ms`` (clamped to int32). ``message`` defaults to ``quota_message``.

    Raises ValueError for versions that predate error 89 (see ``is_strict``).
    """
    _require_strict(request)
    ms = _clamp(throttle_ms)
    msg = _rejection_response(request, list(range(len(request.topics))), ms, message, error_code)
    return bytes(msg.encode())  # kafka-python encodes into a bytearray; compiled callers hold us to "bytes"


def merge_response(
    request: MutationRequest,
    broker_body: bytes | bytearray | memoryview,
    rejected: Iterable[int],
    throttle_ms: int,
    message: str | None = None,
    error_code: int = THROTTLING_QUOTA_EXCEEDED,
) -> bytes:
    """The client's response body: the broker's answer to ``subset_request(request, admitted)`` (admitted =
    every index not in ``rejected``) merged with the proxy's rejections, in the original request order, and
    ``throttle_time_ms`` = max(broker's, ``throttle_ms``).

    Broker results are matched to topics by id (DeleteTopics v6 by id) or name, not by position, because a
    broker need not answer in request order. A broker result that matches no admitted topic is kept, after
    the others; an admitted topic the broker did not answer stays unanswered (the proxy invents nothing).
    Everything else in the broker's body (its tagged fields, each result's bytes) is kept as sent.
    Raises DecodeError when the broker's body does not parse, ValueError for non-strict versions.
    """
    _require_strict(request)
    _, resp_cls = _classes(request.api_key)
    version = request.version
    flexible = bool(resp_cls.flexible_version_q(version))
    results = _RESULTS[request.api_key]
    rejected_idx = _indices(request, rejected, "rejected")
    rejected_set = set(rejected_idx)
    ms = _clamp(throttle_ms)

    broker = memoryview(bytes(broker_body))
    decode_body(resp_cls, broker, version)  # whole-message check, with kafka-python's own error
    cut = _cut_array(resp_cls, version, broker, results)

    by_name: dict[str, int] = {}
    by_id: dict[uuid.UUID, int] = {}
    for t in request.topics:
        if t.index in rejected_set:
            continue
        if isinstance(t, DeleteTopic) and t.topic_id is not None:
            by_id[t.topic_id] = t.index
        elif t.name is not None:
            by_name[t.name] = t.index
    answered: dict[int, memoryview] = {}
    unmatched: list[memoryview] = []
    for item, span in zip(cut.items, cut.spans, strict=True):
        element = broker[span[0] : span[1]]
        topic_id = getattr(item, "topic_id", None)
        index = by_id.get(topic_id) if topic_id is not None else None
        if index is None or index in answered:
            index = by_name.get(item.name)
        if index is None or index in answered:
            unmatched.append(element)
        else:
            answered[index] = element

    own = _rejection_response(
        request, rejected_idx, 0, message if message is not None else quota_message(ms), error_code
    ).encode()
    own_view = memoryview(own)
    own_cut = _cut_array(resp_cls, version, own_view, results)
    mine = {i: own_view[s:e] for i, (s, e) in zip(rejected_idx, own_cut.spans, strict=True)}

    elements: list[memoryview] = []
    for i in range(len(request.topics)):
        if i in mine:
            elements.append(mine[i])
        elif i in answered:
            elements.append(answered[i])
    elements.extend(unmatched)
    out = _splice(broker, cut, elements, flexible)
    offset = throttle_offset(request.api_key, version, out)
    if offset is not None:
        raise_throttle(out, offset, ms)
    return bytes(out)


@dataclass(slots=True, frozen=True)
class TopicResult:
    """One topic's outcome in a CreateTopics / DeleteTopics / CreatePartitions response."""

    name: str | None
    topic_id: uuid.UUID | None
    """CreateTopics v7+ and DeleteTopics v6+; None otherwise (and for the all-zero id)."""
    error_code: int
    num_partitions: int
    """CreateTopics v5+: the partitions the topic was created with; -1 where the response does not say."""


def parse_results(api_key: int, api_version: int, body: bytes | bytearray | memoryview) -> list[TopicResult]:
    """The per-topic outcomes of a response body (after the response header), in the order the broker sent them.

    Raises DecodeError naming the api and version when the body does not parse.
    """
    _, resp_cls = _classes(api_key)
    _check_version(resp_cls, api_key, api_version)
    msg = decode_body(resp_cls, bytes(body), api_version)
    out: list[TopicResult] = []
    for item in getattr(msg, _RESULTS[api_key]) or ():
        topic_id = getattr(item, "topic_id", None)
        partitions = -1
        if api_key == Api.CREATE_TOPICS and api_version >= 5 and isinstance(item.num_partitions, int):
            partitions = item.num_partitions
        out.append(TopicResult(item.name, topic_id if topic_id != _ZERO_UUID else None, item.error_code, partitions))
    return out


_ZERO_UUID = uuid.UUID(int=0)
