"""deploy/helm/kafka-throttle-proxy: lint-clean, and every rendering is valid Kubernetes saying the same as the proxy.

Helm is the pinned one scripts/setup --test builds from its Go module into .tools/bin; it renders offline
(``helm template``, no cluster). Each set of values is rendered, every object validated strictly against the
Kubernetes schemas and the ConfigMap's proxy.yaml loaded as the proxy's own configuration, with the checks the
hand-written manifest gets (tests/harness/kube_objects.py). That manifest stays as the commented example for
``kubectl apply``; rather than generate it (which would lose its comments and carry Helm's bookkeeping), a test
checks it is the chart's default rendering, object for object, less what only Helm adds.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.kube_objects import (
    KUBERNETES,
    Doc,
    by_kind,
    check_pod_agrees,
    load_proxy_config,
    validate_strictly,
)

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / ".tools" / "bin" / "helm"
CHART = REPO / "deploy" / "helm" / "kafka-throttle-proxy"
MANIFESTS = REPO / "examples" / "kubernetes" / "kafka-throttle-proxy.yaml"
RELEASE, NAMESPACE = "kafka-throttle-proxy", "kafka"  # what the manifest is written for
# Labels and annotations only Helm's objects carry: which release, chart and version made them, and the pod's
# checksum of proxy.yaml (an upgrade that changes it rolls the pods).
HELM_ONLY = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "helm.sh/resource-policy",
    "checksum/config",
}

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="scripts/setup --test builds helm into .tools/bin")


def _helm(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # Helm's own state (repositories, cache, plugins) in a fresh directory: nothing of the user's, no network.
    home = {f"HELM_{d}_HOME": str(tmp_path / f"helm-{d.lower()}") for d in ("CACHE", "CONFIG", "DATA")}
    env = {**os.environ, **home, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, env=env, timeout=120)


def _set_args(values: dict[str, Any]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def _render(values: dict[str, Any], tmp_path: Path, chart: Path = CHART, *more: str) -> list[Doc]:
    # For the Kubernetes release the objects are validated against (helm's default is its own client-go's).
    done = _helm(
        "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--kube-version", KUBERNETES,
        *_set_args(values), *more, tmp_path=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


DEFAULT: dict[str, Any] = {}
FLEET_OF_THREE = {"replicaCount": 3}
SIX_BROKERS = {"brokers.nodeIds": [1, 2, 3, 11, 12, 13]}  # not the default 0-5: ids as a cluster numbers them
ONE_REPLICA = {"replicaCount": 1}
TLS = {
    "upstream.tls": {"enabled": True, "existingSecret": "kafka-cluster-ca", "caKey": "ca.crt"},
    "listen.tls": {"enabled": True, "existingSecret": "proxy-tls", "clientAuth": "required"},
    "fleet.existingSecret": "ktp-fleet",
    "metrics.serviceMonitor.enabled": True,
}
VALUE_SETS = {
    "default": DEFAULT,
    "fleet-of-three": FLEET_OF_THREE,
    "six-brokers": SIX_BROKERS,
    "one-replica": ONE_REPLICA,
    "tls": TLS,
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_is_clean(values, tmp_path):
    done = _helm("lint", "--strict", str(CHART), *_set_args(values), tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid_kubernetes_and_agrees_with_the_proxy(values, tmp_path):
    rendered = _render(values, tmp_path)
    validate_strictly(d for d in rendered if d["kind"] != "ServiceMonitor")  # a CRD: not in the API's schemas
    docs = by_kind(rendered)
    config, files = load_proxy_config(docs, tmp_path)
    check_pod_agrees(docs, config, files)
    assert config.listen.advertised_host == f"{RELEASE}.{NAMESPACE}.svc.cluster.local"
    assert docs["Deployment"]["spec"]["replicas"] == values.get("replicaCount", 2)
    node_ids = values.get("brokers.nodeIds", [0, 1, 2, 3, 4, 5])
    ports = {p["name"]: p["port"] for p in docs["Service"]["spec"]["ports"]}
    assert ports == {"bootstrap": 19092, **{f"broker-{n}": 19093 + n for n in node_ids}, "metrics": 9404}
    # 5 s unready + 20 s grace + a 10-s margin, as the manifest has it
    assert docs["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 35

    if values is ONE_REPLICA:  # one proxy: no fleet, no secret, and a quota still one bucket across the cluster
        assert config.quotas.scope == "cluster" and config.fleet.name is None
        assert "Secret" not in docs and files.keys() == set()
    else:
        assert config.quotas.scope == "fleet" and config.fleet.name == f"{NAMESPACE}.{RELEASE}"
        assert config.fleet.secret() is not None and len(config.fleet.secret() or b"") >= 32
    if values is TLS:
        assert "Secret" not in docs  # the fleet's secret is the existing one
        assert files.keys() == {
            "fleet.secret_file",
            "upstream.tls.ca_file",
            "listen.tls.cert_file",
            "listen.tls.key_file",
            "listen.tls.ca_file",
        }
        assert config.listen.tls is not None and config.listen.tls.client_auth == "required"
        pod = docs["Deployment"]["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets == {"fleet": "ktp-fleet", "upstream-tls": "kafka-cluster-ca", "listen-tls": "proxy-tls"}
        monitor = docs["ServiceMonitor"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= docs["Service"]["metadata"]["labels"].items()
        assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]


def test_the_generated_fleet_secret_is_32_random_bytes_new_at_each_rendering(tmp_path):
    # helm template sees no cluster; an upgrade takes the installed Secret back instead (templates/secret.yaml)
    secrets = [by_kind(_render(FLEET_OF_THREE, tmp_path))["Secret"]["data"]["secret"] for _ in range(2)]
    assert secrets[0] != secrets[1]
    assert all(len(base64.b64decode(base64.b64decode(s))) == 32 for s in secrets)


def _without_helm_only(node: Any) -> Any:
    if isinstance(node, dict):
        kept = {k: _without_helm_only(v) for k, v in node.items() if k not in HELM_ONLY}
        return {k: v for k, v in kept.items() if not (k == "annotations" and v == {})}
    if isinstance(node, list):
        return [_without_helm_only(v) for v in node]
    return node


def _comparable(doc: Doc) -> Doc:
    doc = _without_helm_only(doc)
    if doc["kind"] == "ConfigMap":  # the same settings, whatever the comments and the order
        doc["data"] = {name: yaml.safe_load(text) for name, text in doc["data"].items()}
    if doc["kind"] == "Secret":  # the manifest's is a placeholder to replace, the chart's is generated
        doc["data"] = sorted({**doc.pop("stringData", {}), **doc.get("data", {})})
    return doc


def test_the_plain_manifest_is_the_charts_default_rendering(tmp_path):
    chart = by_kind(_comparable(d) for d in _render(DEFAULT, tmp_path))
    manifest = by_kind(_comparable(d) for d in yaml.safe_load_all(MANIFESTS.read_text()))
    assert chart.keys() == manifest.keys()
    for kind in manifest:
        assert chart[kind] == manifest[kind], kind


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "three"}, "at '/replicaCount': got string, want integer"),
        ({"brokers.nodeIds": ["zero"]}, "at '/brokers/nodeIds/0': got string, want integer"),
        ({"upstream.bootstrapServers": "kafka:9092"}, "at '/upstream/bootstrapServers': got string, want array"),
        ({"drain.shutdownGraceMs": 2.5}, "at '/drain/shutdownGraceMs': got number, want integer"),
        ({"quotas": "none"}, "at '/quotas': got string, want object"),
        ({"replicas": 3}, "at '': additional properties 'replicas' not allowed"),  # a typo would otherwise do nothing
    ],
    ids=["replicaCount", "nodeIds", "bootstrapServers", "shutdownGraceMs", "quotas", "unknown-key"],
)
def test_a_wrong_value_is_refused_by_the_schema_naming_it(values, message, tmp_path):
    done = _helm("template", RELEASE, str(CHART), *_set_args(values), tmp_path=tmp_path)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema(s)" in done.stderr, done.stderr
    assert f"- {message}" in done.stderr, done.stderr


def test_a_node_id_past_the_broker_port_range_is_refused(tmp_path):
    done = _helm("template", RELEASE, str(CHART), *_set_args({"brokers.nodeIds": [0, 100]}), tmp_path=tmp_path)
    assert done.returncode != 0
    assert "brokers.nodeIds: node id 100 needs port 19193, past listen.brokerPorts.last 19192" in done.stderr


def _notes(values: dict[str, Any], tmp_path: Path) -> str:
    """NOTES.txt as install prints it. Helm renders it only on install, which needs a cluster; so a copy of the
    chart renders it through ``tpl``, with the same helpers and values, into an object helm template prints."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "notes.txt")
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}}\n'
    )
    (rendered,) = _render(values, tmp_path, chart, "--show-only", "templates/notes.yaml")
    return str(rendered["data"]["notes"])


@pytest.mark.parametrize("values", [DEFAULT, ONE_REPLICA], ids=["default", "one-replica"])
def test_the_notes_give_the_bootstrap_address_and_how_to_read_readiness_and_quotas(values, tmp_path):
    notes = _notes(values, tmp_path)
    assert f"    bootstrap.servers={RELEASE}.{NAMESPACE}.svc.cluster.local:19092\n" in notes
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in notes
    assert f"kubectl -n {NAMESPACE} port-forward deployment/{RELEASE} 9404" in notes
    assert "curl -s localhost:9404/readyz" in notes and "ktp_<group>_quota_limit" in notes
    assert ("lease_limit" in notes) == (values is not ONE_REPLICA)  # a lease exists only in a fleet
