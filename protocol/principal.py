"""Who a connection is: the client certificate's principal, derived as Kafka derives it on an SSL listener, and
the connection's identity (SASL first, then the certificate, then ``ANONYMOUS``).

Sans-IO and shared by layers: ``config`` validates ``ssl.principal.mapping.rules`` with :class:`PrincipalMapper`
when it reads them, ``proxy.wire.tls`` applies them to a live handshake's certificate, and the policy reads a
connection's :class:`ConnectionIdentity`. Bytes and strings in, names out; no sockets.

Kafka (``DefaultKafkaPrincipalBuilder``) takes the peer certificate's subject as an RFC 2253 distinguished
name (``X500Principal.getName()``) and maps it with ``ssl.principal.mapping.rules``
(``SslPrincipalMapper``): a comma-separated list of ``RULE:pattern/replacement/[LU]`` and ``DEFAULT``; the
first rule whose pattern matches the *whole* DN gives the principal (``DEFAULT``: the DN itself); no rule
matching fails the authentication. Without a client certificate the principal is ``ANONYMOUS``; on SASL_SSL
the SASL principal wins. Two differences are owed to Python: patterns are Python ``re`` expressions (the
common Java syntax is the same; Java's ``(?<name>...)`` is accepted), and a replacement naming a group the
pattern cannot have is refused when the configuration is read instead of failing every matching client.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from protocol.sasl_identity import SaslIdentity

# ---- the certificate's distinguished name, as Java's X500Principal.getName() writes it (RFC 2253) -------------

# The only keywords Java emits in RFC 2253 form; any other attribute is written as its OID and its value in hex.
_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# Value types written as text (Java's isDerString, non-canonical): UTF8, Printable, T61, IA5, General, BMP.
_TEXT_TAGS = frozenset({0x0C, 0x13, 0x14, 0x16, 0x1B, 0x1E})
_ESCAPED = frozenset(',=+<>#;"\\')


class CertificateError(ValueError):
    """The certificate's DER encoding cannot be read."""


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """The DER element at ``pos``: (tag, start of its content, end of its content)."""
    if pos + 2 > len(data):
        raise CertificateError("truncated element")
    tag, first = data[pos], data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        n = first & 0x7F
        if n == 0 or n > 4 or pos + n > len(data):
            raise CertificateError("bad length")
        length = int.from_bytes(data[pos : pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise CertificateError("truncated element")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    pos = start
    while pos < end:
        tag, s, e = _tlv(data, pos)
        yield tag, pos, s, e
        pos = e


def _oid(raw: bytes) -> str:
    if not raw:
        raise CertificateError("empty OID")
    arcs, value = [], 0
    for b in raw:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(value)
            value = 0
    first = arcs[0]
    head = [0, first] if first < 40 else [1, first - 40] if first < 80 else [2, first - 80]
    return ".".join(str(a) for a in head + arcs[1:])


def _escape(text: str) -> str:
    out = "".join("\\00" if c == "\0" else "\\" + c if c in _ESCAPED else c for c in text)
    lead = len(out) - len(out.lstrip(" \r"))
    trail = len(out.rstrip(" \r"))
    if lead >= len(out):  # all whitespace: every character is escaped
        return "".join("\\" + c for c in out)
    return "".join("\\" + c for c in out[:lead]) + out[lead:trail] + "".join("\\" + c for c in out[trail:])


def _ava(der: bytes, start: int, end: int) -> str:
    items = list(_children(der, start, end))
    if len(items) != 2 or items[0][0] != 0x06:
        raise CertificateError("bad attribute")
    _, _, os_, oe = items[0]
    oid = _oid(der[os_:oe])
    tag, vpos, vs, ve = items[1]
    keyword = _KEYWORDS.get(oid, oid)
    if keyword[0].isdigit() or tag not in _TEXT_TAGS:
        return f"{keyword}=#{der[vpos:ve].hex()}"
    return f"{keyword}={_escape(der[vs:ve].decode('utf-8', errors='replace'))}"


def subject_dn(der: bytes) -> str:
    """The subject of a DER certificate as Java's ``X500Principal.getName()`` (RFC 2253) spells it: the most
    specific RDN first, known keywords (CN, C, L, ST, O, OU, STREET, DC, UID) by name, others as ``OID=#hex``."""
    _, s, e = _tlv(der, 0)  # Certificate
    _, s, e = _tlv(der, s)  # tbsCertificate
    fields = [(tag, s2, e2) for tag, _, s2, e2 in _children(der, s, e)]
    if fields and fields[0][0] == 0xA0:  # explicit version
        fields = fields[1:]
    if len(fields) < 5 or fields[4][0] != 0x30:  # serial, signature, issuer, validity, subject
        raise CertificateError("no subject")
    _, s, e = fields[4]
    rdns = []
    for tag, _, rs, re_ in _children(der, s, e):
        if tag != 0x31:
            raise CertificateError("bad RDN")
        rdns.append("+".join(_ava(der, as_, ae) for _, _, as_, ae in _children(der, rs, re_)))
    return ",".join(reversed(rdns))


# ---- ssl.principal.mapping.rules ----------------------------------------------------------------------------


class MappingRuleError(ValueError):
    pass


class NoMatchingRule(LookupError):
    pass


_GROUP_REF = re.compile(r"\$(\d+)")
_JAVA_NAMED_GROUP = re.compile(r"(?<!\\)\(\?<(?=[A-Za-z])")  # Java's (?<name>...) is Python's (?P<name>...)


class _Rule:
    __slots__ = ("pattern", "replacement", "case", "text")

    def __init__(self, text: str, pattern: str | None = None, replacement: str = "", case: str = "") -> None:
        self.text = text
        self.case = case
        self.pattern = None
        self.replacement = replacement
        if pattern is None:
            return
        try:
            self.pattern = re.compile(_JAVA_NAMED_GROUP.sub("(?P<", pattern))
        except re.error as exc:
            raise MappingRuleError(f"rule {text!r}: bad pattern: {exc}") from None
        self.replacement = _literal_out_of_range(replacement, self.pattern.groups)
        _java_replacement(self.replacement, None, self.pattern)  # refuse a bad replacement now, not per client

    def apply(self, dn: str) -> str | None:
        pattern = self.pattern
        if pattern is None:
            return dn
        if pattern.fullmatch(dn) is None:  # Java's matches(): the whole DN
            return None
        # ... and then, as Kafka does, String.replaceAll: every match in the DN is replaced.
        result = pattern.sub(lambda m: _java_replacement(self.replacement, m, pattern), dn)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result

    def __repr__(self) -> str:
        return self.text


def _literal_out_of_range(replacement: str, groups: int) -> str:
    """Kafka's pre-pass over the replacement: a ``$N`` naming a group the pattern does not have (after
    dropping trailing digits, as Java's own reading of ``$NN`` does) is made a literal ``\\$N``. The
    insertions use positions in the original text, exactly as Kafka computes them."""
    if groups == 0:
        return replacement
    value = replacement
    for m in _GROUP_REF.finditer(replacement):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            at = m.start(1) - 1
            value = value[:at] + "\\" + value[at:]
    return value


def _java_replacement(replacement: str, m: re.Match[str] | None, pattern: re.Pattern[str]) -> str:
    """Expand a replacement as Java's ``Matcher.appendReplacement`` does: ``\\c`` is ``c``, ``$N`` a group
    (digits read while the number stays a group of the pattern), ``${name}`` a named group. With ``m`` None
    only checks it."""
    out: list[str] = []
    i, n, groups = 0, len(replacement), pattern.groups
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 == n:
                raise MappingRuleError(f"replacement {replacement!r}: a trailing backslash escapes nothing")
            out.append(replacement[i + 1])
            i += 2
        elif c == "$":
            i += 1
            if i < n and replacement[i] == "{":
                close = replacement.find("}", i)
                name = replacement[i + 1 : close] if close > 0 else ""
                if not name or name not in pattern.groupindex:
                    raise MappingRuleError(f"replacement {replacement!r}: no group named {name!r}")
                ref: int | str = name
                i = close + 1
            else:
                if i == n or not replacement[i].isdigit():
                    raise MappingRuleError(f"replacement {replacement!r}: '$' must be followed by a group")
                ref = int(replacement[i])
                i += 1
                while i < n and replacement[i].isdigit() and ref * 10 + int(replacement[i]) <= groups:
                    ref = ref * 10 + int(replacement[i])
                    i += 1
                if ref > groups:
                    raise MappingRuleError(f"replacement {replacement!r}: the pattern has no group {ref}")
            if m is not None:
                out.append(m.group(ref) or "")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _scan_part(text: str, i: int) -> tuple[str, int]:
    """A pattern or replacement: up to the next '/' not escaped by a backslash (escapes are kept)."""
    start = i
    while i < len(text) and text[i] != "/":
        i += 2 if text[i] == "\\" else 1
    if i >= len(text):
        raise ValueError
    return text[start:i], i + 1


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``, parsed once; :meth:`name` maps a distinguished name."""

    def __init__(self, rules: str | None) -> None:
        self.rules: list[_Rule] = self._parse("DEFAULT" if rules is None else rules)
        if not self.rules:
            raise MappingRuleError("no rules: every client certificate would be refused (use DEFAULT)")

    @staticmethod
    def _parse(text: str) -> list[_Rule]:
        rules: list[_Rule] = []
        text = text.strip()
        i, n = 0, len(text)
        while i < n:
            while i < n and text[i].isspace():
                i += 1
            start = i
            rule: _Rule | None = None
            if text.startswith("DEFAULT", i):
                i += len("DEFAULT")
                rule = _Rule("DEFAULT")
            elif text.startswith("RULE:", i):
                try:
                    pattern, i = _scan_part(text, i + len("RULE:"))
                    replacement, i = _scan_part(text, i)
                except ValueError:
                    raise MappingRuleError(
                        f"invalid rule {text[start:]!r}: want RULE:pattern/replacement/[LU]"
                    ) from None
                case = ""
                if i < n and text[i] in "LU":
                    case, i = text[i], i + 1
                rule = _Rule(text[start:i], pattern, replacement, case)
            while i < n and text[i].isspace():
                i += 1
            if i < n and text[i] != ",":
                end = text.find(",", i)
                bad = text[start:] if end < 0 else text[start:end]
                raise MappingRuleError(f"invalid rule {bad!r}: want DEFAULT or RULE:pattern/replacement/[LU]")
            if rule is not None:
                rules.append(rule)
            i += 1  # past the comma; empty entries are ignored, as Kafka ignores them
        return rules

    def name(self, dn: str) -> str:
        for rule in self.rules:
            principal = rule.apply(dn)
            if principal is not None:
                return principal
        raise NoMatchingRule(f"no ssl principal mapping rule applies to {dn!r}")

    def __repr__(self) -> str:
        return f"PrincipalMapper({','.join(map(repr, self.rules))})"


# ---- the connection's identity --------------------------------------------------------------------------------


class ConnectionIdentity(SaslIdentity):
    """A SaslIdentity that falls back to the client certificate's principal: as on Kafka's SASL_SSL listeners
    a successful SASL exchange decides the principal; without one, the mapped certificate name (SSL
    listener); without a certificate, ``ANONYMOUS``."""

    __slots__ = ("_tls_principal",)

    def __init__(self, oauthbearer_principal_claim: str = "sub") -> None:
        super().__init__(oauthbearer_principal_claim)
        self._tls_principal: str | None = None

    @property
    def tls_principal(self) -> str | None:
        """The client certificate's mapped name (None without a certificate)."""
        return self._tls_principal

    @tls_principal.setter
    def tls_principal(self, name: str | None) -> None:
        self._tls_principal = name
        self._identity_changed()

    def _identity_changed(self) -> None:
        super()._identity_changed()
        if not self.authenticated and self._tls_principal is not None:
            self.principal = self._tls_principal
