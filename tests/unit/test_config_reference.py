"""docs/configuration.md is generated from the configuration model (config/reference.py): it must be current."""

from __future__ import annotations

from config.model import ProxyConfig
from config.reference import PAGE, render


def test_the_committed_configuration_page_is_the_models():
    assert PAGE.read_text() == render(), "docs/configuration.md is stale: run python -m config.reference --write"


def test_every_setting_is_on_the_page():
    page = render()
    for section, field in ProxyConfig.model_fields.items():
        sub = getattr(field.annotation, "model_fields", None)
        for name in sub or {section: None}:
            dotted = f"{section}.{name}" if sub else section
            assert f"`{dotted}`" in page, dotted


def test_the_fields_of_optional_sections_are_named_too():
    page = render()
    for dotted in (
        "upstream.tls.ca_file",
        "upstream.tls.check_hostname",
        "listen.tls.client_auth",
        "listen.tls.principal_mapping_rules",
        "listen.tls.key_file",
    ):
        assert f"`{dotted}`" in page, dotted
