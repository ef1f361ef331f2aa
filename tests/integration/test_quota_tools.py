"""Quota tools an operator reaches for, against the real cluster: ``scripts/kafka-tool configs`` (Kafka's own
kafka-configs on the harness's jars, run as the real script) and ``kafka-throttle-proxy quotas`` over SASL (SCRAM,
PLAIN) and SASL_SSL, with Kafka's ``--command-config`` file or flags; non-admins are refused with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.unit.test_tls import make_pki

REPO = Path(__file__).resolve().parents[2]
KAFKA_TOOL = REPO / "scripts" / "kafka-tool"


def _kafka_tool(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(KAFKA_TOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
    )


def _quotas(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "quotas", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _scram(cluster, user: str, password: str | None = None) -> list[str]:
    return [
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--sasl-username",
        user,
        "--sasl-password",
        cluster.users[user] if password is None else password,
    ]


def test_kafka_tool_configs_alters_through_the_proxy_and_quotas_describe_reads_it(cluster, fresh_proxy, tmp_path):
    proxy = fresh_proxy(sasl=True, **{"quotas.admins": ["admin"]})
    # The operator's own directory and a relative --command-config: the tool runs where it is called from.
    (tmp_path / "admin.properties").write_text(cluster.java_client_props("admin").read_text())
    (tmp_path / "bob.properties").write_text(cluster.java_client_props("bob").read_text())
    user = f"carol-{uuid.uuid4().hex[:6]}"
    entity = ("--entity-type", "users", "--entity-name", user)
    r = _kafka_tool(
        tmp_path,
        "configs",
        "--bootstrap-server",
        proxy.bootstrap,
        "--command-config",
        "admin.properties",
        "--alter",
        "--add-config",
        "producer_byte_rate=4096,request_percentage=25",
        *entity,
    )
    assert r.returncode == 0, r.stderr
    assert f"Completed updating config for user {user}." in r.stdout, r.stdout
    shown = _quotas(
        tmp_path,
        "describe",
        "--bootstrap-server",
        proxy.bootstrap,
        "--command-config",
        "admin.properties",
        "--user",
        user,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"Quota configs for user-principal '{user}' are " in shown.stdout
    assert "producer_byte_rate=4096.0" in shown.stdout and "request_percentage=25.0" in shown.stdout, shown.stdout
    # The script's exit code is the tool's: Kafka's kafka-configs fails for a non-admin, and so does the script.
    denied = _kafka_tool(
        tmp_path,
        "kafka-configs.sh",
        "--bootstrap-server",
        proxy.bootstrap,
        "--command-config",
        "bob.properties",
        "--alter",
        "--add-config",
        "producer_byte_rate=1",
        *entity,
    )
    assert denied.returncode != 0 and "ClusterAuthorization" in denied.stdout + denied.stderr, denied
    assert (
        "producer_byte_rate=4096.0"
        in _quotas(
            tmp_path,
            "describe",
            "--bootstrap-server",
            proxy.bootstrap,
            "--command-config",
            "admin.properties",
            "--entity-type",
            "users",
            "--entity-name",
            user,
        ).stdout
    )
    # The cluster itself never saw the quota: the proxy answered.
    direct = _kafka_tool(
        tmp_path, "configs", "--bootstrap-server", cluster.bootstrap.split(",")[0], "--describe", *entity
    )
    assert direct.returncode == 0 and "producer_byte_rate" not in direct.stdout, direct


def test_quotas_alter_describe_delete_over_scram_and_non_admins_are_refused(cluster, fresh_proxy, tmp_path):
    proxy = fresh_proxy(sasl=True, **{"quotas.admins": ["admin"]})
    bs = ("--bootstrap-server", proxy.bootstrap)
    admin = _scram(cluster, "admin")
    done = _quotas(
        tmp_path,
        *bs,
        *admin,
        "alter",
        "--user",
        "alice",
        "--client-id",
        "<default>",
        "--add-config",
        "producer_byte_rate=1024,consumer_byte_rate=2048",
    )
    assert done.returncode == 0, done.stderr
    assert "Completed updating config for user-principal 'alice', the default client-id." in done.stdout, done.stdout

    def shown(*creds: str) -> str:
        r = _quotas(tmp_path, *bs, *creds, "describe", "--user", "alice", "--client-id", "<default>")
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "consumer_byte_rate=2048.0, producer_byte_rate=1024.0" in shown(*admin)

    # bob authenticates (the broker accepts his password) but is no admin: one line naming why, exit 1.
    refused = _quotas(
        tmp_path, *bs, *_scram(cluster, "bob"), "alter", "--user", "alice", "--add-config", "producer_byte_rate=1"
    )
    assert refused.returncode == 1, refused
    line = _one_line(refused)
    assert "CLUSTER_AUTHORIZATION_FAILED" in line and "bob" in line, line
    peek = _quotas(tmp_path, *bs, *_scram(cluster, "bob"), "describe")  # describers default to the admins
    assert peek.returncode == 1 and "1024" not in peek.stdout and "CLUSTER_AUTHORIZATION_FAILED" in _one_line(peek)
    wrong = _quotas(tmp_path, *bs, *_scram(cluster, "admin", "not-the-password"), "describe")
    assert wrong.returncode == 1 and "SASL SCRAM-SHA-512 as 'admin'" in _one_line(wrong), wrong
    assert "producer_byte_rate=1024.0" in shown(*admin)  # nothing changed

    # delete one key (Kafka's --delete-config), then everything the entity has; PLAIN from a --command-config.
    plain = ["--command-config", str(cluster.java_client_props("admin", mechanism="PLAIN"))]
    one = _quotas(
        tmp_path,
        *bs,
        *plain,
        "delete",
        "--user",
        "alice",
        "--client-id",
        "<default>",
        "--delete-config",
        "producer_byte_rate",
    )
    assert one.returncode == 0, one.stderr
    left = shown(*plain)
    assert "consumer_byte_rate=2048.0" in left and "producer_byte_rate" not in left, left
    also = _quotas(
        tmp_path,
        *bs,
        *admin,
        "alter",
        "--entity-type",
        "users",
        "--entity-name",
        "alice",
        "--entity-type",
        "clients",
        "--entity-default",
        "--delete-config",
        "consumer_byte_rate",
        "--add-config",
        "request_percentage=50",
    )
    assert also.returncode == 0, also.stderr
    assert "request_percentage=50.0" in shown(*admin) and "consumer_byte_rate" not in shown(*admin)
    gone = _quotas(tmp_path, *bs, *admin, "delete", "--user", "alice", "--client-id", "<default>")
    assert gone.returncode == 0 and "Completed updating config" in gone.stdout, gone
    assert shown(*admin).strip() == "No quota configs for user-principal 'alice', the default client-id"
    again = _quotas(tmp_path, *bs, *admin, "delete", "--user", "alice", "--client-id", "<default>")
    assert again.returncode == 0 and "nothing to delete" in again.stdout, again


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), {})


def test_quotas_and_kafka_configs_over_sasl_ssl_with_one_command_config(cluster, fresh_proxy, tmp_path, pki):
    """The same admin.properties (SASL_SSL, a PEM truststore, a SCRAM JAAS line) serves Kafka's kafka-configs
    and ``kafka-throttle-proxy quotas``."""
    proxy = fresh_proxy(
        sasl=True,
        **{
            "quotas.admins": ["admin"],
            "listen.tls.cert_file": str(pki["server.pem"]),
            "listen.tls.key_file": str(pki["server.key"]),
        },
    )
    props = tmp_path / "admin.properties"
    props.write_text(
        "\n".join(
            [
                "security.protocol=SASL_SSL",
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={pki['ca']}",
                "sasl.mechanism=SCRAM-SHA-512",
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\",
                f'    username="admin" password="{cluster.users["admin"]}";',
            ]
        )
        + "\n"
    )
    bs = ("--bootstrap-server", proxy.bootstrap, "--command-config", str(props))
    user = f"dave-{uuid.uuid4().hex[:6]}"
    r = _kafka_tool(
        tmp_path,
        "configs",
        *bs,
        "--alter",
        "--add-config",
        "consumer_byte_rate=8192",
        "--entity-type",
        "users",
        "--entity-name",
        user,
    )
    assert r.returncode == 0, r.stderr
    assert "consumer_byte_rate=8192.0" in _quotas(tmp_path, "describe", *bs, "--user", user).stdout
    done = _quotas(tmp_path, "alter", *bs, "--user", user, "--add-config", "producer_byte_rate=16384")
    assert done.returncode == 0, done.stderr
    out = _kafka_tool(tmp_path, "configs", *bs, "--describe", "--entity-type", "users", "--entity-name", user)
    assert "producer_byte_rate=16384.0" in out.stdout and "consumer_byte_rate=8192.0" in out.stdout, out
    assert _quotas(tmp_path, "delete", *bs, "--user", user).returncode == 0
    described = _quotas(tmp_path, "describe", *bs, "--user", user).stdout.strip()
    assert described == f"No quota configs for user-principal '{user}'"  # said, not silence
    # Flags instead of the file, and a CA that did not sign the proxy's certificate: one line, exit 1.
    flags = ["--bootstrap-server", proxy.bootstrap, "--security-protocol", "SASL_SSL", *_scram(cluster, "admin")]
    assert _quotas(tmp_path, *flags, "--ssl-cafile", str(pki["ca"]), "describe").returncode == 0
    untrusted = _quotas(tmp_path, *flags, "--ssl-cafile", str(pki["server.pem"]), "describe")
    assert untrusted.returncode == 1 and "certificate verify failed" in _one_line(untrusted), untrusted
    # Plain text to a TLS listener: refused, in one line.
    plain = _quotas(tmp_path, "--bootstrap-server", proxy.bootstrap, *_scram(cluster, "admin"), "describe")
    assert plain.returncode == 1 and proxy.bootstrap in _one_line(plain), plain


@pytest.mark.parametrize(
    "args, says",
    [
        (["describe"], "--bootstrap-server HOST:PORT is required"),
        (["--bootstrap-server", "127.0.0.1", "describe"], "expected host:port"),
        (
            ["--bootstrap-server", "127.0.0.1:9", "describe", "--entity-type", "topics", "--entity-name", "t"],
            "--entity-type 'topics'",
        ),
        (["--bootstrap-server", "127.0.0.1:9", "describe", "--entity-type", "users"], "no --entity-name"),
        (
            ["--bootstrap-server", "127.0.0.1:9", "alter", "--user", "a", "--add-config", "producer_byte_rate"],
            "is not key=value",
        ),
        (["--bootstrap-server", "127.0.0.1:9", "alter", "--user", "a"], "nothing to do"),
        (["--bootstrap-server", "127.0.0.1:9", "delete"], "name the entity"),
        (
            ["--bootstrap-server", "127.0.0.1:9", "--sasl-username", "a", "--sasl-password", "b", "describe"],
            "SASL mechanism (none given)",
        ),
        (
            [
                "--bootstrap-server",
                "127.0.0.1:9",
                "--security-protocol",
                "PLAINTEXT",
                "--sasl-username",
                "a",
                "describe",
            ],
            "security protocol is PLAINTEXT",
        ),
        (["--bootstrap-server", "127.0.0.1:9", "--sasl-mechanism", "GSSAPI", "describe"], "invalid choice: 'GSSAPI'"),
        (
            ["--bootstrap-server", "127.0.0.1:9", "describe", "--command-config", "missing.properties"],
            "--command-config missing.properties: No such file",
        ),
    ],
)
def test_a_wrong_quotas_option_is_one_line_and_exit_2(tmp_path, args, says):
    r = _quotas(tmp_path, *args)
    assert r.returncode == 2 and says in _one_line(r), r


@pytest.mark.parametrize(
    "lines, says",
    [
        (
            [
                "security.protocol=SASL_PLAINTEXT",
                "sasl.mechanism=SCRAM-SHA-512",
                'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="a";',
            ],
            'no password="..." in the ScramLoginModule line',
        ),
        (
            [
                "security.protocol=SASL_PLAINTEXT",
                "sasl.mechanism=GSSAPI",
                "sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;",
            ],
            "Krb5LoginModule",
        ),
        (
            ["security.protocol=SSL", "ssl.truststore.location=/etc/truststore.jks", "ssl.truststore.type=JKS"],
            "this tool reads PEM",
        ),
        (["security.protocol=SASL_LAINTEXT"], "security.protocol 'SASL_LAINTEXT'"),
    ],
)
def test_a_wrong_command_config_names_the_setting(tmp_path, lines, says):
    (tmp_path / "c.properties").write_text("# kafka-configs style\n" + "\n".join(lines) + "\n")
    r = _quotas(tmp_path, "--bootstrap-server", "127.0.0.1:9", "--command-config", "c.properties", "describe")
    assert r.returncode == 2 and says in _one_line(r), r
