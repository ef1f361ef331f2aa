"""bench.isolation as a program: a phase list with a typo is refused before any cluster starts, naming the typo and
the phases in the order they run. Run, not imported: nothing under tests/ imports bench/ (tests/unit/test_layers.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO

PHASES = (
    "alone-proxy, alone-direct, flood-noquota, flood-noquota-off, flood-nostart, flood-target, flood-direct, "
    "flood-kafka, "
    "flood-smooth, flood-smooth-off, flood-hand, flood-broker, flood-paced, flood-paced-even, flood-consumer, "
    "flood-consumer-off, flood-ids, lone-fair, lone-nofair, lone-alt, steady-fair, steady-nofair, alone-proxy-again"
)


@pytest.mark.parametrize(("given", "named"), [("alone-proxy,flood-smoth", "['flood-smoth']"), (" , ", "[]")])
def test_a_phase_list_with_a_typo_is_refused_before_anything_starts(given, named):
    done = subprocess.run(
        [sys.executable, "-m", "bench.isolation", "--phases", given],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"unknown phase(s) {named}; choose from {PHASES} or all" in done.stderr
