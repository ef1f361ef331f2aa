"""Decision-log events to a Kafka topic, from the decision log's writer thread.

Why a topic besides files: a fleet's members run on several hosts; files are per host, a topic is one place
every member writes to and the Spark job reads from (``python -m spark_analysis kafka://host:port/topic``,
through Spark's own Kafka connector). One JSON object per record, the same object a ``jsonl`` file line holds;
the key is the member's id, so each member's events stay in order within a partition.

The writer thread must never block on the cluster: kafka-python's producer sends on its own thread, and at most
:data:`MAX_OUTSTANDING` events wait for the cluster's answer; beyond that they are dropped and counted, never
waited for and never piled up in memory.
The topic is created on first use when missing (Kafka's defaults for partitions and replication), and the
producer is not used before it knows the topic's partitions: with ``max_block_ms=0`` a send before that raises at
once, so the first batch after every opening was lost whole (:data:`METADATA_WAIT_S`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from quotas.decision_events import SCHEMA_VERSION

if TYPE_CHECKING:
    from kafka import KafkaProducer

log = logging.getLogger(__name__)

#: Events handed to the producer and not yet answered, at most: what the proxy holds for an unreachable cluster.
MAX_OUTSTANDING = 50_000

#: How long opening the sink waits, on the writer thread, for the producer to learn the topic's partitions. It
#: waits there once per opening, beside the admin client's own bootstrap wait; events meanwhile wait in the
#: writer's bounded queue. A topic whose leaders are not elected by then costs what arrives before they are.
METADATA_WAIT_S = 15.0


class TopicSink:
    def __init__(
        self, topic: str, bootstrap_servers: Sequence[str], instance: str, client: Mapping[str, Any] | None = None
    ) -> None:
        self.topic = topic
        self.servers = list(bootstrap_servers)
        self.instance = instance
        self.client = dict(client or {})
        self.sent = 0
        self.failed = 0
        self._producer: KafkaProducer | None = None
        self._outstanding = 0
        self._lock = threading.Lock()
        self._next_try = 0.0
        self._key = instance.encode()
        self._dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode

    def _ready(self) -> KafkaProducer | None:
        """The producer, made on first use (and again after a failure, at most every 10 s); None until then."""
        if self._producer is not None:
            return self._producer
        if time.monotonic() < self._next_try:
            return None
        self._next_try = time.monotonic() + 10.0
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(
            bootstrap_servers=self.servers, client_id=f"ktp-decisions-{self.instance}", **self.client
        )
        try:
            if self.topic not in admin.list_topics():
                with contextlib.suppress(TopicAlreadyExistsError):  # another member made it meanwhile
                    admin.create_topics([NewTopic(self.topic, -1, -1)])  # the cluster's defaults
        finally:
            admin.close()
        self._producer = KafkaProducer(
            bootstrap_servers=self.servers,
            client_id=f"ktp-decisions-{self.instance}",
            acks=1,
            linger_ms=50,
            compression_type="gzip",
            max_block_ms=0,
            **self.client,
        )
        self._await_partitions(self._producer)
        log.info("decision log: also writing to topic %s", self.topic)
        return self._producer

    def _await_partitions(self, producer: KafkaProducer) -> None:
        """Until ``producer`` knows the topic's partitions, at most :data:`METADATA_WAIT_S`. ``partitions_for``
        with ``max_block_ms=0`` never waits: it asks for the topic's metadata and raises until it is there."""
        from kafka.errors import KafkaTimeoutError

        deadline = time.monotonic() + METADATA_WAIT_S
        while True:
            try:
                producer.partitions_for(self.topic)
                return
            except KafkaTimeoutError:
                if time.monotonic() >= deadline:
                    log.warning(
                        "decision log: topic %s has no partitions known after %.0f s; events sent before it has "
                        "are lost",
                        self.topic,
                        METADATA_WAIT_S,
                    )
                    return
                time.sleep(0.05)

    def send(self, batch: Sequence[Mapping[str, Any]], first_seq: int) -> int:
        """Hand ``batch`` to the producer; returns how many could not be (counted in ``failed``). Raises only
        when the producer cannot be made (the caller counts and logs that)."""
        producer = self._ready()
        if producer is None:
            self.failed += len(batch)
            return len(batch)
        lost = 0
        for i, e in enumerate(batch):
            if self._outstanding >= MAX_OUTSTANDING:  # the cluster is not keeping up: drop, never hold memory
                lost += 1
                continue
            if "seq" not in e or "proxy" not in e or "schema" not in e:
                e = {"schema": SCHEMA_VERSION, "proxy": self.instance, "seq": first_seq + i, **e}
            try:
                future = producer.send(self.topic, self._dumps(e).encode(), key=self._key)
            except Exception:  # noqa: BLE001 - a closed producer, an oversized event: lost, counted
                lost += 1
                continue
            with self._lock:
                self._outstanding += 1
            future.add_both(self._settled)
        self.sent += len(batch) - lost
        self.failed += lost
        return lost

    def _settled(self, result: object) -> None:
        """On kafka-python's I/O thread, once the cluster answered (or gave up on) one event."""
        with self._lock:
            self._outstanding -= 1
        if isinstance(result, BaseException):
            self.failed += 1
            self.sent -= 1

    def close(self, timeout: float = 10.0) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(timeout)
            finally:
                self._producer.close(timeout)
