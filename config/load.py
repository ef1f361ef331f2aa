"""Load the YAML file, apply CLI overrides, validate; errors name the field and the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from config.model import ProxyConfig


class ConfigError(Exception):
    """The configuration cannot be used; the message names the field(s) and why."""


def describe_errors(exc: ValidationError) -> str:
    """A validation failure as one line: each field's dotted name and what is wrong with it."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"{where}: {msg}")
    return "; ".join(lines)


def _set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = doc
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{'.'.join(parts[:-1])}: is not a mapping, cannot set {dotted}")
        node = nxt
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ProxyConfig:
    """Read ``path`` (YAML), overlay ``overrides`` (dotted keys), validate."""
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        doc = loaded
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_path(doc, key, value)
    try:
        return ProxyConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None
