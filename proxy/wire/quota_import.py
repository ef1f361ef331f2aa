"""Read the cluster's own client quotas (DescribeClientQuotas) so quotas operators already set in Kafka are
enforced at the proxy too (the ``imported`` layer of :mod:`config.quota_sources`).

The proxy asks on a connection of its own, so this works against a PLAINTEXT upstream listener; against a SASL
listener the broker refuses an unauthenticated request and every attempt logs why (the proxy holds no
credentials of its own). Keys the proxy does not enforce (connection_creation_rate, ip entities) are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from ssl import SSLContext

from kafka.protocol.admin import DescribeClientQuotasRequest, DescribeClientQuotasResponse

from proxy.wire.discovery import ask_once
from quotas.entities import QUOTA_KEYS, QuotaEntity, QuotaEntityError, QuotaValueError, validate_quota

log = logging.getLogger(__name__)
_VERSION = 0


async def fetch_cluster_quotas(
    addresses: list[tuple[str, int]], timeout: float, max_frame_bytes: int, ssl: SSLContext | None = None
) -> dict[QuotaEntity, dict[str, float]]:
    errors = []
    for host, port in addresses:
        try:
            return await asyncio.wait_for(_ask(host, port, max_frame_bytes, ssl), timeout)
        except Exception as exc:  # noqa: BLE001 - try the next bootstrap server, report all at the end
            errors.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
    raise ConnectionError("cannot read the cluster's client quotas (" + "; ".join(errors) + ")")


async def _ask(
    host: str, port: int, max_frame_bytes: int, ssl: SSLContext | None = None
) -> dict[QuotaEntity, dict[str, float]]:
    request = DescribeClientQuotasRequest(components=[], strict=False)
    resp = await ask_once(host, port, request, DescribeClientQuotasResponse, _VERSION, max_frame_bytes, ssl)
    if resp.error_code != 0:
        raise ConnectionError(f"DescribeClientQuotas error {resp.error_code}: {resp.error_message}")
    out: dict[QuotaEntity, dict[str, float]] = {}
    for entry in resp.entries or []:
        try:
            entity = QuotaEntity.from_components((e.entity_type, e.entity_name) for e in entry.entity)
        except QuotaEntityError:
            continue  # ip entities: connection-rate quotas are the broker's business
        for value in entry.values:
            if value.key not in QUOTA_KEYS:
                continue
            try:
                out.setdefault(entity, {})[value.key] = validate_quota(entity, value.key, value.value)
            except QuotaValueError as exc:
                log.warning("cluster quota skipped: %s", exc)
    return out
