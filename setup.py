"""Optional mypyc build of the per-request modules (everything else is in pyproject.toml).

    python -m build                    # sdist and wheel, the per-request modules compiled by mypyc when it can
    pip install .                      # the same build, installed
    KTP_MYPYC=0 pip install .          # pure Python: nothing compiled
    KTP_MYPYC=1 pip install -e .       # compiled, the .so files built in place next to the .py (tests, benches)

The .py files stay the single source: a compiled module is that file, type-checked and translated. When
KTP_MYPYC is 1 (the default) but mypyc or a C compiler is missing, or the build fails, the pure-Python package
installs instead (with a warning), unless KTP_MYPYC=require, which fails the build (CI, so a broken build shows).
Which build is running: ``kafka-throttle-proxy --version`` says, and the proxy logs it at startup
(``proxy.build_info``, which also holds the module list).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _compiled_modules() -> list[str]:
    """proxy/build_info.py's COMPILED (the one list), loaded by path: the package's dependencies are not there yet."""
    path = Path(__file__).with_name("proxy") / "build_info.py"
    spec = importlib.util.spec_from_file_location("_ktp_build_info", path)
    assert spec is not None and spec.loader is not None  # a .py path: always a spec with a source loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compiled_sources()


MYPYC_MODULES = _compiled_modules()

MODE = os.environ.get("KTP_MYPYC", "1")


class OptionalBuildExt(build_ext):
    """All or nothing: a mypyc group is one shared library plus per-module shims, so a partial build is no use."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, a missing compiler (DistutilsPlatformError)
            if MODE == "require":
                raise
            print(f"warning: mypyc build failed ({exc}); installing the pure-Python package", file=sys.stderr)
            self.extensions: list[Extension] = []
            _remove_inplace_builds()


def _remove_inplace_builds() -> None:
    """Delete compiled modules an earlier editable build left beside the sources: Python would import them ahead
    of the ``.py`` files, so a pure-Python install (KTP_MYPYC=0, or a failed build) must not leave them there."""
    root = Path(__file__).resolve().parent
    for module in MYPYC_MODULES:
        for built in root.glob(module[:-3] + ".*.so"):
            built.unlink()
    for group in root.glob("*__mypyc.*.so"):
        group.unlink()


def _ext_modules() -> list:
    if MODE not in ("1", "require"):
        _remove_inplace_builds()
        return []
    if "sdist" in sys.argv[1:]:  # a source distribution carries the .py files; its wheel compiles them
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        # Asked for build requirements (egg_info) mypy is not there yet: the backend adds it (_build/ktp_build.py).
        if MODE == "require" and "egg_info" not in sys.argv[1:]:
            raise
        print("warning: KTP_MYPYC=1 but mypyc is not installed; installing the pure-Python package", file=sys.stderr)
        return []
    # opt_level 3 is mypyc's default. --ignore-missing-imports: kafka-python, uvloop... ship no type hints.
    # --follow-imports=silent: the modules they import are analysed but not held to mypy (apis.py, mutations.py...
    # have type errors of their own that are no concern of the compiled code).
    return mypycify(["--ignore-missing-imports", "--follow-imports=silent", *MYPYC_MODULES], opt_level="3")


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
