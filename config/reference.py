"""The configuration reference, generated from the model itself: every setting with its type, default and
description (the attribute docstrings in ``config/model.py``).

Why generated: a hand-written page drifts from what the proxy accepts; this one cannot. ``docs/configuration.md``
is this module's output, and a unit test fails when the committed page differs from it
(``python -m config.reference --write`` brings it up to date).
"""

from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from config.model import ProxyConfig
from config.reload import is_reloadable

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

_HEAD = """# Configuration reference

Every setting of the proxy's YAML configuration, generated from the configuration model (`config/model.py`) by
`python -m config.reference --write`; a test fails when this page and the model disagree. A dotted name is a
nested key: `quotas.scope` is `scope` under `quotas:`. `kafka-throttle-proxy check-config -c FILE` validates a
file against exactly this; the repository's `examples/` directory holds complete files.

"On reload" says what a reload (SIGHUP, or the file changing) does with a changed setting: `at once` puts it in
force everywhere; `restart` keeps the running value and logs one line, "config reload: NAME changed; it takes
effect only after a restart" (`config/reload.py`). `quotas.scope` reloads between `broker` and `cluster`; into
or out of `fleet` it waits for a restart.
"""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model class a field holds (itself, an optional one, or the items of a list of them), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # ``UpstreamTlsConfig | None``
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def _text(description: str | None) -> str:
    return re.sub(r"\s+", " ", description or "").replace("|", "\\|").strip()


def _rows(model: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        sub = _model_of(field.annotation)
        if sub is not None and typing.get_origin(field.annotation) is not list:
            sections.append((dotted, sub))
            continue
        if sub is not None:  # a list of entries: described in a section of its own
            sections.append((dotted + "[]", sub))
        reload = "at once" if is_reloadable(dotted) else "restart"
        rows.append(
            f"| `{dotted}` | {_type(field.annotation)} | {_default(field)} | {reload} | {_text(field.description)} |"
        )
    return rows


def render() -> str:
    """The whole page."""
    out = [_HEAD]
    pending: list[tuple[str, type[BaseModel]]] = [("", ProxyConfig)]
    while pending:
        prefix, model = pending.pop(0)
        sections: list[tuple[str, type[BaseModel]]] = []
        rows = _rows(model, f"{prefix}." if prefix else "", sections)
        title = f"`{prefix}`" if prefix else "Top level"
        doc = _text((model.__doc__ or "").split("\n\n")[0]) if model is not ProxyConfig else ""
        out.append(f"\n## {title}\n")
        if doc:
            out.append(f"{doc}\n")
        if rows:
            out.append("| setting | type | default | on reload | description |\n|---|---|---|---|---|")
            out.extend(rows)
        pending.extend(sections)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(PAGE.parents[1])}")
    args = ap.parse_args(argv)
    page = render()
    if args.write:
        PAGE.write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
