"""Rough edges an operator meets in the first hour (issue 18): one line instead of a traceback or silence."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from pathlib import Path

from config.model import ProxyConfig
from proxy.server import Proxy

REPO = Path(__file__).resolve().parents[2]


def _config(**quotas) -> ProxyConfig:
    return ProxyConfig.model_validate(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9"], "connect_timeout_ms": 200},
            "listen": {"host": "127.0.0.1", "bootstrap_port": 0, "broker_ports": "ephemeral"},
            "quotas": quotas,
        }
    )


def test_an_unreachable_upstream_is_a_warning_at_start(caplog):
    async def main():
        proxy = Proxy(_config())
        await proxy.start()
        await proxy.shutdown()

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "no broker answered" in r.message]
    assert len(warnings) == 1 and "127.0.0.1:9" in warnings[0].message


def test_reloading_a_state_file_says_it_needs_a_restart(caplog, tmp_path):
    proxy = Proxy(_config())
    with caplog.at_level(logging.WARNING):
        proxy.reload(_config(state_file=str(tmp_path / "quotas.json")))
    assert any("quotas.state_file changed" in r.message and "restart" in r.message for r in caplog.records)


def test_run_embedded_with_a_busy_port_says_so_in_one_line_before_starting_kafka():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "scripts.embedded", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"--port {port}" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "starting a single-node Apache Kafka" not in done.stdout


def test_run_embedded_with_a_bad_config_file_says_so_in_one_line_before_starting_kafka(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("quotas: {entities: [{entity: {user: a}, quotas: {producer_byte_rate: -1}}]}\n")
    done = subprocess.run(
        [sys.executable, "-m", "scripts.embedded", "-c", str(bad), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "producer_byte_rate" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "starting a single-node Apache Kafka" not in done.stdout


def test_every_subcommand_takes_kafkas_spelling_of_bootstrap_server_and_the_old_one():
    from proxy.cli.main import _parser, config_from_args

    for flag in ("--bootstrap-server", "--bootstrap-servers"):
        args = _parser().parse_args(["run", flag, "10.0.0.1:9092,10.0.0.2:9092"])
        assert config_from_args(args).upstream.bootstrap_servers == ["10.0.0.1:9092", "10.0.0.2:9092"]
        quotas = _parser().parse_args(["quotas", flag, "127.0.0.1:19092", "describe"])
        assert quotas.bootstrap_server == "127.0.0.1:19092"


def test_run_embedded_fair_share_demo_with_a_config_file_says_so_in_one_line_before_starting_kafka(tmp_path):
    """--demo fair-share writes its own file (the one its off/on commands edit): a -c of the user's is refused."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("quotas: {}\n")
    done = subprocess.run(
        [sys.executable, "-m", "scripts.embedded", "--demo", "fair-share", "-c", str(mine), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "-c" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "starting a single-node" not in done.stdout


def test_the_fair_share_demos_commands_turn_it_off_and_on_in_the_file_it_writes(tmp_path):
    """The commands the demo prints, run as printed, against the file it writes: the configuration the proxy then
    loads has fair share off, then on; and nothing else in it moves."""
    from config.load import load_config
    from scripts.embedded import FAIR_DEMO_CONFIG, fair_switch_commands

    path = tmp_path / "proxy.yaml"
    path.write_text(FAIR_DEMO_CONFIG)
    before = load_config(path)
    assert before.quotas.fair_share.enabled and not before.quotas.entities  # the default, and no quota
    assert before.metrics.port == 0  # served: the demo's lines read fair share from it
    off, on = fair_switch_commands(path)
    subprocess.run(off, shell=True, check=True, timeout=10)
    after = load_config(path)
    assert not after.quotas.fair_share.enabled
    assert after.model_dump(exclude={"quotas"}) == before.model_dump(exclude={"quotas"})
    subprocess.run(on, shell=True, check=True, timeout=10)
    assert load_config(path) == before


def test_the_fair_share_demo_reads_fair_shares_state_from_the_metrics():
    from scripts.demo_fair_share import fair_state

    off = fair_state("# HELP ktp_fair_share_limited 1 while ...\n# TYPE ktp_fair_share_limited gauge\n")
    assert off.describe() == "fair share off"
    on = fair_state('ktp_fair_share_limited{broker="broker 1"} 0.0\n')
    assert on.describe() == "fair share on, not limiting"
    limiting = fair_state(
        'ktp_fair_share_limited{broker="broker 1"} 1.0\n'
        'ktp_fair_share_tenant_share_bytes{broker="broker 1",client_id="demo-flooder",user="ANONYMOUS"} 4194304.0\n'
        'ktp_fair_share_tenant_share_bytes{broker="broker 1",client_id="demo-light",user="ANONYMOUS"} 0.0\n'
    )
    assert limiting.describe() == "fair share limiting broker 1, flooder held to 4.0 MiB/s"
