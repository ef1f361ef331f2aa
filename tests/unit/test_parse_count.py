"""A request is read once (issue 49): one Produce through the session and the policy, with every quota kind that
charges a Produce, fair share and the protected-topic guard on, decodes each of its fields once.

Counted in a child interpreter that loads the project from its source: compiled (the usual test run), a module
calls another's function natively, past any wrapper a test could put on it. The child wraps each reader of a
Produce's fields wherever a module holds it, sends one Produce through ``Session.receive`` and
``Policy.on_request``, and prints how often each reader ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import importlib.machinery, json, sys
REPO = sys.argv[1]
sys.path.insert(0, REPO)
OURS = {"config", "mute", "protocol", "proxy", "quotas"}


class SourceOnly:
    # The project's modules from their .py files, never the compiled .so beside them.
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in OURS:
            return None
        for entry in path or [REPO]:
            spec = importlib.machinery.FileFinder(
                entry, (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)
            ).find_spec(name)
            if spec is not None:
                return spec
        return None


sys.meta_path.insert(0, SourceOnly())

from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

import protocol.headers, protocol.inflight, protocol.record_batches, protocol.topic_guard
from config.model import ProxyConfig
from protocol.principal import ConnectionIdentity
from protocol.session import Session
from proxy.rules.policy import Policy
from proxy.wire.responses import TopicIds
from proxy.stats import Stats, Traffic

assert not any(m.__file__.endswith(".so") for n, m in list(sys.modules.items())
               if n.split(".")[0] in OURS and getattr(m, "__file__", None))

READERS = {
    "header": (protocol.headers, "_parse_request_header"),
    "acks": (protocol.inflight, "produce_acks_and_timeout"),  # with the timeout that follows it
    "topics": (protocol.record_batches, "produce_topics_head"),
    "producer ids": (protocol.record_batches, "producer_ids_and_shape"),
    "producer id (memo)": (protocol.record_batches, "single_producer_id"),
    "record spans": (protocol.record_batches, "_record_spans"),
    "guard walk": (protocol.topic_guard, "_outside_records"),
}
counts = {field: 0 for field in READERS}


def counted(field, fn):
    def wrapper(*a, **k):
        counts[field] += 1
        return fn(*a, **k)
    return wrapper


for field, (module, name) in READERS.items():
    original = getattr(module, name)
    wrapped = counted(field, original)
    for m in list(sys.modules.values()):  # wherever a module imported it by name
        if (getattr(m, "__name__", "") or "").split(".")[0] in OURS and getattr(m, name, None) is original:
            setattr(m, name, wrapped)

quotas = {"producer_byte_rate": 10_000_000, "request_percentage": 1000, "producer_ids_rate": 100}
config = ProxyConfig.model_validate({
    "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
    "decision_log": {"topic": "__ktp_decisions"},
    "quotas": {"entities": [{"entity": {"user": "alice"}, "quotas": quotas}]},
})
topics = TopicIds()
topics.learn_replication({"t": 3})


class Mute:
    def hold(self): pass
    def served(self, seconds): pass
    def mute_for(self, seconds): pass


class Conn:
    id, peer, label, client_id = "1", "127.0.0.1:1", "broker 1", "app"
    identity = type("I", (), {"principal": "alice"})()
    upstream_addr = ("127.0.0.1", 9092)
    mute = Mute()
    traffic = Traffic()
    policy_state = None

    async def ask(self, api_key, api_version, body):
        raise AssertionError("no cluster lookup")


def produce(value_bytes):
    b = MemoryRecordsBuilder(2, 0, 1 << 20, producer_id=7, producer_epoch=0, base_sequence=0)
    b.append(0, b"k", b"v" * value_bytes)
    b.close()
    TD = ProduceRequest.TopicProduceData
    part = TD.PartitionProduceData(index=0, records=b.buffer())
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=1000, version=7,
                         topic_data=[TD(name="t", partition_data=[part])])
    req.with_header(correlation_id=1, client_id="app")
    return bytes(req.encode(header=True, framed=True))


results = {}
# A usual Produce (the connection hands it on as bytes), and a large one (a view into the read buffer: the guard
# searches it outside its records, so the record fields' spans are read for the guard and the producer-id charge).
for name, frame in (("bytes", produce(200)), ("view", memoryview(bytearray(produce(200_000))))):
    for field in counts:
        counts[field] = 0
    policy = Policy(config, Stats(), clock=lambda: 1000.0, wall_clock=lambda: 0.0, topics=topics)
    assert policy.guard is not None and policy.fair is not None
    session = Session(ConnectionIdentity(), {})
    request = session.receive(frame, 1000.0)
    verdict = policy.on_request(Conn(), request, 1000.0)
    decision = getattr(verdict, "decision", verdict)
    charged = sorted(getattr(decision, "values", None) or {})
    results[name] = {"counts": dict(counts), "verdict": type(verdict).__name__, "charged": charged}
print(json.dumps(results))
"""


def test_one_produce_decodes_each_field_once():
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for frame_kind, out in results.items():
        counts = out["counts"]
        # Every quota kind that charges a Produce charged this one: the readers below ran for a reason.
        assert out["charged"] == ["producer_byte_rate", "producer_ids_rate", "request_percentage"], (frame_kind, out)
        assert counts["header"] == 1, (frame_kind, counts)
        assert counts["acks"] == 1, (frame_kind, counts)  # the session's: the request quota reads Request.acks
        assert counts["topics"] == 1, (frame_kind, counts)  # the replication factor's lookup, kept for the next one
        assert counts["producer ids"] == 1, (frame_kind, counts)  # the first of a connection: a walk, shape kept
        assert counts["producer id (memo)"] == 0, (frame_kind, counts)
        assert counts["record spans"] == 1, (frame_kind, counts)  # one walk, for the charge and the guard alike
    assert results["bytes"]["counts"]["guard walk"] == 0  # names none of the proxy's topics: the byte search says so
    assert results["view"]["counts"]["guard walk"] == 1  # searched outside its records, by the request's spans
