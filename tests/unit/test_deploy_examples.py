"""examples/kubernetes and examples/systemd: valid for their tools, and saying the same as the proxy.

The manifests are validated against the Kubernetes API's own JSON schemas (kubernetes-validate ships them),
strictly (an unknown field fails); then read for what the proxy needs of them: the configuration in the
ConfigMap validates as the proxy's, the probes ask /healthz and /readyz on its metrics port, the Service and the
container expose its bootstrap port and a broker port per node id, and the pod's grace outlasts the drain. The
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

from config.load import load_config
from proxy.cli.main import _parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = EXAMPLES / "kubernetes" / "kafka-throttle-proxy.yaml"
UNIT = EXAMPLES / "systemd" / "kafka-throttle-proxy.service"
KUBERNETES = "1.30.0"  # the oldest release still in upstream support when the manifests were written


def _docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFESTS.read_text())}


def test_every_manifest_is_valid_kubernetes():
    docs = list(yaml.safe_load_all(MANIFESTS.read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_a_manifest_with_a_wrong_field_fails_validation():
    deployment = _docs()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo kubectl would refuse
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_manifests_agree_with_the_proxys_configuration(tmp_path):
    docs = _docs()
    secret = tmp_path / "secret"
    secret.write_text(docs["Secret"]["stringData"]["secret"])
    path = tmp_path / "proxy.yaml"
    path.write_text(docs["ConfigMap"]["data"]["proxy.yaml"])
    config = load_config(path, {"fleet.secret_file": str(secret)})

    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["run", "-c", "/etc/kafka-throttle-proxy/proxy.yaml"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["bootstrap"] == config.listen.bootstrap_port and ports["metrics"] == config.metrics.port
    assert isinstance(config.listen.broker_ports, tuple)
    first = config.listen.broker_ports[0]
    brokers = sorted((int(n.removeprefix("broker-")), p) for n, p in ports.items() if n.startswith("broker-"))
    assert brokers and all(port == first + node for node, port in brokers)  # broker N is at first + N
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    drain_s = (config.shutdown_unready_ms + config.shutdown_grace_ms) / 1000
    assert pod["terminationGracePeriodSeconds"] > drain_s
    assert pod["securityContext"]["runAsNonRoot"] is True

    service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in docs["Service"]["spec"]["ports"]}
    assert service_ports == {name: (port, name) for name, port in ports.items()}
    assert config.listen.advertised_host == f"{docs['Service']['metadata']['name']}.kafka.svc.cluster.local"
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    secret_file = yaml.safe_load(docs["ConfigMap"]["data"]["proxy.yaml"])["fleet"]["secret_file"]
    assert Path(secret_file).parent.as_posix() in mounted  # the Secret is where the configuration reads it


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
