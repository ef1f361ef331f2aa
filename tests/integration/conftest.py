"""Session fixtures: one real 3-broker KRaft cluster, and proxies in front of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import KafkaCluster
from tests.support import ProxyProcess


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("kafka")
    c = KafkaCluster(3, workdir=workdir, server_props={"auto.create.topics.enable": "true"})
    c.start(timeout=180)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def proxy(cluster, tmp_path_factory):
    """A proxy in front of the cluster's PLAINTEXT listener, shared by the session's tests."""
    p = ProxyProcess(tmp_path_factory.mktemp("proxy"), cluster.bootstrap).start()
    yield p
    p.terminate()
    if os.environ.get("KTP_SHOW_PROXY_LOG"):
        print(p.log())


@pytest.fixture(scope="session")
def sasl_proxy(cluster, tmp_path_factory):
    """A proxy in front of the cluster's SASL_PLAINTEXT listener: SASL passes through untouched."""
    p = ProxyProcess(tmp_path_factory.mktemp("sasl-proxy"), cluster.sasl_bootstrap, name="sasl-proxy").start()
    yield p
    p.terminate()


@pytest.fixture
def fresh_proxy(cluster, tmp_path: Path):
    """A proxy of the test's own, for tests that stop or break it."""
    procs: list[ProxyProcess] = []

    def make(sasl: bool = False, fd_limit: int | None = None, **extra) -> ProxyProcess:
        """``extra``: dotted config keys, e.g. ``**{"quotas.enforce": False}``; ``sasl``: front the SASL listener;
        ``fd_limit``: the proxy's open-file limit (else it inherits this process's)."""
        upstream = cluster.sasl_bootstrap if sasl else cluster.bootstrap
        p = ProxyProcess(tmp_path, upstream, extra, name=f"proxy{len(procs)}", fd_limit=fd_limit).start()
        procs.append(p)
        return p

    yield make
    for p in procs:
        if p.alive():
            p.process.kill()
            p.process.wait()


def broker_ports(cluster) -> set[int]:
    return {b.port for b in cluster.brokers} | {b.sasl_port for b in cluster.brokers}
