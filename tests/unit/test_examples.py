"""Every shipped example configuration is valid as it stands (what ``kafka-throttle-proxy check-config`` says)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config.load import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_examples_exist():
    assert len(EXAMPLES) >= 3


def _file_keys(tree: dict, prefix: str = "") -> list[str]:
    """Dotted keys of every ``*_file`` setting (certificates an example names but cannot ship)."""
    keys = []
    for key, value in tree.items():
        if isinstance(value, dict):
            keys += _file_keys(value, f"{prefix}{key}.")
        elif key.endswith("_file") and key != "state_file":
            keys.append(prefix + key)
    return keys


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid_and_sets_quotas(path, tmp_path):
    stand_in = tmp_path / "stand-in.pem"
    stand_in.write_text("")  # the validator checks the files exist; what they hold is TLS's business
    secret = tmp_path / "stand-in-secret"
    secret.write_text("a stand-in fleet secret, 32 bytes")  # a secret file is read: it must be long enough
    files = _file_keys(yaml.safe_load(path.read_text()))
    config = load_config(path, {k: str(secret if k.endswith("secret_file") else stand_in) for k in files})
    assert config.quotas.entities, f"{path.name} sets no quota"


def test_examples_cover_the_common_cases():
    names = {p.name for p in EXAMPLES}
    assert {"byte-rates.yaml", "shared-cluster.yaml", "shadow-mode.yaml", "tls-sasl.yaml", "demo.yaml"} <= names


def test_check_config_accepts_an_example():
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "-c", str(EXAMPLES[0])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=EXAMPLES[0].parents[1],
    )
    assert done.returncode == 0, done.stderr
