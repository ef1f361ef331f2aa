"""``scripts/kafka-tool``: names as in Kafka's ``bin/``, and a wrong name is one line and exit 2 before any
download or JVM (the tools themselves are run against the cluster in tests/integration/test_quota_tools.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts.kafka_tool import TOOLS, tool_name
from tests.harness.kafka_dist import MAIN_CANDIDATES

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka-tool"


@pytest.mark.parametrize(
    "given", ["configs", "kafka-configs", "kafka-configs.sh", "bin/kafka-configs.sh", "/opt/kafka/bin/kafka-configs.sh"]
)
def test_script_names_with_or_without_prefix_and_suffix(given):
    assert tool_name(given) == "configs"


def test_the_tools_an_operator_needs_first_are_known():
    for name in (
        "configs",
        "topics",
        "console-producer",
        "console-consumer",
        "producer-perf-test",
        "consumer-perf-test",
        "consumer-groups",
        "acls",
    ):
        assert name in TOOLS
    assert tool_name("kafka-producer-perf-test.sh") == "producer-perf-test"
    # Short names that are no class name must be the harness's keys (resolved per release there).
    for target in TOOLS.values():
        assert "." in target or target in MAIN_CANDIDATES, target


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("given", ["nope", "kafka-nope.sh", "server-start"])
def test_an_unknown_tool_is_one_line_listing_the_known_ones_and_exit_2(tmp_path, given):
    r = _run(given, "--bootstrap-server", "127.0.0.1:9", cwd=tmp_path)
    assert r.returncode == 2, r
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    line = r.stderr.strip()
    assert f"unknown tool {given!r}" in line and "configs" in line and "console-producer" in line, line


def test_no_name_is_usage_and_exit_2_help_is_exit_0(tmp_path):
    r = _run(cwd=tmp_path)
    assert r.returncode == 2 and "usage: scripts/kafka-tool NAME" in r.stderr and len(r.stderr.splitlines()) == 1
    h = _run("--help", cwd=tmp_path)
    assert h.returncode == 0 and "known tools:" in h.stdout and "producer-perf-test" in h.stdout
