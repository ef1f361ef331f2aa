"""Test harness: a real Apache Kafka (fetched from Maven Central) run as a local KRaft cluster, and the helpers the
tests and the benchmarks (``bench/``, which imports them from here, never the other way round) share:

* ``measure``: what the cluster received or served, measured where the bytes land, and the arithmetic of samples;
* ``traffic``: the clients that make the load (Kafka's perf tools, librdkafka) and check what landed;
* ``process_tree``: the CPU and peak memory of a process tree;
* ``connection_rig``: a real ``proxy.wire.connection.Connection`` with stand-in sockets, and Produce frames for it;
* ``request_bodies``: a valid body of every API the proxy decodes, for the fuzzers.
* ``kube_objects``: the Kubernetes objects that run the proxy (the manifest, the Helm chart), checked alike.

Exports are resolved lazily so ``python -m tests.harness.cluster`` does not
import the module twice.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DEFAULT_KAFKA_VERSION": "kafka_dist",
    "MAIN": "kafka_dist",
    "KafkaDist": "kafka_dist",
    "ensure_kafka": "kafka_dist",
    "USERS": "cluster",
    "BrokerInfo": "cluster",
    "KafkaCluster": "cluster",
    "free_port": "cluster",
    "metadata_brokers": "cluster",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(name)
