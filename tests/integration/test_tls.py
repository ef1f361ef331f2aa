"""TLS through the proxy, against the real cluster.

* mTLS towards clients: confluent-kafka (librdkafka) produces and consumes over TLS with a client certificate;
  the certificate's subject, mapped by Kafka-style ``ssl.principal.mapping.rules``, is the principal quotas
  are charged to (a ``<user> alice`` controller_mutation_rate quota rejects alice's third topic, and the
  metrics carry ``user="alice"``); a client without a certificate is refused when ``client_auth: required``.
* TLS towards the cluster: the test cluster has no SSL listener, so two proxies are chained —
  client → proxy B (plaintext listener, upstream TLS with its own client certificate) → proxy A (TLS
  terminating, certificate required) → cluster — and a client produces and consumes through both.
"""

from __future__ import annotations

import time
import urllib.request
import uuid

import pytest
from kafka.admin import KafkaAdminClient

from tests.harness import free_port
from tests.unit.test_tls import make_pki

THROTTLING_QUOTA_EXCEEDED = 89
RULES = "RULE:^CN=(.*?),OU=eng,O=acme$/$1/L,DEFAULT"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(
        tmp_path_factory.mktemp("pki"),
        {
            "alice": "/O=acme/OU=eng/CN=Alice",  # → "alice" by RULES (lower-cased)
            "proxy-b": "/O=acme/OU=proxies/CN=proxy-b",  # → DEFAULT: the whole DN
        },
    )


def _tls_listener(pki, client_auth: str = "required") -> dict:
    return {
        "listen.tls.cert_file": str(pki["server.pem"]),
        "listen.tls.key_file": str(pki["server.key"]),
        "listen.tls.ca_file": str(pki["ca"]),
        "listen.tls.client_auth": client_auth,
        "listen.tls.principal_mapping_rules": RULES,
    }


def _ssl_conf(pki, who: str | None = "alice") -> dict:
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(pki["ca"])}
    if who:
        conf |= {"ssl.certificate.location": str(pki[f"{who}.pem"]), "ssl.key.location": str(pki[f"{who}.key"])}
    return conf


def _round_trip(bootstrap: str, conf: dict, n: int = 50) -> None:
    """Produce ``n`` records with confluent-kafka and read them back in a consumer group."""
    from confluent_kafka import Consumer, Producer

    topic = f"tls-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **conf})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(60) == 0, "records left unsent"
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest", **conf}
    )
    consumer.subscribe([topic])
    got: list[bytes | None] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < n and time.monotonic() < deadline:
            got.extend(m.value() for m in consumer.consume(100, 1.0) if not m.error())
    finally:
        consumer.close()
    assert got == [f"v{i}".encode() for i in range(n)]


def test_mtls_client_principal_is_the_mapped_certificate_name(fresh_proxy, pki):
    metrics_port = free_port()
    # alice: B = 2 samples × 1 s × 10/s = 20 partitions, so the third topic of 15 is met below zero.
    proxy = fresh_proxy(
        **_tls_listener(pki),
        **{
            "metrics.port": metrics_port,
            "quotas.controller_window_num": 2,
            "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"controller_mutation_rate": 10}}],
        },
    )
    _round_trip(proxy.bootstrap, _ssl_conf(pki))

    admin = KafkaAdminClient(
        bootstrap_servers=proxy.bootstrap,
        security_protocol="SSL",
        ssl_cafile=str(pki["ca"]),
        ssl_certfile=str(pki["alice.pem"]),
        ssl_keyfile=str(pki["alice.key"]),
        client_id="alice-admin",
    )
    try:
        names = [f"tls-alice-{uuid.uuid4().hex[:6]}" for _ in range(3)]
        resp = admin.create_topics(
            {n: {"num_partitions": 15, "replication_factor": 1} for n in names}, raise_errors=False
        )
    finally:
        admin.close()
    codes = [t[1] if isinstance(t, tuple) else t["error_code"] for t in resp["topics"]]
    assert codes == [0, 0, THROTTLING_QUOTA_EXCEEDED], resp

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    quota_lines = [ln for ln in text.splitlines() if ln.startswith("ktp_controllermutation_tokens{")]
    assert quota_lines and all('user="alice"' in ln for ln in quota_lines), quota_lines
    assert "ANONYMOUS" not in "\n".join(ln for ln in text.splitlines() if ln.startswith("ktp_controllermutation"))


def test_client_without_certificate_is_refused_when_required(fresh_proxy, pki):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    proxy = fresh_proxy(**_tls_listener(pki))
    for conf in (_ssl_conf(pki, who=None), {}):  # TLS without a certificate; plaintext
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **conf})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)
    # ... while a client with a certificate gets through the same listener
    md = AdminClient({"bootstrap.servers": proxy.bootstrap, **_ssl_conf(pki)}).list_topics(timeout=30)
    assert md.brokers and all(b.port != 0 for b in md.brokers.values())
    assert proxy.alive()


def test_tls_towards_the_cluster_via_a_chained_proxy(fresh_proxy, pki):
    a = fresh_proxy(**_tls_listener(pki))
    b = fresh_proxy(
        **{
            "upstream.bootstrap_servers": a.bootstrap,
            "upstream.tls.ca_file": str(pki["ca"]),
            "upstream.tls.cert_file": str(pki["proxy-b.pem"]),
            "upstream.tls.key_file": str(pki["proxy-b.key"]),
            "upstream.tls.check_hostname": True,
        }
    )
    _round_trip(b.bootstrap, {})  # plaintext to B; B speaks TLS to A; A plaintext to the cluster
    assert a.alive() and b.alive()
    assert "cannot reach broker" not in b.log()


def test_sasl_principal_wins_over_the_certificate(cluster, fresh_proxy, pki):
    """SASL_SSL, as Kafka does it: the certificate (alice's, whose user has a tight quota) is verified, but the
    principal is the SASL one (bob, no quota), so none of bob's topics is refused."""
    proxy = fresh_proxy(
        sasl=True,
        **_tls_listener(pki, client_auth="requested"),
        **{
            "quotas.controller_window_num": 2,
            "quotas.entities": [{"entity": {"user": "alice"}, "quotas": {"controller_mutation_rate": 10}}],
        },
    )
    admin = KafkaAdminClient(
        bootstrap_servers=proxy.bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=str(pki["ca"]),
        ssl_certfile=str(pki["alice.pem"]),
        ssl_keyfile=str(pki["alice.key"]),
        sasl_mechanism="PLAIN",
        sasl_plain_username="bob",
        sasl_plain_password=cluster.users["bob"],
    )
    try:
        names = [f"tls-bob-{uuid.uuid4().hex[:6]}" for _ in range(3)]
        resp = admin.create_topics(
            {n: {"num_partitions": 15, "replication_factor": 1} for n in names}, raise_errors=False
        )
    finally:
        admin.close()
    codes = [t[1] if isinstance(t, tuple) else t["error_code"] for t in resp["topics"]]
    assert codes == [0, 0, 0], resp
