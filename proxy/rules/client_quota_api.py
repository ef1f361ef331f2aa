"""DescribeClientQuotas (48) and AlterClientQuotas (49), answered by the proxy itself.

Why the proxy answers rather than forwards: the quotas it enforces are its own, and operators already know how
to set quotas with ``kafka-configs.sh --bootstrap-server`` and ``Admin.alterClientQuotas``; pointing those at
the proxy sets the proxy's quotas with no new tool. The cluster never sees these requests (import from the
cluster, when on, reads the cluster's quotas on the proxy's own account).

Authorisation, as the broker's (which asks DESCRIBE_CONFIGS on the cluster to describe and ALTER_CONFIGS to
alter; the proxy has no ACLs of its own, so lists of principals stand for them): only ``quotas.describers``
(default: the admins) may describe, the others get CLUSTER_AUTHORIZATION_FAILED and no entries; only
``quotas.admins`` may alter, the others get CLUSTER_AUTHORIZATION_FAILED for every entry.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from config.quota_sources import QuotaSources
from protocol.apis import Api, DecodeError, decode_body
from protocol.headers import RequestHeader
from protocol.text import printable
from proxy.rules.decisions import Decision, local_frame
from proxy.rules.verdicts import Answer, PolicyConnection
from quotas.connections import CONNECTION_CREATION_RATE, IpQuotaError, IpQuotas
from quotas.entities import (
    ENTITY_IP,
    FilterComponent,
    MatchType,
    QuotaEntity,
    QuotaEntityError,
    QuotaFilterError,
    QuotaValueError,
    UnsupportedEntityTypeError,
    validate_quota,
)

log = logging.getLogger(__name__)

NONE = 0
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
UNSUPPORTED_VERSION = 35


def _array(items: Any, what: str) -> Any:
    """A non-nullable array of the schema; kafka-python decodes a -1 length as None, which Kafka refuses."""
    if items is None:
        raise DecodeError(f"{what} is a null array")
    return items


def _ip_entries(ip_quotas: IpQuotas | None, components: list[FilterComponent], strict: bool) -> Any:
    """(name or None, rate) of the ip entities the filter selects: a filter naming ip picks from them alone; an
    empty non-strict filter takes them too; any user or client-id component excludes them."""
    if ip_quotas is None:
        return []
    kinds = {c.entity_type for c in components}
    if kinds - {ENTITY_IP} or (not components and strict):
        return []
    entries = sorted(ip_quotas.effective().items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))
    for c in components:  # at most one, of type ip (the store checked the filter)
        if c.match_type == MatchType.EXACT:
            entries = [(n, r) for n, r in entries if n == c.match]
        elif c.match_type == MatchType.DEFAULT:
            entries = [(n, r) for n, r in entries if n is None]
        else:
            entries = [(n, r) for n, r in entries if n is not None]
    return entries


def describe(
    sources: QuotaSources,
    body: bytes | memoryview,
    version: int,
    principal: str,
    describers: frozenset[str],
    ip_quotas: IpQuotas | None = None,
) -> bytes:
    """The response body for a DescribeClientQuotas request body, when ``principal`` may describe."""
    req = decode_body(DescribeClientQuotasRequest, body, version)
    if principal not in describers:
        return bytes(
            DescribeClientQuotasResponse(
                throttle_time_ms=0,
                error_code=CLUSTER_AUTHORIZATION_FAILED,
                error_message="not authorized to describe client quotas at this proxy",
                entries=None,
            ).encode(version=version)
        )
    components = [FilterComponent(c.entity_type, c.match_type, c.match) for c in req.components or ()]
    try:
        found = sources.store.describe(components, strict=bool(req.strict))
    except UnsupportedEntityTypeError as exc:
        return bytes(
            DescribeClientQuotasResponse(
                throttle_time_ms=0, error_code=UNSUPPORTED_VERSION, error_message=str(exc), entries=None
            ).encode(version=version)
        )
    except QuotaFilterError as exc:
        return bytes(
            DescribeClientQuotasResponse(
                throttle_time_ms=0, error_code=INVALID_REQUEST, error_message=str(exc), entries=None
            ).encode(version=version)
        )
    entry_cls = DescribeClientQuotasResponse.EntryData
    entries = [
        entry_cls(
            entity=[entry_cls.EntityData(entity_type=t, entity_name=n) for t, n in entity.components().items()],
            values=[entry_cls.ValueData(key=k, value=v) for k, v in sorted(quotas.items())],
        )
        for entity, quotas in found.items()
    ]
    entries += [
        entry_cls(
            entity=[entry_cls.EntityData(entity_type=ENTITY_IP, entity_name=n)],
            values=[entry_cls.ValueData(key=CONNECTION_CREATION_RATE, value=r)],
        )
        for n, r in _ip_entries(ip_quotas, components, bool(req.strict))
    ]
    return bytes(
        DescribeClientQuotasResponse(throttle_time_ms=0, error_code=NONE, error_message=None, entries=entries).encode(
            version=version
        )
    )


def _alter_ip(ip_quotas: IpQuotas | None, entry: Any, validate_only: bool) -> None:
    """An entry on an ``ips`` entity (Kafka: it may not be combined with user or client-id)."""
    if ip_quotas is None:
        raise IpQuotaError("ip entities are not handled here")
    if len(entry.entity) != 1:
        raise IpQuotaError("invalid client quota entity: ip cannot be combined with user or client-id")
    name = entry.entity[0].entity_name
    ops: dict[str, float | None] = {}
    for op in entry.ops:
        value = None if op.remove else op.value
        IpQuotas.validate(name, op.key, value)
        ops[op.key] = value
    if not validate_only:
        for value in ops.values():
            ip_quotas.alter(name, value)


def alter(
    sources: QuotaSources,
    body: bytes | memoryview,
    version: int,
    principal: str,
    admins: frozenset[str],
    ip_quotas: IpQuotas | None = None,
) -> bytes:
    """The response body for an AlterClientQuotas request body, applying the valid entries (unless
    validate-only) when ``principal`` is an admin. Each entry stands or falls on its own, as in Kafka."""
    req = decode_body(AlterClientQuotasRequest, body, version)
    entry_cls = AlterClientQuotasResponse.EntryData
    results = []
    for entry in _array(req.entries, "AlterClientQuotas entries"):
        wire_entity = [
            entry_cls.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
            for e in _array(entry.entity, "AlterClientQuotas entity")
        ]
        _array(entry.ops, "AlterClientQuotas ops")
        code, message = NONE, None
        if principal not in admins:
            code, message = CLUSTER_AUTHORIZATION_FAILED, f"principal {principal} may not alter quotas at this proxy"
        else:
            try:
                if any(e.entity_type == ENTITY_IP for e in entry.entity):
                    _alter_ip(ip_quotas, entry, bool(req.validate_only))
                    results.append(entry_cls(error_code=NONE, error_message=None, entity=wire_entity))
                    continue
                entity = QuotaEntity.from_components((e.entity_type, e.entity_name) for e in entry.entity)
                ops: dict[str, float | None] = {}
                for op in entry.ops:
                    if op.key in ops:
                        raise QuotaEntityError(f"duplicate quota key {op.key} for {entity}")
                    ops[op.key] = None if op.remove else validate_quota(entity, op.key, op.value)
                if not req.validate_only:
                    sources.alter(entity, ops)
            except (QuotaEntityError, QuotaValueError, IpQuotaError) as exc:
                code, message = INVALID_REQUEST, str(exc)
        results.append(entry_cls(error_code=code, error_message=message, entity=wire_entity))
    return bytes(AlterClientQuotasResponse(throttle_time_ms=0, entries=results).encode(version=version))


def answer(
    conn: PolicyConnection,
    header: RequestHeader,
    body: memoryview,
    sources: QuotaSources,
    admins: frozenset[str],
    describers: frozenset[str],
    ip_quotas: IpQuotas,
) -> Answer[Decision]:
    """The proxy's answer to a DescribeClientQuotas or AlterClientQuotas request (``body``: the frame after its size
    prefix); an alteration is logged with who made it."""
    version = header.api_version
    principal = conn.identity.principal
    if header.api_key == Api.DESCRIBE_CLIENT_QUOTAS:
        reply = describe(sources, body[header.body_offset :], version, principal, describers, ip_quotas)
    else:
        reply = alter(sources, body[header.body_offset :], version, principal, admins, ip_quotas)
        log.info("%s: AlterClientQuotas v%d by %s", conn.peer, version, printable(principal))
    return Answer(None, local_frame(header, reply))
