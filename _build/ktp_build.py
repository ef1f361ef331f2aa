"""In-tree PEP 517 backend: setuptools', plus mypy as a build requirement only when KTP_MYPYC asks for the
compiled build (a plain ``pip install .`` downloads nothing more than before)."""

from __future__ import annotations

import os

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F403

_MYPYC = ["mypy==2.4.1"]  # pinned: mypyc's generated C and its runtime library change between releases


def _extra() -> list[str]:
    return _MYPYC if os.environ.get("KTP_MYPYC") in ("1", "require") else []


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra()
