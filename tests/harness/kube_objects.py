"""Kubernetes objects that run the proxy, read as the tests read them: examples/kubernetes's hand-written manifest
(tests/unit/test_deploy_examples.py) and the Helm chart's renderings (tests/unit/test_helm_chart.py) are held to
the same checks, here.

Each object is validated against the Kubernetes API's own JSON schemas (kubernetes-validate ships them),
strictly (an unknown field fails). The ConfigMap's proxy.yaml is loaded by the proxy's own ``config.load``, with
every file it names (the fleet's secret, TLS material) stood in for by a local file; then the pod is read for
what the proxy needs of it: its probes ask /healthz and /readyz on the metrics port, the Service and the
container expose the bootstrap port and a broker port per node id at first + id, the pod's grace outlasts the
drain, and every file the configuration names is where a volume is mounted.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from config.load import load_config
from config.model import ProxyConfig

KUBERNETES = "1.30.0"  # the oldest release still in upstream support when the manifests were written
CONFIG_FILE = "/etc/kafka-throttle-proxy/proxy.yaml"  # where the image's command reads it
# The settings that name a file the pod must mount (config/model.py); load_config reads or checks each.
FILE_SETTINGS = (
    "fleet.secret_file",
    "upstream.tls.ca_file",
    "upstream.tls.cert_file",
    "upstream.tls.key_file",
    "listen.tls.cert_file",
    "listen.tls.key_file",
    "listen.tls.ca_file",
)

Doc = dict[str, Any]


def validate_strictly(docs: Iterable[Doc]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def by_kind(docs: Iterable[Doc]) -> dict[str, Doc]:
    out: dict[str, Doc] = {}
    for doc in docs:
        assert doc["kind"] not in out, f"two objects of kind {doc['kind']}"
        out[doc["kind"]] = doc
    return out


def _setting(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def _fleet_secret(docs: dict[str, Doc]) -> bytes:
    secret = docs.get("Secret")
    if secret is None:  # an existing Secret the objects only name: any secret the proxy takes stands in
        return b"stand-in for an existing Secret's 32 bytes"
    if "stringData" in secret:
        return str(secret["stringData"]["secret"]).encode()
    return base64.b64decode(secret["data"]["secret"])


def load_proxy_config(docs: dict[str, Doc], tmp_path: Path) -> tuple[ProxyConfig, dict[str, str]]:
    """The ConfigMap's proxy.yaml as the proxy loads it, and the files it names (dotted setting -> path in the pod).

    Each named file is stood in for under ``tmp_path``: the fleet's secret by the Secret's own value (so a
    secret too short for the proxy fails here), TLS material by a placeholder (loading checks only that it is a
    file)."""
    text = docs["ConfigMap"]["data"]["proxy.yaml"]
    named = {key: str(path) for key in FILE_SETTINGS if (path := _setting(yaml.safe_load(text), key)) is not None}
    overrides: dict[str, Any] = {}
    for key in named:
        local = tmp_path / key
        local.write_bytes(_fleet_secret(docs) if key == "fleet.secret_file" else b"stand-in for a mounted file\n")
        overrides[key] = str(local)
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    return load_config(path, overrides), named


def check_pod_agrees(docs: dict[str, Doc], config: ProxyConfig, files: dict[str, str]) -> None:
    """The Deployment and the Service give the proxy what its configuration says it serves and reads."""
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["run", "-c", CONFIG_FILE]
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
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()

    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = volumes[mounts[Path(CONFIG_FILE).parent.as_posix()]]
    assert config_volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    for key, path in files.items():  # every file the configuration reads is where a volume is mounted
        assert Path(path).parent.as_posix() in mounts, f"{key} {path}: no volume is mounted there"
    if "fleet.secret_file" in files and "Secret" in docs:
        volume = volumes[mounts[Path(files["fleet.secret_file"]).parent.as_posix()]]
        assert volume["secret"]["secretName"] == docs["Secret"]["metadata"]["name"]
