"""Identity and quota configuration through the proxy, against the real cluster's SASL listener.

Kafka's own ``kafka-configs.sh --bootstrap-server <proxy>`` sets and reads the proxy's quotas; only proxy
admins may alter; altered quotas survive a restart; the YAML file reloads on change and a bad reload keeps the
running quotas; SCRAM and PLAIN clients are charged as their own user; metrics carry Kafka's names and tags.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
import uuid

import yaml
from kafka.admin import KafkaAdminClient

from tests.harness import free_port
from tests.support import wait_until

THROTTLING_QUOTA_EXCEEDED = 89


def _configs(cluster, bootstrap: str, user: str, *args: str):
    props = cluster.java_client_props(user)
    return cluster.tool("configs", "--bootstrap-server", bootstrap, "--command-config", str(props), *args, timeout=120)


def _describe_alice(cluster, bootstrap: str, user: str = "admin") -> str:
    r = _configs(cluster, bootstrap, user, "--describe", "--entity-type", "users", "--entity-name", "alice")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_kafka_configs_sets_and_reads_proxy_quotas_admins_only_and_restart_keeps_them(cluster, fresh_proxy, tmp_path):
    state = tmp_path / "quota-state.json"
    settings = {"quotas.admins": ["admin"], "quotas.state_file": str(state)}
    proxy = fresh_proxy(sasl=True, **settings)
    r = _configs(
        cluster,
        proxy.bootstrap,
        "admin",
        "--alter",
        "--add-config",
        "consumer_byte_rate=1048576,controller_mutation_rate=5",
        "--entity-type",
        "users",
        "--entity-name",
        "alice",
    )
    assert r.returncode == 0, r.stderr
    out = _describe_alice(cluster, proxy.bootstrap)
    assert "consumer_byte_rate=1048576" in out and "controller_mutation_rate=5" in out
    # The proxy answered: the cluster itself has no such quota.
    assert "consumer_byte_rate" not in _describe_alice(cluster, cluster.sasl_bootstrap)

    denied = _configs(
        cluster,
        proxy.bootstrap,
        "bob",
        "--alter",
        "--add-config",
        "consumer_byte_rate=1",
        "--entity-type",
        "users",
        "--entity-name",
        "bob",
    )
    assert denied.returncode != 0
    assert "ClusterAuthorization" in denied.stdout + denied.stderr
    # Describing needs what Kafka needs (DESCRIBE_CONFIGS on the cluster): bob is no describer, and neither is
    # an unauthenticated client.
    peek = _configs(cluster, proxy.bootstrap, "bob", "--describe", "--entity-type", "users", "--entity-name", "alice")
    assert peek.returncode != 0 and "1048576" not in peek.stdout
    assert "ClusterAuthorization" in peek.stdout + peek.stderr
    bad = _configs(
        cluster,
        proxy.bootstrap,
        "admin",
        "--alter",
        "--add-config",
        "consumer_byte_rate=1.5",
        "--entity-type",
        "users",
        "--entity-name",
        "alice",
    )
    assert bad.returncode != 0  # byte rates are integral, as in Kafka

    proxy.terminate()
    again = fresh_proxy(sasl=True, **settings)
    out = _describe_alice(cluster, again.bootstrap)
    assert "consumer_byte_rate=1048576" in out and "controller_mutation_rate=5" in out
    r = _configs(
        cluster,
        again.bootstrap,
        "admin",
        "--alter",
        "--delete-config",
        "consumer_byte_rate",
        "--entity-type",
        "users",
        "--entity-name",
        "alice",
    )
    assert r.returncode == 0, r.stderr
    out = _describe_alice(cluster, again.bootstrap)
    assert "consumer_byte_rate" not in out and "controller_mutation_rate=5" in out


def test_file_reload_on_change_and_bad_reload_keeps_running_quotas(cluster, fresh_proxy):
    proxy = fresh_proxy(sasl=True, **{"quotas.describers": ["admin"]})
    doc = yaml.safe_load(proxy.config_path.read_text())
    doc["quotas"] = {
        "describers": ["admin"],
        "entities": [{"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 2048}}],
    }
    proxy.config_path.write_text(yaml.safe_dump(doc))
    wait_until(
        lambda: "producer_byte_rate=2048" in _describe_alice(cluster, proxy.bootstrap),
        30,
        what="the edited file to be reloaded",
    )
    doc["quotas"]["entities"][0]["quotas"]["producer_byte_rate"] = -1
    proxy.config_path.write_text(yaml.safe_dump(doc))
    wait_until(lambda: "reload (file changed) refused" in proxy.log(), 30, what="the bad reload to be refused")
    assert "quotas.entities.0" in proxy.log()  # the log names the field
    assert "producer_byte_rate=2048" in _describe_alice(cluster, proxy.bootstrap)


def _admin(cluster, proxy, user: str, mechanism: str) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=proxy.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username=user,
        sasl_plain_password=cluster.users[user],
        client_id=f"{user}-admin",
    )


def test_scram_and_plain_clients_get_their_own_users_quota_and_metrics_show_it(cluster, fresh_proxy):
    metrics_port = free_port()
    # alice: B = 2 × 1 s × 10 = 20 partitions; bob has no quota at all.
    proxy = fresh_proxy(
        sasl=True,
        **{
            "metrics.port": metrics_port,
            "quotas.controller_window_num": 2,
            "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"controller_mutation_rate": 10}}],
        },
    )
    for user, mechanism, expect_rejected in (("alice", "SCRAM-SHA-512", True), ("bob", "PLAIN", False)):
        admin = _admin(cluster, proxy, user, mechanism)
        try:
            names = [f"id-{user}-{uuid.uuid4().hex[:6]}" for _ in range(3)]
            resp = admin.create_topics(
                {n: {"num_partitions": 15, "replication_factor": 1} for n in names}, raise_errors=False
            )
            codes = [t[1] if isinstance(t, tuple) else t["error_code"] for t in resp["topics"]]
            if expect_rejected:
                assert codes == [0, 0, THROTTLING_QUOTA_EXCEEDED], resp
            else:
                assert codes == [0, 0, 0], resp
        finally:
            admin.close()
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert "ktp_controllermutation_tokens{" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("ktp_controllermutation_tokens{"))
    assert 'user="alice"' in line
    assert not any('user="bob"' in ln for ln in text.splitlines() if ln.startswith("ktp_controllermutation"))
    assert 'ktp_requests_total{api="CreateTopics"}' in text
    assert "ktp_connections " in text
    assert "ktp_producerids_cache_bytes " in text


def test_failed_authentication_never_yields_an_identity(cluster, fresh_proxy):
    metrics_port = free_port()
    proxy = fresh_proxy(
        sasl=True,
        **{
            "metrics.port": metrics_port,
            "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"controller_mutation_rate": 1000}}],
        },
    )
    try:
        KafkaAdminClient(
            bootstrap_servers=proxy.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="alice",
            sasl_plain_password="wrong",
            request_timeout_ms=5000,
        )
    except Exception:  # noqa: BLE001 - kafka-python gives up bootstrapping after the authentication failures
        pass
    else:
        raise AssertionError("a wrong password must fail")
    assert "SASL SCRAM-SHA-512: broker refused the authentication" in proxy.log()
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert 'user="alice"' not in text  # alice never became anyone's identity, so nothing was charged to her


def test_cluster_quotas_are_imported(cluster, fresh_proxy):
    client_id = f"imported-{uuid.uuid4().hex[:6]}"
    entity = ("--entity-type", "clients", "--entity-name", client_id)
    direct = cluster.bootstrap.split(",")[0]
    r = cluster.tool(
        "configs", "--bootstrap-server", direct, "--alter", "--add-config", "request_percentage=50", *entity
    )
    assert r.returncode == 0, r.stderr
    try:
        proxy = fresh_proxy(**{"quotas.import_interval_seconds": 1, "quotas.describers": ["ANONYMOUS"]})

        def shown() -> bool:
            out = cluster.tool("configs", "--bootstrap-server", proxy.bootstrap, "--describe", *entity).stdout
            return "request_percentage=50" in out

        wait_until(shown, 60, interval=1, what="the cluster's quota to show at the proxy")
    finally:
        cluster.tool(
            "configs", "--bootstrap-server", direct, "--alter", "--delete-config", "request_percentage", *entity
        )


def test_kafka_configs_sets_an_ip_connection_rate_that_bites(cluster, fresh_proxy):
    """KIP-612's ips entity through Kafka's own kafka-configs, as on a broker: --entity-type ips."""
    import socket

    proxy = fresh_proxy(**{"quotas.admins": ["ANONYMOUS"]})
    r = cluster.tool(
        "configs",
        "--bootstrap-server",
        proxy.bootstrap,
        "--alter",
        "--add-config",
        "connection_creation_rate=2",
        "--entity-type",
        "ips",
        "--entity-name",
        "127.0.0.1",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = cluster.tool(
        "configs",
        "--bootstrap-server",
        proxy.bootstrap,
        "--describe",
        "--entity-type",
        "ips",
        "--entity-name",
        "127.0.0.1",
        timeout=120,
    ).stdout
    assert "connection_creation_rate=2" in out
    socks = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(60)]
    served = 0
    for s in socks:
        s.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")  # ApiVersions v0
        s.settimeout(30)
        with contextlib.suppress(OSError):
            served += bool(s.recv(4))
        s.close()
    assert served < 40, served  # a burst of about 2/s × 11 s passes, the rest are closed after their throttle


def _quotas_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "quotas", "--bootstrap-server", bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_quotas_subcommand_alters_what_kafka_configs_then_reads_and_is_refused_to_non_admins(cluster, fresh_proxy):
    proxy = fresh_proxy(**{"quotas.admins": ["ANONYMOUS"]})
    done = _quotas_cli(
        proxy.bootstrap,
        "alter",
        "--user",
        "alice",
        "--client-id",
        "<default>",
        "--add",
        "producer_byte_rate=1048576,consumer_byte_rate=2097152",
    )
    assert done.returncode == 0 and "Completed updating config for user-principal 'alice'" in done.stdout, done
    # Kafka's own tool reads back what the subcommand set...
    out = cluster.tool(
        "configs",
        "--bootstrap-server",
        proxy.bootstrap,
        "--describe",
        "--entity-type",
        "users",
        "--entity-name",
        "alice",
        "--entity-type",
        "clients",
        "--entity-default",
        timeout=120,
    ).stdout
    assert "producer_byte_rate=1048576.0" in out and "consumer_byte_rate=2097152.0" in out, out
    # ...and the subcommand's describe shows it too; --delete removes one key.
    assert (
        "producer_byte_rate=1048576.0"
        in _quotas_cli(proxy.bootstrap, "describe", "--user", "alice", "--client-id", "<default>").stdout
    )
    assert (
        _quotas_cli(
            proxy.bootstrap, "alter", "--user", "alice", "--client-id", "<default>", "--delete", "producer_byte_rate"
        ).returncode
        == 0
    )
    listed = _quotas_cli(proxy.bootstrap, "describe").stdout
    assert "consumer_byte_rate=2097152.0" in listed and "producer_byte_rate" not in listed, listed
    # A proxy where ANONYMOUS is no admin refuses the alter, and the subcommand says so with a non-zero exit.
    other = fresh_proxy()
    refused = _quotas_cli(other.bootstrap, "alter", "--user", "bob", "--add", "producer_byte_rate=1")
    assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr, refused
    assert "principal ANONYMOUS may not alter quotas" in refused.stderr, refused
    bad = _quotas_cli(other.bootstrap, "alter", "--user", "bob", "--add", "producer_byte_rate")
    assert bad.returncode == 2 and "is not key=value" in bad.stderr and "Traceback" not in bad.stderr
