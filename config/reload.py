"""What a configuration reload may change, and what keeps its running value until a restart.

Why one table: a reload (SIGHUP, or the file changing) that half-applies a setting is worse than one that refuses
it. Changing the decision log's topic once moved the protected-topic guard to the new name while the log went on
writing to the old topic, which tenants could then read; reloading into scope ``fleet`` made a ledger that no
sync fed. So every setting is named here as one or the other, a test checks that none is left out, and the
configuration reference prints which is which. :func:`plan_reload` returns the configuration to put in force:
the new file's reloadable settings with every restart-only setting kept at its running value, and the names of
the restart-only settings the file changed (each gets the one-line "takes effect only after a restart" warning).
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ValidationError

from config.load import ConfigError, describe_errors
from config.model import ProxyConfig

RESTART_ONLY: Final[tuple[str, ...]] = (
    # Bound or opened once at start: listeners, the upstream's addresses and TLS, the metrics server, the request
    # pool, the decision log's file or topic (the guard protects the topic it writes), the fleet's sync.
    "upstream",
    "listen",
    "max_frame_bytes",
    "queued_max_request_bytes",
    "request_pool_min_bytes",
    "request_read_timeout_ms",
    "connections_max_idle_ms",
    "upstream_timeout_margin_ms",
    "workers",
    "sasl",
    "metrics.port",
    "metrics.host",
    "decision_log",
    "fleet",
    "quotas.state_file",
    "quotas.import_interval_seconds",
)
"""Settings (a dotted name covers everything below it) that a reload leaves at their running values."""

RELOADABLE: Final[tuple[str, ...]] = (
    "shutdown_grace_ms",
    "shutdown_unready_ms",
    "log_level",
    "metrics.max_entity_series",
    "limits",
    "quotas.enforce",
    "quotas.enforcement",
    "quotas.smooth_burst_seconds",
    "quotas.scope",
    "quotas.window_num",
    "quotas.window_size_seconds",
    "quotas.controller_window_num",
    "quotas.controller_window_size_seconds",
    "quotas.producer_id_window_num",
    "quotas.producer_id_window_size_seconds",
    "quotas.producer_id_cleanup_interval_ms",
    "quotas.producer_id_hold_max_ms",
    "quotas.charge_validate_only",
    "quotas.admins",
    "quotas.describers",
    "quotas.max_tracked_buckets",
    "quotas.entity_idle_seconds",
    "quotas.entities",
    "quotas.fair_share",
    "quotas.request_costs",
)
"""Settings a reload puts in force at once. ``quotas.scope`` is reloadable between ``broker`` and ``cluster``
only: a change into or out of ``fleet`` starts or ends the fleet's sync, so it waits for a restart."""


def setting(config: BaseModel, dotted: str) -> Any:
    """The value of the setting ``dotted`` (``quotas.scope``) in ``config``."""
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def with_setting(config: BaseModel, dotted: str, value: Any) -> Any:
    """``config`` with the setting ``dotted`` replaced (models are frozen: copies down the path)."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return config.model_copy(update={head: value})
    return config.model_copy(update={head: with_setting(getattr(config, head), rest, value)})


def is_reloadable(dotted: str) -> bool:
    """Whether the setting ``dotted`` (or the section it is in) takes effect on reload."""
    return any(dotted == p or dotted.startswith(p + ".") for p in RELOADABLE)


def plan_reload(running: ProxyConfig, new: ProxyConfig) -> tuple[ProxyConfig, list[str]]:
    """The configuration to put in force for a reload from ``running`` to ``new``, and the restart-only settings
    (as ``name (old → new)``, for the warning) that ``new`` changed and that keep their running values."""
    kept: list[str] = []
    effective = new
    for dotted in RESTART_ONLY:
        old = setting(running, dotted)
        if setting(new, dotted) != old:
            effective = with_setting(effective, dotted, old)
            kept.append(dotted)
    old_scope, new_scope = running.quotas.scope, new.quotas.scope
    if old_scope != new_scope and "fleet" in (old_scope, new_scope):
        effective = with_setting(effective, "quotas.scope", old_scope)
        kept.append(f"quotas.scope ({old_scope} → {new_scope})")
    if kept:  # the new settings were validated beside the new restart-only ones: check them beside the kept ones
        try:
            ProxyConfig.model_validate(effective.model_dump())
        except ValidationError as exc:
            raise ConfigError(
                f"with the restart-only settings kept as they run ({', '.join(kept)}): {describe_errors(exc)}"
            ) from None
    return effective, kept
