"""In-tree PEP 517 backend: setuptools', plus mypy as a build requirement when the build compiles the per-request
modules (KTP_MYPYC 1, the default, or require; KTP_MYPYC=0 downloads nothing more than setuptools)."""

from __future__ import annotations

import os

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F403

_MYPYC = ["mypy==2.4.1"]  # pinned: mypyc's generated C and its runtime library change between releases


def _extra() -> list[str]:
    return _MYPYC if os.environ.get("KTP_MYPYC", "1") in ("1", "require") else []


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra()
