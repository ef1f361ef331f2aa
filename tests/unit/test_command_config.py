"""proxy.cli.quota_admin reads Kafka's --command-config files: which TLS settings it takes, and the Java store files
it refuses with one line that says what to use instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli.quota_admin import UsageError, _from_properties

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _props(tmp_path: Path, text: str) -> str:
    path = tmp_path / "admin.properties"
    path.write_text(text)
    return str(path)


def test_pem_stores_and_librdkafka_locations_are_taken(tmp_path):
    (tmp_path / "ca.pem").write_text(PEM)
    (tmp_path / "me.pem").write_text(PEM)
    out = _from_properties(
        _props(
            tmp_path,
            f"security.protocol=SSL\nssl.truststore.location={tmp_path}/ca.pem\n"
            f"ssl.keystore.location={tmp_path}/me.pem\nssl.keystore.type=PEM\n",
        )
    )
    assert out["cafile"] == f"{tmp_path}/ca.pem" and out["certfile"] == f"{tmp_path}/me.pem"
    out = _from_properties(
        _props(
            tmp_path,
            f"ssl.truststore.location={tmp_path}/ca.pem\n"
            f"ssl.ca.location={tmp_path}/other.pem\nssl.truststore.certificates=PEMTEXT\n",
        )
    )
    assert out["cafile"] == f"{tmp_path}/other.pem" and out["cadata"] == "PEMTEXT"  # librdkafka's wins


@pytest.mark.parametrize("store, hint", [("truststore", "ssl.ca.location"), ("keystore", "certificate and key")])
def test_a_java_store_file_is_refused_naming_the_setting_and_the_way_out(tmp_path, store, hint):
    (tmp_path / "s.jks").write_bytes(b"\xfe\xed\xfe\xed")
    with pytest.raises(UsageError) as e:
        _from_properties(_props(tmp_path, f"ssl.{store}.location={tmp_path}/s.jks\n"))
    assert f"ssl.{store}.location" in str(e.value) and f"JKS/PKCS12 {store}" in str(e.value) and hint in str(e.value)
    with pytest.raises(UsageError, match=f"a PKCS12 {store}"):
        _from_properties(_props(tmp_path, f"ssl.{store}.location={tmp_path}/s.jks\nssl.{store}.type=PKCS12\n"))
