"""Every shipped example configuration is valid as it stands (what ``kafka-throttle-proxy check-config`` says)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config.load import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_examples_exist():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid_and_sets_quotas(path):
    config = load_config(path)
    assert config.quotas.entities, f"{path.name} sets no quota"


def test_check_config_accepts_an_example():
    done = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", "-c", str(EXAMPLES[0])],
                          capture_output=True, text=True, timeout=60, cwd=EXAMPLES[0].parents[1])
    assert done.returncode == 0, done.stderr
