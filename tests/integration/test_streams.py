"""Kafka Streams with ``processing.guarantee=exactly_once_v2`` through the proxy: a word count
(``tests/harness/java/StreamsApp.java``) produces, through the proxy, exactly the output it produces straight
against the cluster — also when its JVM is killed in the middle of the run and started again.

The app's record cache is off, so its committed output is a pure function of the input: for each word the
counts 1..n in order. The reference is the same app run directly against the cluster; both runs must also
equal the counts computed here from the input. Output is read ``read_committed`` straight from the cluster (the
oracle is not the system under test); the Streams JVM is watched so it never connects to a broker port.
Through the proxy go: the app's admin client creating the repartition and changelog topics, the consumer
group, the EOS producer's transactions and, after the kill, the changelog restore.
"""

from __future__ import annotations

import random
import struct
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import streams_app as sa
from tests.integration.conftest import broker_ports
from tests.support import ConnectionWatcher

pytestmark = pytest.mark.cluster

PARTITIONS = 3
LINES = 3000
WORDS_PER_LINE = 5
VOCABULARY = [f"w{i:02d}" for i in range(40)]
RECORD_DELAY_MS = 2  # the killed run: ~6 s of splitting lines...
COUNT_DELAY_MS = 1  # ...and >= 15 s of writing counts, so the kill at the first committed output lands mid-run
Output = dict[str, list[int]]


def _create(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, PARTITIONS, 3) for t in topics]).values():
        f.result(30)


@pytest.fixture(scope="module")
def corpus(cluster) -> tuple[str, int, Output]:
    """The input topic (written straight to the cluster: setup, not under test), its total word count and the
    output the word count must commit: word -> [1, 2, ..., n]."""
    topic = f"wc-lines-{uuid.uuid4().hex[:6]}"
    _create(cluster.bootstrap, topic)
    rng = random.Random(17)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20})
    words: Counter[str] = Counter()
    try:
        for i in range(LINES):
            line = [rng.choice(VOCABULARY) for _ in range(WORDS_PER_LINE)]
            words.update(line)
            p.produce(topic, value=" ".join(line).upper(), key=str(i), partition=i % PARTITIONS)
        assert p.flush(60) == 0
    finally:
        p.close()  # no connection to a broker port may outlive this (later tests watch this process)
    return topic, sum(words.values()), {w: list(range(1, n + 1)) for w, n in words.items()}


class OutputReader:
    """Reads an output topic ``read_committed`` from the beginning, straight from the cluster. A context manager:
    its connections to broker ports must not outlive the test (later tests watch this process's connections)."""

    def __init__(self, cluster, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": f"check-{topic}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.out: Output = {}
        self.count = 0
        self.at_end: set[int] = set()  # partitions whose last event was "end of partition" (the last stable offset)

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in self.consumer.consume(500, 0.2):
                err, partition = m.error(), m.partition()
                if err:
                    if err.code() == KafkaError._PARTITION_EOF:
                        assert partition is not None  # an end of partition names it
                        self.at_end.add(partition)
                    continue
                key, value = m.key(), m.value()
                assert partition is not None and key is not None and value is not None  # the app's records
                self.at_end.discard(partition)
                self.out.setdefault(key.decode(), []).append(struct.unpack(">q", value)[0])
                self.count += 1

    def until(self, count: int, timeout: float, run: sa.StreamsRun) -> None:
        deadline = time.monotonic() + timeout
        while self.count < count:
            assert time.monotonic() < deadline, f"{self.count} of {count} output records after {timeout} s"
            assert run.probe.running(), f"the Streams app died: {run.rows}\n{''.join(run.probe._err)[-3000:]}"
            self.poll(0.5)

    def to_end(self, timeout: float = 30) -> Output:
        """Everything committed, once the app has closed: read on until every partition is at its end and
        nothing more came for 2 s (the app's last commit may still be on its way)."""
        deadline = time.monotonic() + timeout
        while True:
            before = self.count
            self.poll(2)
            if self.count == before and len(self.at_end) == PARTITIONS:
                break
            assert time.monotonic() < deadline, "output partitions never reached their end"
        return self.out

    def __enter__(self) -> OutputReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()


def _committed_lines(cluster, group: str, topic: str) -> int:
    """Input records whose offsets the app committed (in its transactions), read from the cluster."""
    # read_uncommitted: OffsetFetch without require_stable, so a killed instance's open transaction (its pending
    # offsets) does not make the broker answer UNSTABLE_OFFSET_COMMIT until that transaction times out
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "isolation.level": "read_uncommitted"})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 30)
    finally:
        c.close()
    return sum(max(t.offset, 0) for t in tps)


def _run_to_completion(cluster, bootstrap: str, corpus, tmp_path, name: str) -> tuple[Output, set[int], float]:
    """One Streams run over the whole input: (its committed output, the remote ports it used, seconds)."""
    topic, total, _ = corpus
    app_id, out = f"wc-{name}-{uuid.uuid4().hex[:6]}", f"wc-out-{name}-{uuid.uuid4().hex[:6]}"
    _create(cluster.bootstrap, out)
    with OutputReader(cluster, out) as reader:
        t0 = time.monotonic()
        run = sa.start(
            bootstrap,
            application_id=app_id,
            input=topic,
            output=out,
            state_dir=tmp_path / app_id,
            props={"group.instance.id": f"{app_id}-1"},
        )
        try:
            with ConnectionWatcher([run.pid], interval=0.1) as w:
                reader.until(total, 150, run)
                res = run.stop()
        finally:
            run.kill()
        took = time.monotonic() - t0
        assert "RUNNING" in [r.get("state") for r in res]
        return reader.to_end(), w.remote_ports, took


@pytest.fixture(scope="module")
def reference(cluster, corpus, tmp_path_factory) -> Output:
    """The same app run straight against the cluster."""
    output, _, took = _run_to_completion(cluster, cluster.bootstrap, corpus, tmp_path_factory.mktemp("ref"), "direct")
    print(f"\ndirect run: {took:.1f} s")
    return output


def test_exactly_once_word_count_through_the_proxy_equals_the_direct_run(cluster, proxy, corpus, reference, tmp_path):
    _, total, expected = corpus
    assert reference == expected, "the direct run itself is not the exact word count"
    output, ports, took = _run_to_completion(cluster, proxy.bootstrap, corpus, tmp_path, "proxy")
    print(f"\nthrough the proxy: {took:.1f} s, {total} output records")
    leaked = ports & broker_ports(cluster)
    assert not leaked, f"the Streams app connected to broker ports {leaked}"
    assert ports & proxy.listening_ports()
    assert output == reference


def test_killed_and_restarted_mid_run_through_the_proxy_still_equals_the_direct_run(
    cluster, proxy, corpus, reference, tmp_path
):
    """SIGKILL the Streams JVM once part of its output is committed, start it again with
    the same application id and state directory: the restarted instance fences the dead one's open transaction
    (same transactional id), restores its store from the changelog (exactly-once wipes a crashed task's local
    state) and finishes the input; the committed output is still exactly the direct run's."""
    topic, total, _ = corpus
    app_id, out = f"wc-kill-{uuid.uuid4().hex[:6]}", f"wc-out-kill-{uuid.uuid4().hex[:6]}"
    _create(cluster.bootstrap, out)
    # Small fetches: otherwise the consumer hands Streams the whole input before any repartitioned record, and
    # no output would be committed before the input is done.
    kwargs = {
        "application_id": app_id,
        "input": topic,
        "output": out,
        "state_dir": tmp_path / app_id,
        "props": {"group.instance.id": f"{app_id}-1", "max.poll.records": 50, "max.partition.fetch.bytes": 4096},
    }
    with OutputReader(cluster, out) as reader:
        first = sa.start(
            proxy.bootstrap, record_delay_ms=RECORD_DELAY_MS, count_delay_ms=COUNT_DELAY_MS, write_cds=False, **kwargs
        )
        try:
            with ConnectionWatcher([first.pid], interval=0.1) as w:
                deadline = time.monotonic() + 120
                while reader.count == 0:  # the first committed output: the count stage is under way
                    assert time.monotonic() < deadline and first.probe.running(), (reader.count, first.rows)
                    reader.poll(0.1)
        finally:
            first.kill()
        at_kill = _committed_lines(cluster, app_id, topic)
        reader.poll(1)
        output_at_kill = reader.count  # the dead instance's open transaction holds back what it wrote after that
        # The input stage may have finished (it once did, under load, before the first output commit); what makes
        # the kill mid-run is the count stage: it still had output to write, and its store to restore.
        assert 0 < at_kill <= LINES, f"{at_kill} of {LINES} input lines committed at the kill"
        assert 0 < output_at_kill < total, f"the kill was not mid-run: {output_at_kill} of {total} output records"

        t0 = time.monotonic()
        second = sa.start(proxy.bootstrap, **kwargs)
        try:
            with ConnectionWatcher([second.pid], interval=0.1) as w2:
                reader.until(total, 150, second)
                res = second.stop()
        finally:
            second.kill()
        print(
            f"\nkilled after {at_kill}/{LINES} input lines ({output_at_kill}/{total} outputs) were committed; "
            f"the restart restored {sum(r['records'] for r in res if 'restored' in r)} changelog records and "
            f"finished in {time.monotonic() - t0:.1f} s"
        )
        assert "RUNNING" in [r.get("state") for r in res]
        restored = sum(r["records"] for r in res if "restored" in r)
        assert restored > 0, "the restarted instance restored nothing from the changelog"
        leaked = (w.remote_ports | w2.remote_ports) & broker_ports(cluster)
        assert not leaked, f"the Streams app connected to broker ports {leaked}"
        assert reader.to_end() == reference
