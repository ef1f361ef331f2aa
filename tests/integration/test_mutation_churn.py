"""KIP-599 charged exactly: a create/delete churn well past the first throttle, through the proxy.

Two clients of one application churn topics: one creates four topics of two partitions, the other deletes them as
soon as they are created, round after round, as fast as their quotas let them (each its own
``controller_mutation_rate`` bucket, per client id). Both speak the strict versions (CreateTopics v7, DeleteTopics
v6) and do what Kafka's Admin does: topics rejected with THROTTLING_QUOTA_EXCEEDED are sent again once the throttle
is over. Every partition the cluster created or deleted (the per-topic answers) must be charged exactly once (the
proxy's decision log), and what got through must stay within 5 % of what the buckets allow over the run, B + R x T.

Why deletes went uncharged: the proxy counts a topic's partitions with a Metadata request on the client's broker
link, and a KRaft broker applies the controller's metadata asynchronously. The create is answered once the
controller has committed the topics; a delete right behind it met them unknown to the broker, was charged 0, and
the controller deleted them whole. The deleting client's bucket, never drained, then admitted every delete at once,
right after its create: the next one uncharged too.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest

from tests.support import KafkaWire, wait_until

pytestmark = pytest.mark.cluster

RATE = 5.0  # partitions per second for each client, as the operator's flood
SAMPLES = 11  # x 1 s: Kafka's default window, B = 55
ROUNDS = 30  # 240 partitions each way: about (240 - 55) / 5 = 37 s of throttling
TOPICS = 4
PARTITIONS = 2
CREATOR, DELETER = "churn-create", "churn-delete"
THROTTLING_QUOTA_EXCEEDED = 89
CREATE_TOPICS, DELETE_TOPICS = 19, 20


def _decisions(logdir) -> list[dict]:
    files = [p for p in logdir.rglob("*.jsonl") if not p.name.startswith(".")]
    return [json.loads(line) for p in files for line in p.read_text().splitlines() if line.strip()]


def _until_done(wire: KafkaWire, client_id: str, request_for, version: int, names: list[str]) -> list[str]:
    """Send ``request_for(names)`` until no topic is rejected for the quota, waiting out each throttle as Kafka's
    Admin does; the topics the cluster answered with success."""
    done: list[str] = []
    todo = list(names)
    while todo:
        wire.send(request_for(todo), version, client_id=client_id)
        resp = wire.recv()[1]
        results = resp.topics if hasattr(resp, "topics") else resp.responses
        errors = {r.name: r.error_code for r in results}
        assert set(errors) == set(todo), errors
        unexpected = {n: e for n, e in errors.items() if e not in (0, THROTTLING_QUOTA_EXCEEDED)}
        assert not unexpected, f"{client_id}: {unexpected}"
        done += [n for n in todo if errors[n] == 0]
        todo = [n for n in todo if errors[n] == THROTTLING_QUOTA_EXCEEDED]
        if todo:
            time.sleep(resp.throttle_time_ms / 1000)
    return done


def _create(names: list[str]) -> CreateTopicsRequest:
    return CreateTopicsRequest(
        topics=[
            CreateTopicsRequest.CreatableTopic(
                name=n, num_partitions=PARTITIONS, replication_factor=1, assignments=[], configs=[]
            )
            for n in names
        ],
        timeout_ms=30_000,
        validate_only=False,
    )


def _delete(names: list[str]) -> DeleteTopicsRequest:
    return DeleteTopicsRequest(
        topics=[DeleteTopicsRequest.DeleteTopicState(name=n, topic_id=None) for n in names], timeout_ms=30_000
    )


def test_churn_past_the_throttle_is_charged_exactly_and_held_to_the_bucket(fresh_proxy, tmp_path):
    logdir = tmp_path / "decisions"
    proxy = fresh_proxy(
        **{
            "quotas.controller_window_num": SAMPLES,
            "quotas.entities": [
                {"entity": {"client-id": c}, "quotas": {"controller_mutation_rate": RATE}} for c in (CREATOR, DELETER)
            ],
            "decision_log.directory": str(logdir),
            "decision_log.format": "jsonl",
            "decision_log.rotate_seconds": 1,
        }
    )
    creator, deleter = KafkaWire(proxy.bootstrap), KafkaWire(proxy.bootstrap)
    tag = uuid.uuid4().hex[:6]
    changed = {CREATOR: 0, DELETER: 0}
    try:
        for r in range(ROUNDS):
            names = [f"churn-{tag}-{r}-{i}" for i in range(TOPICS)]
            created = _until_done(creator, CREATOR, _create, 7, names)
            deleted = _until_done(deleter, DELETER, _delete, 6, created)
            assert deleted == created
            changed[CREATOR] += PARTITIONS * len(created)
            changed[DELETER] += PARTITIONS * len(deleted)
    finally:
        creator.close()
        deleter.close()
    assert changed[CREATOR] == changed[DELETER] == ROUNDS * TOPICS * PARTITIONS

    def mutation_events() -> list[dict]:
        return [
            e for e in _decisions(logdir) if e["event"] == "request" and e["api_key"] in (CREATE_TOPICS, DELETE_TOPICS)
        ]

    def charged_of(events: list[dict]) -> dict[str, int]:
        return {c: sum(e["mutations"] for e in events if e["client_id"] == c) for c in (CREATOR, DELETER)}

    # The log is written as the answers go out, and flushed each second; what was charged is asserted below.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: charged_of(mutation_events()) == changed, 10, what="a charge for every partition")
    events = mutation_events()
    charged = charged_of(events)
    uncounted = [
        e["topic_partitions"]
        for e in events
        if e["api_key"] == DELETE_TOPICS and e["mutations"] == 0 and e["rejected_topics"] == 0
    ]
    assert charged == changed, f"charged {charged} for {changed} changed; deletes charged nothing: {uncounted}"
    assert sum(e["throttle_ms"] > 0 for e in events if e["client_id"] == CREATOR) >= ROUNDS // 2, (
        "the churn must run well past the first throttle"
    )

    # Held to each bucket: from its first charge to its last, B + R x T at most (the last topic admitted may
    # overdraw by its partitions), and the flood, never idle for long, gets that much within 5 %.
    for client in (CREATOR, DELETER):
        stamps = [e["req_ts_ms"] for e in events if e["client_id"] == client and e["mutations"] > 0]
        span_s = (max(stamps) - min(stamps)) / 1000
        bound = RATE * SAMPLES + RATE * span_s
        ratio = changed[client] / bound
        print(
            f"{client}: {changed[client]} partitions, charged {charged[client]}, in {span_s:.1f} s against "
            f"B + R x T = {bound:.0f}: {ratio:.3f} x the bound"
        )
        assert 0.95 <= ratio <= 1.05, (client, changed[client], bound)
