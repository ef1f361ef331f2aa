"""Test harness: a real Apache Kafka (fetched from Maven Central) run as a local KRaft cluster.

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
