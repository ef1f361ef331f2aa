"""TLS: SSL contexts for the client listeners and the upstream connections, and the principal of a live
handshake's client certificate (the mapping itself, sans-IO, is :mod:`protocol.principal`)."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from protocol.principal import PrincipalMapper, subject_dn

if TYPE_CHECKING:
    from config.model import ListenTlsConfig, UpstreamTlsConfig


# ---- SSL contexts -------------------------------------------------------------------------------------------

_VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def server_context(cfg: ListenTlsConfig) -> ssl.SSLContext:
    """The listeners' context: the proxy's certificate, and client certificates as ``client_auth`` says
    (Kafka's ``ssl.client.auth``: none, requested, required), verified against ``ca_file``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    if cfg.ca_file:
        ctx.load_verify_locations(cafile=cfg.ca_file)
    ctx.verify_mode = _VERIFY[cfg.client_auth]
    return ctx


def client_context(cfg: UpstreamTlsConfig) -> ssl.SSLContext:
    """The upstream context: the cluster's certificates verified against ``ca_file`` (the system's trust
    store when unset), the host name checked unless ``check_hostname`` is false, and the proxy's own
    certificate when the cluster requires one."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = cfg.check_hostname
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


def peer_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None, mapper: PrincipalMapper) -> str | None:
    """The mapped principal of the client's certificate; None when it presented none. Raises NoMatchingRule
    (or CertificateError) when Kafka would fail the authentication."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return mapper.name(subject_dn(der))
