"""Load a proposed quota configuration for the what-if replay, into the proxy's own :class:`QuotaStore`.

Why a tolerant loader: operators paste quotas from several places - the proxy's own YAML file (``quotas:
{entities: [...], window_num: ...}``), a bare list of entries, or ``kafka-configs``-style names. All of these
are accepted; every value is validated by :func:`quotas.entities.validate_quota` (via ``QuotaStore.set``), so a
config the proxy would refuse is refused here too, with the entity and key named.

Accepted shapes (``ENTRY`` = ``{entity: {user: NAME, client-id: NAME}, quotas: {KEY: VALUE, ...}}``, where NAME
is a name or ``<default>``, and a missing / null component is absent)::

    quotas: [ENTRY, ...]                       # the short form
    quotas: {entities: [ENTRY, ...], window_num: 11, scope: broker, ...}   # the proxy's config file
    entities: [ENTRY, ...]
    [ENTRY, ...]

``client_id`` is accepted for ``client-id``. VALUE is a number, or a string with a unit for byte rates
(``"1MiB"``, ``"500KB"``, ``"2.5M"``). The window settings use the proxy's field names (``window_num``,
``window_size_seconds``, ``controller_window_num``, ``controller_window_size_seconds``,
``producer_id_window_num``, ``producer_id_window_size_seconds``, ``entity_idle_seconds``, ``scope``) and may sit
next to ``entities`` or at the top level; Kafka's defaults apply otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotas.entities import DEFAULT, QuotaEntity, QuotaEntityError, QuotaStore, QuotaValueError
from quotas.kinds import KIND_KEYS
from quotas.manager import Windows

__all__ = ["KIND_KEYS", "QuotaConfigError", "ReplayConfig", "load_quota_config", "parse_quota_config"]


_WINDOW_FIELDS = (
    "window_num",
    "window_size_seconds",
    "controller_window_num",
    "controller_window_size_seconds",
    "producer_id_window_num",
    "producer_id_window_size_seconds",
    "entity_idle_seconds",
    "scope",
)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)(?:/s)?\s*$")


class QuotaConfigError(ValueError):
    """The proposed config cannot be used; the message names the entry and the reason."""


@dataclass(frozen=True)
class ReplayConfig:
    """Quotas as plain data (picklable, shipped to Spark's Python workers) plus window settings."""

    quotas: tuple[tuple[str | None, str | None, str, float], ...]
    """(user, client_id, key, value); names are a string, ``"<default>"`` or None (absent)."""
    windows: Windows = field(default_factory=Windows)
    idle_ms: int = 3_600_000
    scope: str = "broker"
    """``broker``: buckets are per logged ``scope`` (as the proxy does by default); ``cluster``: one per entity."""

    def store(self) -> QuotaStore:
        """A fresh :class:`QuotaStore` holding these quotas (the proxy's own resolution code)."""
        store = QuotaStore()
        for user, client, key, value in self.quotas:
            store.set(QuotaEntity(_name(user), _name(client)), key, value)
        return store

    def quota_keys(self) -> frozenset[str]:
        return frozenset(q[2] for q in self.quotas)

    def describe(self) -> list[dict[str, Any]]:
        """Rows for the report: entity as ``kafka-configs`` prints it, key, value."""
        return [{"entity": str(QuotaEntity(_name(u), _name(c))), "key": k, "value": v} for u, c, k, v in self.quotas]


def _name(value: str | None):
    if value is None:
        return None
    return DEFAULT if value == "<default>" else value


def _parse_value(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise QuotaConfigError(f"{where}: {key}: must be a number, not {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _VALUE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return float(m.group(1)) * _UNITS[m.group(2).lower()]
    raise QuotaConfigError(f"{where}: {key}: cannot read {value!r} as a number (e.g. 1048576, '1MiB', '500KB')")


def parse_quota_config(doc: Any) -> ReplayConfig:
    """Build a :class:`ReplayConfig` from an already parsed YAML/JSON document (see the module doc)."""
    settings: dict[str, Any] = {}
    if isinstance(doc, dict):
        settings.update({k: doc[k] for k in _WINDOW_FIELDS if k in doc})
        inner = doc.get("quotas", doc.get("entities"))
        if isinstance(inner, dict):
            settings.update({k: inner[k] for k in _WINDOW_FIELDS if k in inner})
            inner = inner.get("entities", [])
        entries = inner
    else:
        entries = doc
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise QuotaConfigError("expected a list of {entity: ..., quotas: ...} entries under 'quotas' or 'entities'")
    quotas: list[tuple[str | None, str | None, str, float]] = []
    check = QuotaStore()
    seen: set[tuple[str | None, str | None]] = set()
    for i, entry in enumerate(entries):
        where = f"entry {i}"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("entity"), dict)
            or not isinstance(entry.get("quotas"), dict)
        ):
            raise QuotaConfigError(f"{where}: expected {{entity: {{user: ..., client-id: ...}}, quotas: {{...}}}}")
        ent = entry["entity"]
        unknown = set(ent) - {"user", "client-id", "client_id"}
        if unknown:
            raise QuotaConfigError(f"{where}: unknown entity type(s) {sorted(unknown)}; use user and/or client-id")
        user = ent.get("user")
        client = ent.get("client-id", ent.get("client_id"))
        for part in (user, client):
            if part is not None and not isinstance(part, str):
                raise QuotaConfigError(f"{where}: entity names must be strings or <default>, got {part!r}")
        try:
            entity = QuotaEntity(_name(user), _name(client))
        except QuotaEntityError as exc:
            raise QuotaConfigError(f"{where}: {exc}") from None
        if (user, client) in seen:
            raise QuotaConfigError(f"{where}: {entity} is listed twice")
        seen.add((user, client))
        for key, raw in entry["quotas"].items():
            value = _parse_value(f"{where} {entity}", key, raw)
            try:
                check.set(entity, key, value)
            except QuotaValueError as exc:
                raise QuotaConfigError(f"{where}: {exc}") from None
            quotas.append((user, client, key, value))
    try:
        windows = Windows.from_settings(settings)
        idle_ms = round(float(settings.get("entity_idle_seconds", 3600.0)) * 1000)
    except (TypeError, ValueError) as exc:
        raise QuotaConfigError(f"window settings: {exc}") from None
    scope = settings.get("scope", "broker")
    if scope not in ("broker", "cluster"):
        raise QuotaConfigError(f"scope must be broker or cluster, not {scope!r}")
    return ReplayConfig(tuple(quotas), windows, idle_ms, scope)


def load_quota_config(path: str | Path) -> ReplayConfig:
    """Read a YAML (or JSON) file; :class:`QuotaConfigError` names what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise QuotaConfigError(f"{path}: {exc}") from None
    import yaml  # here, not at the top: executors import this module and need no YAML

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise QuotaConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_quota_config(doc)
    except QuotaConfigError as exc:
        raise QuotaConfigError(f"{path}: {exc}") from None
