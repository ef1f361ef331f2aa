import subprocess
import sys

import pytest

from config.load import ConfigError, load_config
from tests.support import REPO


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("upstream:\n  bootstrap_servers: [a:9092, 'b:9093']\nlisten:\n  host: 0.0.0.0\n")
    cfg = load_config(f, {"listen.bootstrap_port": 29092})
    assert cfg.upstream.addresses() == [("a", 9092), ("b", 9093)]
    assert cfg.listen.bootstrap_port == 29092
    assert cfg.listen.advertised() == "127.0.0.1"
    assert cfg.max_frame_bytes == 100 * 1024 * 1024


@pytest.mark.parametrize(
    "yaml_text, field",
    [
        ("listen: {}\n", "upstream"),
        ("upstream: {bootstrap_servers: [nohost]}\n", "upstream.bootstrap_servers"),
        ("upstream: {bootstrap_servers: ['a:70000']}\n", "upstream.bootstrap_servers"),
        ("upstream: {bootstrap_servers: ['a:1']}\nlisten: {broker_ports: 9-3}\n", "listen"),
        ("upstream: {bootstrap_servers: ['a:1']}\nlisten: {bootstrap_port: 19100}\n", "listen"),
        ("upstream: {bootstrap_servers: ['a:1']}\nmax_frame_bytes: 0\n", "max_frame_bytes"),
        ("upstream: {bootstrap_servers: ['a:1']}\nbogus: 1\n", "bogus"),
        ("upstream: {bootstrap_servers: ['a:1']}\nlog_level: LOUD\n", "log_level"),
        ("- just\n- a list\n", "top level"),
        ("upstream: [\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_field(tmp_path, yaml_text, field):
    f = tmp_path / "c.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(f)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_check_config_cli(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("upstream: {bootstrap_servers: ['k:9092']}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream: {bootstrap_servers: ['k:9092']}\nlisten: {broker_ports: nonsense}\n")
    run = [sys.executable, "-m", "proxy.cli", "check-config", "-c"]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0 and "valid" in ok.stdout
    assert "request costs: built-in table" in ok.stdout  # which table request_percentage charges by (issue 50)
    costs = tmp_path / "costs.yaml"
    costs.write_text(
        "upstream: {bootstrap_servers: ['k:9092']}\n"
        "quotas: {request_costs: {source: 'lab, 2026-12-06', apis: {Produce: {base_ms: 0.024}}}}\n"
    )
    calibrated = subprocess.run([*run, str(costs)], capture_output=True, text=True, cwd=REPO)
    assert calibrated.returncode == 0 and "request costs: quotas.request_costs (lab, 2026-12-06)" in calibrated.stdout
    ko = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=REPO)
    assert ko.returncode == 2
    assert "listen.broker_ports" in ko.stderr
    # a bad config refuses to *run* the same way
    ko_run = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "run", "-c", str(bad)], capture_output=True, text=True, cwd=REPO, timeout=30
    )
    assert ko_run.returncode == 2 and "listen.broker_ports" in ko_run.stderr
