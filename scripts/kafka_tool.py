"""``scripts/kafka-tool NAME [ARGS...]``: run one of Apache Kafka's own CLI tools (``bin/kafka-NAME.sh``).

Why: the documented way to manage the proxy's quotas is Kafka's own ``kafka-configs.sh --bootstrap-server
<proxy>``, but a machine running the proxy rarely has a Kafka distribution, and Apache's download site may be out
of reach. The test harness already fetches Kafka's jars from Maven Central into a cache and knows which main class
each tool has in which release (:mod:`tests.harness.kafka_dist`); this runs a tool on that classpath, fetching it
on first use. NAME is the script's name with or without ``kafka-`` and ``.sh``: ``configs``, ``kafka-topics``,
``kafka-console-producer.sh``. The tool replaces this process (stdin, signals and the exit code are the tool's),
in the caller's directory, so relative paths in its arguments (``--command-config admin.properties``) work.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.harness.cluster import _LOG4J_TOOLS, PERF_TOOL_JVM_OPTS, TOOL_JVM_OPTS
from tests.harness.kafka_dist import cache_root, ensure_kafka

#: bin/kafka-NAME.sh -> a ``MAIN_CANDIDATES`` key (where the class moved between releases) or the main class.
TOOLS: dict[str, str] = {
    "acls": "org.apache.kafka.tools.AclCommand",
    "broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "client-metrics": "org.apache.kafka.tools.ClientMetricsCommand",
    "cluster": "org.apache.kafka.tools.ClusterTool",
    "configs": "configs",
    "console-consumer": "console_consumer",
    "console-producer": "console_producer",
    "console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "consumer-perf-test": "consumer_perf",
    "delegation-tokens": "org.apache.kafka.tools.DelegationTokenCommand",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "e2e-latency": "org.apache.kafka.tools.EndToEndLatency",
    "features": "org.apache.kafka.tools.FeatureCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "groups": "org.apache.kafka.tools.GroupsCommand",
    "leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "producer-perf-test": "producer_perf",
    "reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "replica-verification": "org.apache.kafka.tools.ReplicaVerificationTool",
    "share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "streams-groups": "org.apache.kafka.tools.streams.StreamsGroupCommand",
    "topics": "topics",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
}
USAGE = "usage: scripts/kafka-tool NAME [ARGS...]   (NAME as in Kafka's bin/kafka-NAME.sh, e.g. configs, topics)"


def tool_name(arg: str) -> str:
    """``kafka-configs.sh``, ``bin/kafka-configs.sh``, ``kafka-configs``, ``configs`` -> ``configs``."""
    name = Path(arg).name.removesuffix(".sh").removeprefix("kafka-")
    return name.replace("_", "-")


def _known() -> str:
    return ", ".join(TOOLS)


def _log4j_config() -> Path:
    """Kafka's tools log WARN and above to stderr (as ``bin/``'s ``tools-log4j2.yaml`` does): stdout stays the
    tool's answer, scriptable. Written once into the cache, beside the jars."""
    path = cache_root() / "tools-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J_TOOLS:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(_LOG4J_TOOLS)
        os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(f"{USAGE}; known tools: {_known()}", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(f"{USAGE}\nknown tools: {_known()}")
        return 0
    name = tool_name(argv[0])
    if name not in TOOLS:
        print(f"kafka-tool: unknown tool {argv[0]!r}; known tools: {_known()}", file=sys.stderr)
        return 2
    try:
        dist = ensure_kafka(
            tools_only=True, progress=lambda what: print(f"kafka-tool: {what}", file=sys.stderr, flush=True)
        )
    except (RuntimeError, OSError) as exc:  # no java, no mvn, or Maven failed (its output is in the message)
        print(f"kafka-tool: cannot fetch Kafka's jars: {exc}", file=sys.stderr)
        return 1
    main_class = dist.main_class(TOOLS[name])
    jvm_opts = PERF_TOOL_JVM_OPTS if main_class.endswith("Performance") else TOOL_JVM_OPTS
    if heap := os.environ.get("KAFKA_HEAP_OPTS"):  # as bin/kafka-run-class.sh: replaces the default heap
        jvm_opts = tuple(o for o in jvm_opts if not o.startswith("-Xm")) + tuple(heap.split())
    cmd = dist.java(
        main_class, *argv[1:], jvm_opts=jvm_opts, sys_props={"log4j2.configurationFile": str(_log4j_config())}
    )
    try:
        os.execv(cmd[0], cmd)
    except OSError as exc:
        print(f"kafka-tool: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
