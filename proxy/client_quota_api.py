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

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from config.quota_sources import QuotaSources
from protocol.apis import decode_body
from quotas.entities import (
    FilterComponent,
    QuotaEntity,
    QuotaEntityError,
    QuotaFilterError,
    QuotaValueError,
    UnsupportedEntityTypeError,
    validate_quota,
)

NONE = 0
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
UNSUPPORTED_VERSION = 35


def describe(sources: QuotaSources, body, version: int, principal: str, describers: frozenset[str]) -> bytes:
    """The response body for a DescribeClientQuotas request body, when ``principal`` may describe."""
    req = decode_body(DescribeClientQuotasRequest, body, version)
    if principal not in describers:
        return DescribeClientQuotasResponse(
            throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED,
            error_message="not authorized to describe client quotas at this proxy", entries=None,
        ).encode(version=version)
    components = [FilterComponent(c.entity_type, c.match_type, c.match) for c in req.components or ()]
    try:
        found = sources.store.describe(components, strict=bool(req.strict))
    except UnsupportedEntityTypeError as exc:
        return DescribeClientQuotasResponse(
            throttle_time_ms=0, error_code=UNSUPPORTED_VERSION, error_message=str(exc), entries=None
        ).encode(version=version)
    except QuotaFilterError as exc:
        return DescribeClientQuotasResponse(
            throttle_time_ms=0, error_code=INVALID_REQUEST, error_message=str(exc), entries=None
        ).encode(version=version)
    entry_cls = DescribeClientQuotasResponse.EntryData
    entries = [
        entry_cls(
            entity=[entry_cls.EntityData(entity_type=t, entity_name=n) for t, n in entity.components().items()],
            values=[entry_cls.ValueData(key=k, value=v) for k, v in sorted(quotas.items())],
        )
        for entity, quotas in found.items()
    ]
    return DescribeClientQuotasResponse(
        throttle_time_ms=0, error_code=NONE, error_message=None, entries=entries
    ).encode(version=version)


def alter(sources: QuotaSources, body, version: int, principal: str, admins: frozenset[str]) -> bytes:
    """The response body for an AlterClientQuotas request body, applying the valid entries (unless
    validate-only) when ``principal`` is an admin. Each entry stands or falls on its own, as in Kafka."""
    req = decode_body(AlterClientQuotasRequest, body, version)
    entry_cls = AlterClientQuotasResponse.EntryData
    results = []
    for entry in req.entries:
        wire_entity = [entry_cls.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                       for e in entry.entity]
        code, message = NONE, None
        if principal not in admins:
            code, message = CLUSTER_AUTHORIZATION_FAILED, f"principal {principal} may not alter quotas at this proxy"
        else:
            try:
                entity = QuotaEntity.from_components((e.entity_type, e.entity_name) for e in entry.entity)
                ops: dict[str, float | None] = {}
                for op in entry.ops:
                    if op.key in ops:
                        raise QuotaEntityError(f"duplicate quota key {op.key} for {entity}")
                    ops[op.key] = None if op.remove else validate_quota(entity, op.key, op.value)
                if not req.validate_only:
                    sources.alter(entity, ops)
            except (QuotaEntityError, QuotaValueError) as exc:
                code, message = INVALID_REQUEST, str(exc)
        results.append(entry_cls(error_code=code, error_message=message, entity=wire_entity))
    return AlterClientQuotasResponse(throttle_time_ms=0, entries=results).encode(version=version)
