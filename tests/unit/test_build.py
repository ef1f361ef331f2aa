"""The build under test is the one asked for: ``KTP_MYPYC=require`` (CI's main run, scripts/setup's default when a
compiler is there) means every module of ``proxy.build_info.COMPILED`` runs compiled; ``KTP_MYPYC_EXPECT=pure``
(scripts/test's pure-Python pass) means none does. Without either, both builds are fine and only the
bookkeeping is checked."""

from __future__ import annotations

import os
from pathlib import Path

from proxy import build_info

REPO = Path(__file__).resolve().parents[2]


def test_the_build_asked_for_is_the_build_running():
    compiled = build_info.compiled_modules()
    if os.environ.get("KTP_MYPYC_EXPECT") == "pure":
        assert compiled == [], f"pure-Python run, but these are compiled: {compiled}"
    elif os.environ.get("KTP_MYPYC") == "require":
        assert compiled == list(build_info.COMPILED), "KTP_MYPYC=require, but some modules run uncompiled"
    assert set(compiled) <= set(build_info.COMPILED)
    assert build_info.stale_modules() == []  # conftest.py refuses to start otherwise


def test_every_compiled_module_exists_and_setup_reads_the_same_list():
    for name in build_info.COMPILED:
        assert (REPO / (name.replace(".", "/") + ".py")).is_file(), name
    text = (REPO / "setup.py").read_text()
    assert "build_info.py" in text and "COMPILED" in text  # setup.py reads the list, it does not keep its own
    assert build_info.describe().startswith("per-request modules: ")


def test_a_source_newer_than_its_compiled_module_is_reported_stale(tmp_path, monkeypatch):
    pkg = tmp_path / "stalepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    so = pkg / ("mod" + build_info._EXTENSIONS[0])
    so.write_bytes(b"")  # never imported: only its time is read
    source = pkg / "mod.py"
    source.write_text("X = 1\n")
    os.utime(so, (1_000_000, 1_000_000))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(build_info, "COMPILED", ("stalepkg.mod",))
    assert build_info.stale_modules() == ["stalepkg.mod"]
    os.utime(source, (500_000, 500_000))
    assert build_info.stale_modules() == []
