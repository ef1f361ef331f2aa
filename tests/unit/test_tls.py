"""TLS: Kafka's ssl.principal.mapping.rules, the certificate's RFC 2253 subject, contexts and configuration.

Certificates are made at test time with the ``openssl`` CLI (``make_pki``, also used by the integration tests).
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from config.load import ConfigError, load_config
from protocol.principal import ConnectionIdentity, MappingRuleError, NoMatchingRule, PrincipalMapper, subject_dn
from protocol.sasl_identity import ANONYMOUS
from proxy.wire.tls import client_context, peer_principal, server_context

# ---- throwaway PKI --------------------------------------------------------------------------------------------

CLIENTS = {
    "alice": "/O=acme/OU=eng/CN=alice",
    "bob": "/O=acme/OU=ServiceUsers/CN=bob",
    "odd": "/C=DE/ST=Berlin/O=Acme\\, Inc./OU=a\\+b/CN= spaced #1 /emailAddress=odd@example.com",
}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path, clients: dict[str, str] = CLIENTS) -> dict[str, Path]:
    """A CA, a server certificate (CN=localhost, SAN localhost and 127.0.0.1) and one client certificate per
    entry of ``clients`` (name → openssl -subj); returns ``{name}.pem``/``{name}.key`` paths plus ``ca``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ktp-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )
    (d / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    (d / "client.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    paths = {"ca": d / "ca.pem"}
    for name, subj, ext in [
        ("server", "/CN=localhost", "server.ext"),
        *((n, s, "client.ext") for n, s in clients.items()),
    ]:
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            ext,
            cwd=d,
        )
        paths[f"{name}.pem"], paths[f"{name}.key"] = d / f"{name}.pem", d / f"{name}.key"
    return paths


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


# ---- mapping rules (Kafka's documented examples and SslPrincipalMapperTest's cases) ---------------------------


def test_default_is_the_whole_dn():
    assert PrincipalMapper("DEFAULT").name("CN=alice,OU=eng,O=acme") == "CN=alice,OU=eng,O=acme"
    assert PrincipalMapper(None).name("CN=x") == "CN=x"


def test_documented_example_rule_then_default():
    m = PrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT")
    assert m.name("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown") == "serviceuser"
    # no match → DEFAULT → the full DN
    assert (
        m.name("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown")
        == "CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown"
    )


def test_lower_and_upper_case_flags():
    dn = "CN=Duke,OU=JavaSoft,O=Sun Microsystems"
    assert PrincipalMapper("RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L").name(dn) == "duke@javasoft"
    assert PrincipalMapper("RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/U").name(dn) == "DUKE@JAVASOFT"
    assert PrincipalMapper("RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/").name(dn) == "Duke@JavaSoft"


def test_several_rules_first_match_wins_and_whitespace():
    m = PrincipalMapper("  RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/ ,\n RULE:^CN=(.*?),OU=(.*?)$/$1@$2/L , DEFAULT ")
    assert m.name("CN=svc,OU=ServiceUsers,O=x") == "svc"
    assert m.name("CN=Joe,OU=Eng") == "joe@eng"
    assert m.name("CN=Joe") == "CN=Joe"
    assert [repr(r) for r in m.rules] == [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=(.*?)$/$1@$2/L",
        "DEFAULT",
    ]


def test_pattern_must_match_the_whole_dn_and_no_rule_fails():
    m = PrincipalMapper("RULE:CN=(.*?),OU=eng/$1/")
    with pytest.raises(NoMatchingRule):
        m.name("CN=alice,OU=eng,O=acme")  # matches a prefix only (Java's matches() is a full match)
    assert m.name("CN=alice,OU=eng") == "alice"


def test_escaped_slash_comma_in_pattern_and_literal_dollar():
    m = PrincipalMapper(r"RULE:^CN=([^,]*)\/x,OU=(.*)$/$2\/$1/,DEFAULT")
    assert m.name("CN=a/x,OU=b") == "b/a"
    # a group the pattern lacks becomes literal (Kafka's escapeLiteralBackReferences); $12 → group 1 then "2"
    assert PrincipalMapper("RULE:^CN=(.*)$/$1@$3/").name("CN=z") == "z@$3"
    assert PrincipalMapper("RULE:^CN=(.*)$/$12/").name("CN=z") == "z2"
    assert PrincipalMapper("RULE:^CN=(?<n>.*)$/${n}!/").name("CN=z") == "z!"


def test_replace_all_semantics():
    # Java's matches() then replaceAll(): every match is replaced, not only the whole-DN one.
    assert PrincipalMapper("RULE:(CN=[a-z]*,?)*/X/").name("CN=a,CN=b") == "XX"


def test_empty_entries_are_ignored():
    assert PrincipalMapper("DEFAULT,,").name("CN=a") == "CN=a"


@pytest.mark.parametrize(
    "rules",
    [
        "RULE:x",
        "RULE:^CN=(.*)$/$1",
        "RULE:^CN=(.*)$/$1/Z",
        "RULE:^CN=(.*)$/$1/L/",
        "DEFAULTS",
        "garbage",
        "RULE:^CN=([$/x/",
        "RULE:^CN=.*$/$1/",
        "RULE:^CN=(.*)$/${nope}/",
        "",
        " , ",
    ],
)
def test_invalid_rules(rules):
    with pytest.raises(MappingRuleError):
        PrincipalMapper(rules)


# ---- the certificate's subject --------------------------------------------------------------------------------


def test_subject_dn_in_rfc2253_order_and_escaping(pki):
    assert subject_dn(_der(pki["alice.pem"])) == "CN=alice,OU=eng,O=acme"
    assert subject_dn(_der(pki["server.pem"])) == "CN=localhost"
    # As Java writes it: specials escaped, leading/trailing spaces escaped, emailAddress as OID=#hex of its DER.
    email_hex = (b"\x16\x0f" + b"odd@example.com").hex()
    assert subject_dn(_der(pki["odd.pem"])) == (
        f"1.2.840.113549.1.9.1=#{email_hex},CN=\\ spaced \\#1\\ ,OU=a\\+b,O=Acme\\, Inc.,ST=Berlin,C=DE"
    )


# ---- identity precedence --------------------------------------------------------------------------------------


def test_connection_identity_falls_back_to_the_certificate():
    ident = ConnectionIdentity()
    assert ident.principal == ANONYMOUS
    ident.tls_principal = "alice"
    assert ident.principal == "alice"


# ---- contexts and configuration -------------------------------------------------------------------------------


def _cfg(**extra):
    return load_config(None, {"upstream.bootstrap_servers": "k:9092", **extra})


def test_config_builds_working_contexts(pki):
    cfg = _cfg(
        **{
            "listen.tls.cert_file": str(pki["server.pem"]),
            "listen.tls.key_file": str(pki["server.key"]),
            "listen.tls.ca_file": str(pki["ca"]),
            "listen.tls.client_auth": "required",
            "listen.tls.principal_mapping_rules": "RULE:^CN=(.*?),.*$/$1/,DEFAULT",
            "upstream.tls.ca_file": str(pki["ca"]),
            "upstream.tls.cert_file": str(pki["alice.pem"]),
            "upstream.tls.key_file": str(pki["alice.key"]),
        }
    )
    server, client = server_context(cfg.listen.tls), client_context(cfg.upstream.tls)
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    # a handshake in memory: the client's certificate reaches the server, which maps it
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    cli = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for obj in (cli, srv):
            with contextlib.suppress(ssl.SSLWantReadError):
                obj.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    assert peer_principal(srv, PrincipalMapper(cfg.listen.tls.principal_mapping_rules)) == "alice"
    assert _cfg().listen.tls is None and _cfg().upstream.tls is None


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"listen.tls.cert_file": "/nope.pem", "listen.tls.key_file": "KEY"}, "listen.tls.cert_file"),
        ({"listen.tls.cert_file": "CERT"}, "listen.tls.key_file"),
        (
            {"listen.tls.cert_file": "CERT", "listen.tls.key_file": "KEY", "listen.tls.client_auth": "required"},
            "listen.tls: .*needs ca_file",
        ),
        (
            {"listen.tls.cert_file": "CERT", "listen.tls.key_file": "KEY", "listen.tls.client_auth": "maybe"},
            "listen.tls.client_auth",
        ),
        (
            {
                "listen.tls.cert_file": "CERT",
                "listen.tls.key_file": "KEY",
                "listen.tls.principal_mapping_rules": "RULE:^CN=(.*)$/$1/,bogus",
            },
            "listen.tls.principal_mapping_rules",
        ),
        ({"upstream.tls.ca_file": "/nope.pem"}, "upstream.tls.ca_file"),
        ({"upstream.tls.cert_file": "CERT"}, "upstream.tls: .*go together"),
        ({"upstream.tls.verify": False}, "upstream.tls.verify: unknown field"),
    ],
)
def test_bad_tls_config_names_the_field(pki, extra, field):
    extra = {
        k: str(pki["server.pem"]) if v == "CERT" else str(pki["server.key"]) if v == "KEY" else v
        for k, v in extra.items()
    }
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace(r"\.*", ".*")):
        _cfg(**extra)
