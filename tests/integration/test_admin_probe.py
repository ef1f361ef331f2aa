"""The harness's AdminProbe (an unmodified Java Admin client) against the real cluster, no proxy.

Two clients:
  * new: kafka-clients 4.4.0 (the broker release).
  * old: kafka-clients 2.6.3, the newest release before KIP-599.  Its highest request
    versions, read from ``common/message/*Request.json`` (``validVersions``) inside the jar
    and checked here on the wire (NetworkClient's DEBUG "Sending ... RequestHeader(apiKey=...,
    apiVersion=...)" log, ``log_requests=True``): CreateTopics v5, CreatePartitions v2,
    DeleteTopics v4 -- below the KIP-599 strict versions (v6 / v3 / v5), so a broker
    enforcing a controller mutation quota only delays its responses instead of returning
    THROTTLING_QUOTA_EXCEEDED.  The new client sends v7 / v3 / v6.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.harness import admin_probe as ap

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("client", ["new", "old"])
def test_topic_lifecycle(cluster, client):
    topics = [f"probe-{client}-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    kw = dict(client=client, retries=5, api_timeout_ms=60000, retry_backoff_ms=200, log_requests=True)
    res = ap.admin_probe(
        cluster,
        ap.create(topics, 2, validate_only=True),
        ap.create(topics, 2),
        ap.create_partitions(topics, 4),
        ap.describe(topics),
        **kw,
    )
    assert [(r["op"], r["topic"]) for r in res] == [
        (op, t) for op in ("create", "create", "create-partitions", "describe") for t in sorted(topics)
    ]
    # Metadata is eventually consistent: the broker answering describeTopics may not have the new partitions yet.
    described = res.by("topic", op="describe")
    deadline = time.monotonic() + 30
    while {r["partitions"] for r in described.values()} != {4} and time.monotonic() < deadline:
        described = ap.admin_probe(cluster, ap.describe(topics), client=client).by("topic")
    assert {t: r["partitions"] for t, r in described.items()} == dict.fromkeys(topics, 4)

    deleted = ap.admin_probe(cluster, ap.delete(topics), **kw)
    assert [(r["op"], r["topic"]) for r in deleted] == [("delete", t) for t in sorted(topics)]
    for r in [*res, *deleted]:
        assert r["outcome"] == "ok", r
        assert r["message"] is None
        assert 0 <= r["done_ms"] <= r["elapsed_ms"] < 60000
    assert res[0]["client_version"] == ("4.4.0/new" if client == "new" else f"{ap.OLD_CLIENTS_VERSION}/old")

    sent = res.versions() | deleted.versions()
    shown = ", ".join(f"{k} v{sorted(v)}" for k, v in sorted(sent.items()))
    print(f"\n{client} ({res[0]['client_version']}) sent: {shown}")
    for api, version in ap.REQUEST_VERSIONS[client].items():
        assert sent[api] == {version}, (api, sent)
        assert (version >= ap.STRICT_VERSIONS[api]) == (client == "new")

    # Errors come back as rows, named by the exception's simple class name.
    again = ap.admin_probe(cluster, ap.delete(topics[0]), ap.create_partitions(topics[1], 1), client=client)
    assert [r["outcome"] for r in again] == ["UnknownTopicOrPartitionException"] * 2, again
    assert all(r["message"] for r in again)


def _quotas_eventually(cluster, rows, entity, want, **kw):
    """describeClientQuotas is answered from a broker's metadata cache: re-describe until it catches up."""
    got = {r["entity"]: r["quotas"] for r in rows if r["op"] == "describe-quotas"}.get(entity)
    deadline = time.monotonic() + 30
    while got != want and time.monotonic() < deadline:
        time.sleep(0.5)
        got = ap.admin_probe(cluster, ap.describe_quotas(entity, strict=True), **kw)[0]["quotas"]
    assert got == want, entity


def test_client_quota_alter_describe(cluster):
    kw = dict(client="new", user="admin")  # over SASL_PLAINTEXT, to exercise the client properties
    try:
        res = ap.admin_probe(
            cluster,
            ap.alter_quotas("user=alice", {"consumer_byte_rate": 2048}),
            ap.alter_quotas({"user": None}, {"consumer_byte_rate": 4096}),
            ap.alter_quotas("user=alice", {"producer_byte_rate": 1e9}, validate_only=True),
            ap.alter_quotas("user=alice", {"consumer_byte_rate": 1.5}),
            ap.describe_quotas("user=alice", strict=True),
            ap.describe_quotas({"user": None}, strict=True),
            **kw,
        )
        assert [(r["op"], r["entity"], r["outcome"]) for r in res] == [
            ("alter-quotas", "user=alice", "ok"),
            ("alter-quotas", "user=<default>", "ok"),
            ("alter-quotas", "user=alice", "ok"),
            ("alter-quotas", "user=alice", "InvalidRequestException"),  # rate quotas are integers
            ("describe-quotas", "user=alice", "ok"),
            ("describe-quotas", "user=<default>", "ok"),
        ], res
        assert "fractional" in res[3]["message"]
        _quotas_eventually(cluster, res, "user=alice", {"consumer_byte_rate": 2048}, **kw)
        _quotas_eventually(cluster, res, "user=<default>", {"consumer_byte_rate": 4096}, **kw)
    finally:  # later tests in the session (e.g. byte-rate quotas as alice) must not see these
        res = ap.admin_probe(
            cluster,
            ap.alter_quotas("user=alice", remove=["consumer_byte_rate"]),
            ap.alter_quotas({"user": None}, remove=["consumer_byte_rate"]),
            **kw,
        )
    assert [r["outcome"] for r in res] == ["ok", "ok"], res
    _quotas_eventually(cluster, [], "user=alice", {}, **kw)
    _quotas_eventually(cluster, [], "user=<default>", {}, **kw)


def test_old_client_quota_and_background(cluster):
    """The 2.6 client's ClientQuota API (v0), run in the background; rows arrive as they are printed."""
    bg = ap.admin_probe_popen(
        cluster,
        ap.alter_quotas("user=bob,client-id=c1", {"producer_byte_rate": 1000}),
        ap.sleep(1500),
        ap.describe_quotas("user=bob,client-id=c1", strict=True),
        ap.alter_quotas("user=bob,client-id=c1", remove=["producer_byte_rate"]),
        client="old",
        props=cluster.client_config("bob", "PLAIN"),
        log_requests=True,
    )
    assert bg.running() or bg.proc.returncode == 0
    res = bg.result(timeout=120)
    assert [(r["op"], r["entity"], r["outcome"]) for r in res] == [
        ("alter-quotas", "user=bob,client-id=c1", "ok"),
        ("describe-quotas", "user=bob,client-id=c1", "ok"),
        ("alter-quotas", "user=bob,client-id=c1", "ok"),
    ], res
    assert res[1]["quotas"] == {"producer_byte_rate": 1000}  # 1.5 s after the alter: metadata has caught up
    assert res[1]["recv_s"] - res[0]["recv_s"] >= 1.4  # the sleep op: rows are streamed, not batched
    assert res.versions()["ALTER_CLIENT_QUOTAS"] == {0}
    assert res.versions()["DESCRIBE_CLIENT_QUOTAS"] == {0}


def test_usage_error_raises(cluster):
    with pytest.raises(ap.AdminProbeError, match="unknown op"):
        ap.admin_probe(cluster, ["--op", "frobnicate"])
