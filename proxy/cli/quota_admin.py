"""``kafka-throttle-proxy quotas describe|alter|delete``: manage the proxy's quotas without hunting for Kafka's tools.

It speaks DescribeClientQuotas / AlterClientQuotas to the proxy's bootstrap listener, as ``kafka-configs.sh
--bootstrap-server`` does, with Kafka's entity types (``--user``, ``--client-id``, ``--ip``, or kafka-configs'
``--entity-type users|clients|ips --entity-name NAME|--entity-default``) and quota keys; the output reads like
kafka-configs'. The proxy answers these requests itself and authorises them by the connection's principal:
``ANONYMOUS`` on a plain listener (without a client certificate), else the SASL user or the mapped certificate
name, which must be among ``quotas.admins`` (alter, delete) or ``quotas.describers`` (describe).

Security, as kafka-configs' ``--command-config FILE`` (a Java properties file: ``security.protocol``,
``sasl.mechanism``, ``sasl.jaas.config`` with a PlainLoginModule/ScramLoginModule ``username``/``password``, a PEM
truststore or ``ssl.ca.location``) and/or flags (``--security-protocol``, ``--sasl-mechanism``,
``--sasl-username``, ``--sasl-password``, ``--ssl-cafile``, ...), flags winning. SASL is PLAIN or SCRAM, done by
kafka-python's mechanisms on this tool's one connection: the proxy passes the exchange to the broker, which
checks the password, and the proxy takes the principal from it as for any client.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from kafka.errors import for_code
from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol.frames import frame_size

_VERSION = 1
_SASL_VERSION = 1  # SaslHandshake v1 (then SaslAuthenticate frames) and SaslAuthenticate v1: what Kafka 4 wants
_MATCH_EXACT, _MATCH_DEFAULT = 0, 1
_TYPES = (("user", "user"), ("client_id", "client-id"), ("ip", "ip"))
#: kafka-configs' --entity-type values (and the protocol's own names) -> the protocol's entity type.
_ENTITY_TYPES = {
    "users": "user",
    "user": "user",
    "clients": "client-id",
    "client-id": "client-id",
    "ips": "ip",
    "ip": "ip",
}
_MAX_FRAME = 16 * 1024 * 1024
_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 35.0
"""How long a :class:`Connection` waits for one answer (``calibrate``'s probes run longer than :data:`_TIMEOUT_S`
in all, so each answer has its own bound)."""
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class UsageError(Exception):
    """A wrong option or file: one line naming it, exit 2 (as argparse's own refusals)."""


class Refused(Exception):
    """The proxy or the broker behind it said no (authentication, authorisation): one line, exit 1."""


# ---- the command line ---------------------------------------------------------------------------------------


class _EntitySpec(argparse.Action):
    """kafka-configs' ``--entity-type T --entity-name N`` / ``--entity-default``, paired in the order given (so
    ``--entity-type users --entity-name alice --entity-type clients --entity-default`` names one entity)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        spec = list(getattr(namespace, "entity_spec", None) or [])
        spec.append((self.const, values))
        namespace.entity_spec = spec


def _connection_options(
    p: argparse.ArgumentParser, suppress: bool, target: str = "the proxy's bootstrap listener"
) -> None:
    """The options that say where and as whom to connect: accepted before the verb and after it (``suppress``:
    the verb's copies leave the namespace alone unless given, so they do not undo the ones before the verb)."""
    d: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}  # add_argument keywords
    p.add_argument(
        "--bootstrap-server",
        "--bootstrap-servers",
        dest="bootstrap_server",
        metavar="HOST:PORT",
        help=target,
        **d,
    )
    p.add_argument(
        "--command-config",
        metavar="FILE",
        help="Java client properties as for kafka-configs: security.protocol, sasl.mechanism, "
        "sasl.jaas.config, ssl.truststore.location (PEM) or ssl.ca.location, ...",
        **d,
    )
    p.add_argument(
        "--security-protocol",
        choices=PROTOCOLS,
        type=str.upper,
        help="default: from --command-config, else SASL_* when a SASL user is given and *SSL when a "
        "CA or certificate is, else PLAINTEXT",
        **d,
    )
    p.add_argument("--sasl-mechanism", choices=MECHANISMS, type=str.upper, **d)
    p.add_argument("--sasl-username", metavar="NAME", **d)
    p.add_argument(
        "--sasl-password",
        metavar="PASSWORD",
        help="visible to other local users in the process list: prefer --command-config",
        **d,
    )
    p.add_argument(
        "--ssl-cafile",
        metavar="PEM",
        help="CA certificate(s) to verify the server's certificate with (default: the system's)",
        **d,
    )
    p.add_argument(
        "--ssl-certfile",
        metavar="PEM",
        help="client certificate (mTLS; its mapped name is the principal unless SASL says otherwise)",
        **d,
    )
    p.add_argument("--ssl-keyfile", metavar="PEM", help="the client certificate's key", **d)
    p.add_argument(
        "--ssl-no-hostname-check",
        action="store_true",
        help="accept a certificate that does not name the host (Kafka: ssl.endpoint.identification.algorithm= empty)",
        **d,
    )


class _Parser(argparse.ArgumentParser):
    """A wrong option is one line (argparse's own message, naming the option) and exit 2, not a screen of usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def add_parser(sub: Any) -> None:
    q = sub.add_parser(
        "quotas",
        help="describe, alter or delete quotas through a running proxy (like kafka-configs)",
        description="Describe, alter or delete the proxy's quotas through its listener, as "
        "kafka-configs --bootstrap-server does.",
    )
    q.error = _Parser.error.__get__(q)  # the parent's parser class is not ours to choose; its refusals are
    _connection_options(q, suppress=False)
    actions = q.add_subparsers(dest="action", required=True, parser_class=_Parser, metavar="{describe,alter,delete}")
    for name, help_ in (
        ("describe", "show quotas (all when no entity is named)"),
        ("alter", "set (--add-config) or remove (--delete-config) quotas of one entity"),
        ("delete", "remove quotas of one entity: the keys named, else all of them"),
    ):
        a = actions.add_parser(name, help=help_, description=help_)
        _connection_options(a, suppress=True)
        for attr, flag in _TYPES:
            a.add_argument(
                f"--{flag}", dest=attr, metavar="NAME", help=f"the {flag} entity; '<default>' for the default {flag}"
            )
        a.add_argument(
            "--entity-type",
            action=_EntitySpec,
            const="type",
            metavar="TYPE",
            help="as kafka-configs: users, clients or ips; then --entity-name or --entity-default",
        )
        a.add_argument("--entity-name", action=_EntitySpec, const="name", metavar="NAME")
        a.add_argument("--entity-default", action=_EntitySpec, const="default", nargs=0)
        if name == "alter":
            a.add_argument(
                "--add-config", "--add", dest="add", default="", help="k=v[,k=v...], e.g. producer_byte_rate=1048576"
            )
            a.add_argument("--delete-config", "--delete", dest="delete", default="", help="k[,k...]")
        elif name == "delete":
            a.add_argument(
                "--delete-config",
                "--delete",
                dest="delete",
                default="",
                help="k[,k...]; default: every quota the entity has",
            )


def _entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(entity type, name or None for the default) of the named entity, from both spellings."""
    out: list[tuple[str, str | None]] = []
    for attr, etype in _TYPES:
        name = getattr(args, attr)
        if name is not None:
            out.append((etype, None if name == "<default>" else name))
    pending: str | None = None
    for kind, value in getattr(args, "entity_spec", None) or ():
        if kind == "type":
            if pending is not None:
                raise UsageError(f"--entity-type {pending}: no --entity-name or --entity-default follows it")
            if value not in _ENTITY_TYPES:
                raise UsageError(f"--entity-type {value!r}: quotas have the entity types users, clients and ips")
            pending = value
        elif pending is None:
            raise UsageError(f"--entity-{kind}: no --entity-type before it")
        else:
            out.append((_ENTITY_TYPES[pending], None if kind == "default" else value))
            pending = None
    if pending is not None:
        raise UsageError(f"--entity-type {pending}: no --entity-name or --entity-default follows it")
    types = [t for t, _ in out]
    if len(set(types)) != len(types):
        raise UsageError(f"the entity names {sorted({t for t in types if types.count(t) > 1})[0]} more than once")
    return out


# ---- --command-config and the security options ---------------------------------------------------------------


def read_properties(path: str) -> dict[str, str]:
    """A Java ``.properties`` file as ``java.util.Properties`` reads it (comments, ``=``/``:``/blank separators,
    backslash escapes and line continuations), so the file kafka-configs takes works unchanged."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--command-config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    props: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()  # continuation lines lose their leading blanks too
        if not logical and (not line or line[0] in "#!"):
            continue
        # An odd number of trailing backslashes continues the line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            logical += line[:-1]
            continue
        logical += line
        key, value = _split_property(logical)
        props[key] = value
        logical = ""
    if logical:
        key, value = _split_property(logical)
        props[key] = value
    return props


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _split_property(line: str) -> tuple[str, str]:
    key: list[str] = []
    i = 0
    while i < len(line) and line[i] not in "=: \t\f":
        if line[i] == "\\" and i + 1 < len(line):
            i += 1
        key.append(line[i])
        i += 1
    while i < len(line) and line[i] in " \t\f":
        i += 1
    if i < len(line) and line[i] in "=:":
        i += 1
    value = _unescape(line[i:].lstrip(" \t\f"))
    return "".join(key), value


def _unescape(s: str) -> str:
    return re.sub(
        r"\\u([0-9a-fA-F]{4})|\\(.)",
        lambda m: chr(int(m.group(1), 16)) if m.group(1) else _ESCAPES.get(m.group(2), m.group(2)),
        s,
    )


_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


def jaas_credentials(jaas: str, where: str) -> tuple[str, str, str]:
    """(login module class, username, password) of a ``sasl.jaas.config`` line for PLAIN or SCRAM."""
    module = jaas.strip().split(None, 1)[0] if jaas.strip() else ""
    if not module.endswith(("PlainLoginModule", "ScramLoginModule")):
        raise UsageError(
            f"{where}: login module {module or '(none)'!r}: this tool speaks SASL PLAIN and SCRAM "
            "(PlainLoginModule, ScramLoginModule); run Kafka's own kafka-configs "
            "(scripts/kafka-tool configs) for others"
        )
    options = {
        m.group(1): re.sub(r"\\(.)", r"\1", m.group(2)) if m.group(2) is not None else m.group(3)
        for m in _JAAS_OPTION.finditer(jaas)
    }
    for needed in ("username", "password"):
        if needed not in options:
            raise UsageError(f'{where}: no {needed}="..." in the {module.rsplit(".", 1)[-1]} line')
    return module, options["username"], options["password"]


@dataclass(frozen=True)
class Security:
    """How to reach the proxy's listener and who to be there, merged from ``--command-config`` and flags."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    cafile: str | None = None
    cadata: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password: str | None = None
    check_hostname: bool = True

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")


def _from_properties(path: str) -> dict[str, object]:
    """The settings of a kafka-configs ``--command-config`` file this tool understands, by ``Security`` field."""
    props = read_properties(path)
    out: dict[str, object] = {}
    where = f"--command-config {path}"
    if "security.protocol" in props:
        proto = props["security.protocol"].strip().upper()
        if proto not in PROTOCOLS:
            raise UsageError(f"{where}: security.protocol {proto!r}: expected one of {', '.join(PROTOCOLS)}")
        out["protocol"] = proto
    if "sasl.mechanism" in props:
        out["mechanism"] = props["sasl.mechanism"].strip().upper()
    if "sasl.jaas.config" in props:
        module, out["username"], out["password"] = jaas_credentials(
            props["sasl.jaas.config"], f"{where}: sasl.jaas.config"
        )
        if module.endswith("PlainLoginModule"):
            out.setdefault("mechanism", "PLAIN")
    for key, field in (("sasl.username", "username"), ("sasl.password", "password")):  # librdkafka's spelling
        if key in props:
            out[field] = props[key]
    truststore = _pem_store(props, where, "truststore", "ssl.truststore.type=PEM, or ssl.ca.location=ca.pem")
    if truststore is not None:
        out["cafile"] = truststore
    if "ssl.truststore.certificates" in props:
        out["cadata"] = props["ssl.truststore.certificates"]
    if "ssl.ca.location" in props:  # librdkafka's spelling wins over the truststore
        out["cafile"] = props["ssl.ca.location"].strip()
    keystore = _pem_store(props, where, "keystore", "certificate and key in one file, ssl.keystore.type=PEM")
    if keystore is not None:
        out["certfile"] = keystore
    for key, field in (
        ("ssl.certificate.location", "certfile"),
        ("ssl.key.location", "keyfile"),
        ("ssl.key.password", "key_password"),
    ):
        if key in props:
            out[field] = props[key].strip()
    if props.get("ssl.endpoint.identification.algorithm", "https").strip() == "":
        out["check_hostname"] = False
    return out


def _pem_store(props: dict[str, str], where: str, store: str, hint: str) -> str | None:
    """``ssl.<store>.location`` when it names a PEM file (None when unset): Java's JKS/PKCS12 store files are refused
    with one line naming the setting and ``hint``, the way to give the same in PEM."""
    if f"ssl.{store}.location" not in props:
        return None
    location = props[f"ssl.{store}.location"].strip()
    kind = props.get(f"ssl.{store}.type", "").strip().upper()
    if kind not in ("", "PEM") or (not kind and not _is_pem(location)):
        raise UsageError(
            f"{where}: ssl.{store}.location {location}: a {kind or 'JKS/PKCS12'} {store}; this tool reads PEM ({hint})"
        )
    return location


def _is_pem(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"-----BEGIN" in fh.read(4096)
    except OSError:
        return True  # let the TLS set-up name the missing file


def security_from(args: argparse.Namespace) -> Security:
    """The connection's security from ``--command-config`` then the flags (a flag wins over the file)."""
    settings: dict[str, object] = {}
    if getattr(args, "command_config", None):
        settings.update(_from_properties(args.command_config))
    for attr, field in (
        ("security_protocol", "protocol"),
        ("sasl_mechanism", "mechanism"),
        ("sasl_username", "username"),
        ("sasl_password", "password"),
        ("ssl_cafile", "cafile"),
        ("ssl_certfile", "certfile"),
        ("ssl_keyfile", "keyfile"),
    ):
        if getattr(args, attr, None) is not None:
            settings[field] = getattr(args, attr)
    if getattr(args, "ssl_no_hostname_check", False):
        settings["check_hostname"] = False
    if "protocol" not in settings:  # what the other settings only make sense with
        sasl = settings.get("username") is not None
        tls = any(settings.get(f) for f in ("cafile", "cadata", "certfile"))
        settings["protocol"] = f"{'SASL_' if sasl else ''}{'SSL' if tls else 'PLAINTEXT'}"
    sec = Security(**settings)  # type: ignore[arg-type]
    if sec.sasl:
        if sec.mechanism not in MECHANISMS:
            raise UsageError(
                f"{sec.protocol}: SASL mechanism {sec.mechanism or '(none given)'}: --sasl-mechanism "
                f"or sasl.mechanism must be one of {', '.join(MECHANISMS)}"
            )
        if sec.username is None or sec.password is None:
            raise UsageError(
                f"{sec.protocol} needs a username and password: --sasl-username/--sasl-password, "
                "or sasl.jaas.config in --command-config"
            )
    elif sec.username is not None:
        raise UsageError(
            f"a SASL username is given but the security protocol is {sec.protocol}: use SASL_PLAINTEXT or SASL_SSL"
        )
    if not sec.tls and (sec.cafile or sec.certfile):
        raise UsageError(
            f"a TLS CA or certificate is given but the security protocol is {sec.protocol}: use SSL or SASL_SSL"
        )
    return sec


def ssl_context(sec: Security) -> ssl.SSLContext:
    """The client side of the listener's TLS: the proxy's certificate verified (against ``cafile`` or the system's
    trust store), and the client certificate when one is given."""
    what = f"TLS CA file {sec.cafile}" if sec.cafile else "TLS CA certificates"
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=sec.cafile, cadata=sec.cadata)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = sec.check_hostname
        if sec.certfile:
            what = f"TLS client certificate {sec.certfile}" + (f" with key {sec.keyfile}" if sec.keyfile else "")
            ctx.load_cert_chain(sec.certfile, sec.keyfile, password=sec.key_password)
    except (OSError, ssl.SSLError) as exc:
        no_key = what.startswith("TLS client") and not sec.keyfile
        hint = " (no key in it? give --ssl-keyfile or ssl.key.location)" if no_key else ""
        raise UsageError(f"{what}: {getattr(exc, 'strerror', None) or exc}{hint}") from None
    return ctx


# ---- one connection to the proxy ------------------------------------------------------------------------------


class Connection:
    """One connection (to the proxy's listener, or for ``calibrate`` to a broker): TLS and SASL as ``Security`` says,
    then requests in turn, each answered within ``timeout_s``."""

    def __init__(
        self,
        host: str,
        port: int,
        sec: Security,
        client_id: str = "kafka-throttle-proxy-quotas",
        timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self.host, self.port, self.sec = host, port, sec
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._correlation = 0
        self.last_request_bytes = 0
        """The last request's size, as a broker's quotas count it (header and body, no size prefix)."""
        self.last_response_bytes = 0

    async def __aenter__(self) -> Connection:
        ctx = ssl_context(self.sec) if self.sec.tls else None
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, ssl=ctx, server_hostname=self.host if ctx else None
        )
        if self.sec.sasl:
            await self._authenticate()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    @property
    def anonymous_hint(self) -> str:
        """Why a refusal may be about who this tool is rather than what it asked: without SASL or a client
        certificate it is ``ANONYMOUS``, which the proxy's ``quotas.admins`` rarely lists."""
        if self.sec.sasl or self.sec.certfile:
            return ""
        return " (this tool is ANONYMOUS there: no SASL user, no client certificate)"

    async def ask(self, request: Any, response_cls: Any, version: int) -> Any:
        """Send one request and return its decoded response (frames bounded like every frame the proxy reads)."""
        self.send(request, version)
        return await self.receive(response_cls, version)

    def send(self, request: Any, version: int) -> None:
        """Write one request; its answer comes from :meth:`receive`, in order (a pipelining caller sends several)."""
        self._correlation += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self._correlation, client_id=self.client_id)
        frame = request.encode(header=True, framed=True)
        self.last_request_bytes = len(frame) - 4
        self.writer.write(frame)

    async def receive(self, response_cls: Any, version: int) -> Any:
        """The oldest unanswered request's decoded answer, within ``timeout_s``."""
        return await asyncio.wait_for(self._answer(response_cls, version), self.timeout_s)

    async def _answer(self, response_cls: Any, version: int) -> Any:
        await self.writer.drain()
        size = frame_size(await self.reader.readexactly(4), _MAX_FRAME)
        self.last_response_bytes = size
        return response_cls.decode(await self.reader.readexactly(size), version=version, header=True)

    async def _authenticate(self) -> None:
        """SaslHandshake then SaslAuthenticate rounds until kafka-python's mechanism is done; the broker behind
        the proxy checks the password, and a refusal is one line naming the user and the mechanism."""
        sec = self.sec
        who = f"SASL {sec.mechanism} as {sec.username!r}"
        shake = await self.ask(SaslHandshakeRequest(mechanism=sec.mechanism), SaslHandshakeResponse, _SASL_VERSION)
        if shake.error_code:
            offered = ", ".join(shake.mechanisms or ()) or "none"
            raise Refused(
                f"{who}: the listener refused the mechanism ({for_code(shake.error_code).message}; it offers {offered})"
            )
        # No security_protocol passed: the mechanisms would log a warning about clear text on every run.
        mechanism = get_sasl_mechanism(sec.mechanism)(
            sasl_mechanism=sec.mechanism,
            host=self.host,
            sasl_plain_username=sec.username,
            sasl_plain_password=sec.password,
        )
        while not mechanism.is_done():
            resp = await self.ask(
                SaslAuthenticateRequest(auth_bytes=mechanism.auth_bytes()), SaslAuthenticateResponse, _SASL_VERSION
            )
            if resp.error_code:
                raise Refused(f"{who}: {resp.error_message or for_code(resp.error_code).message}")
            try:
                mechanism.receive(resp.auth_bytes)
            except ValueError as exc:  # SCRAM: the server's proof or nonce is wrong
                raise Refused(f"{who}: the server's answer does not verify ({exc})") from None
        if not mechanism.is_authenticated():
            raise Refused(f"{who}: the exchange ended without authenticating")


# ---- the verbs ---------------------------------------------------------------------------------------------


def _shown(entity: Any) -> str:
    """An entity as kafka-configs writes it (``user-principal 'alice', the default client-id``)."""
    return _shown_pairs([(e.entity_type, e.entity_name) for e in entity])


def _shown_pairs(entity: list[tuple[str, str | None]]) -> str:
    parts = []
    for etype, name in entity:
        kind = "user-principal" if etype == "user" else etype
        parts.append(f"the default {kind}" if name is None else f"{kind} '{name}'")
    return ", ".join(parts)


def _error(code: int, message: str | None) -> str:
    name = for_code(code).message
    return f"{name} ({code}): {message}" if message else f"{name} ({code})"


async def _describe_entries(conn: Connection, named: list[tuple[str, str | None]]) -> Any:
    C = DescribeClientQuotasRequest.ComponentData
    # No entity named: no filter component and not strict, which matches every entity.
    components = [C(entity_type=t, match_type=_MATCH_DEFAULT if n is None else _MATCH_EXACT, match=n) for t, n in named]
    req = DescribeClientQuotasRequest(components=components, strict=bool(named))
    resp = await conn.ask(req, DescribeClientQuotasResponse, _VERSION)
    if resp.error_code:
        raise Refused(f"describe refused: {_error(resp.error_code, resp.error_message)}{conn.anonymous_hint}")
    return resp.entries or []


async def _describe(conn: Connection, args: argparse.Namespace) -> int:
    named = _entity(args)
    entries = await _describe_entries(conn, named)
    for entry in entries:
        values = ", ".join(f"{v.key}={v.value}" for v in entry.values)
        print(f"Quota configs for {_shown(entry.entity)} are {values}")
    if not entries:  # silence would read as a tool that did nothing
        print(f"No quota configs for {_shown_pairs(named)}" if named else "No quota configs are set")
    return 0


def _keys(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


async def _send_alter(conn: Connection, entity: list[tuple[str, str | None]], ops: list[Any]) -> int:
    E = AlterClientQuotasRequest.EntryData
    req = AlterClientQuotasRequest(
        entries=[E(entity=[E.EntityData(entity_type=t, entity_name=n) for t, n in entity], ops=ops)],
        validate_only=False,
    )
    resp = await conn.ask(req, AlterClientQuotasResponse, _VERSION)
    for entry in resp.entries:  # one entry: the entity named
        if entry.error_code:
            raise Refused(
                f"{_shown(entry.entity)}: {_error(entry.error_code, entry.error_message)}{conn.anonymous_hint}"
            )
        print(f"Completed updating config for {_shown(entry.entity)}.")
    return 0


def _named_entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    entity = _entity(args)
    if not entity:
        raise UsageError(
            "name the entity (--user, --client-id and/or --ip, or --entity-type with --entity-name/--entity-default)"
        )
    return entity


def _alter_ops(args: argparse.Namespace) -> list[Any]:
    """The AlterClientQuotas ops of ``alter``, checked before any connection is made."""
    op = AlterClientQuotasRequest.EntryData.OpData
    ops = []
    for item in _keys(args.add):
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--add-config: {item!r} is not key=value")
        try:
            ops.append(op(key=key.strip(), value=float(value), remove=False))
        except ValueError:
            raise UsageError(f"--add-config: {key.strip()}: {value!r} is not a number") from None
    ops += [op(key=k, value=0.0, remove=True) for k in _keys(args.delete)]
    if not ops:
        raise UsageError("nothing to do: give --add-config and/or --delete-config")
    return ops


async def _alter(conn: Connection, args: argparse.Namespace) -> int:
    return await _send_alter(conn, _named_entity(args), _alter_ops(args))


async def _delete(conn: Connection, args: argparse.Namespace) -> int:
    """Kafka's ``--alter --delete-config``, and without keys every quota the entity has (read first, so the
    operator need not list them)."""
    entity = _named_entity(args)
    keys = _keys(args.delete)
    if not keys:
        entries = await _describe_entries(conn, entity)
        keys = sorted({v.key for entry in entries for v in entry.values})
        if not keys:
            print(f"No quota configs for {_shown_pairs(entity)}: nothing to delete.")
            return 0
    op = AlterClientQuotasRequest.EntryData.OpData
    return await _send_alter(conn, entity, [op(key=k, value=0.0, remove=True) for k in keys])


_VERBS = {"describe": _describe, "alter": _alter, "delete": _delete}


def _address(bootstrap: str | None, what: str = "the proxy's bootstrap listener") -> tuple[str, int]:
    if not bootstrap:
        raise UsageError(f"--bootstrap-server HOST:PORT is required ({what})")
    first = bootstrap.split(",")[0].strip()  # kafka-configs takes a list; the proxy's bootstrap is one address
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--bootstrap-server {bootstrap!r}: expected host:port")
    return host.strip("[]"), int(port)


async def _run(host: str, port: int, sec: Security, args: argparse.Namespace) -> int:
    async with Connection(host, port, sec) as conn:
        return await _VERBS[args.action](conn, args)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when done, 1 when refused or unreachable, 2 for a wrong option; always one line on stderr."""
    prog = f"kafka-throttle-proxy quotas {args.action}"
    sec: Security | None = None
    try:
        host, port = _address(getattr(args, "bootstrap_server", None))
        sec = security_from(args)
        # A wrong entity or config is found before connecting.
        if args.action == "describe":
            _entity(args)
        else:
            _named_entity(args)
        if args.action == "alter":
            _alter_ops(args)
        if sec.tls:
            ssl_context(sec)  # unreadable files, too
        return asyncio.run(asyncio.wait_for(_run(host, port, sec, args), _TIMEOUT_S))
    except STOPS as exc:
        return stopped(prog, args.bootstrap_server, exc, sec, _TIMEOUT_S)


STOPS = (UsageError, Refused, KeyboardInterrupt, asyncio.IncompleteReadError, OSError)
"""What ends a cluster tool (this one, ``calibrate``) with one line on stderr instead of a traceback
(:func:`stopped`); TimeoutError and ConnectionResetError are OSErrors."""


def stopped(prog: str, server: str | None, exc: BaseException, sec: Security | None, timeout_s: float) -> int:
    """The one stderr line and the exit status for what ended a cluster tool: 2 for a wrong option, 130 when
    interrupted, 1 for what the cluster, or the way to it, did (``timeout_s``: how long it waited for an answer)."""
    if isinstance(exc, UsageError):
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, KeyboardInterrupt):
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    protocol = sec.protocol if sec is not None else "PLAINTEXT"
    if isinstance(exc, Refused):
        why = str(exc)
    elif isinstance(exc, TimeoutError):
        why = f"no answer within {timeout_s:.0f} s (is it a Kafka listener, and is its security protocol {protocol}?)"
    elif isinstance(exc, (asyncio.IncompleteReadError, ConnectionResetError)):
        why = (
            f"the connection was closed before an answer (this tool used {protocol}: does the listener expect "
            "another security protocol, or a client certificate?)"
        )
    else:  # refused, unreachable, TLS verification
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    print(f"{prog}: {server}: {why}", file=sys.stderr)
    return 1
