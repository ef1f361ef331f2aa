"""examples/kubernetes and examples/systemd: valid for their tools, and saying the same as the proxy.

The manifests are validated against the Kubernetes API's own JSON schemas, strictly, and read for what the proxy
needs of them (tests/harness/kube_objects.py, which holds the Helm chart's renderings to the same checks). The
systemd unit passes ``systemd-analyze verify`` (with its executable pointed at this checkout's) and runs the
commands the CLI takes.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.cli.main import _parser
from tests.harness.kube_objects import KUBERNETES, by_kind, check_pod_agrees, load_proxy_config, validate_strictly

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = EXAMPLES / "kubernetes" / "kafka-throttle-proxy.yaml"
UNIT = EXAMPLES / "systemd" / "kafka-throttle-proxy.service"


def _docs() -> dict[str, dict[str, Any]]:
    return by_kind(yaml.safe_load_all(MANIFESTS.read_text()))


def test_every_manifest_is_valid_kubernetes():
    docs = list(yaml.safe_load_all(MANIFESTS.read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget"]
    validate_strictly(docs)


def test_a_manifest_with_a_wrong_field_fails_validation():
    deployment = _docs()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo kubectl would refuse
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_manifests_agree_with_the_proxys_configuration(tmp_path):
    docs = _docs()
    config, files = load_proxy_config(docs, tmp_path)
    check_pod_agrees(docs, config, files)
    assert files.keys() == {"fleet.secret_file"}
    assert config.listen.advertised_host == f"{docs['Service']['metadata']['name']}.kafka.svc.cluster.local"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="scripts/setup --test installs systemd")
def test_the_systemd_unit_verifies_and_runs_what_the_cli_takes(tmp_path):
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    service = unit["Service"]
    parser = _parser()
    for key in ("ExecStartPre", "ExecStart"):
        exe, *args = shlex.split(service[key])
        assert exe == "/opt/kafka-throttle-proxy/bin/kafka-throttle-proxy"
        parser.parse_args(args)  # exits (SystemExit) on anything the CLI does not take
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID" and service["KillSignal"] == "SIGTERM"

    here = Path(sys.executable).parent  # this environment's kafka-throttle-proxy stands in for the installed one
    local = tmp_path / UNIT.name
    local.write_text(UNIT.read_text().replace("/opt/kafka-throttle-proxy/bin", str(here)))
    done = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == "", done.stderr
