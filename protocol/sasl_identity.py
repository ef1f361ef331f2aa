"""Who the client is, learnt from the SASL exchange the proxy forwards untouched.

Per-user quotas need the principal, and the proxy never terminates SASL: the broker does the
authenticating, the proxy only watches. So the rule is: a *candidate* principal is read from the
client's token, and it becomes the connection's identity only when the broker's answer says the
exchange succeeded. A token the broker rejects, a broker answer that does not say success, or a
sequence the tracker cannot follow never yields an identity.

Where the tracker cannot be sure, it raises :class:`SaslTokenError` (the proxy closes the
connection) rather than quietly leaving the client ``ANONYMOUS``: a client that could make the proxy
lose track of its identity would escape a stricter per-user quota by falling back to the default one.
Where the broker would reject a token anyway but a principal can still be read (an empty PLAIN
password, an unsupported GS2 flag), the tracker lets it through so the client gets the broker's own
error message; the identity still needs the broker's success answer.

Mechanisms (names as in the SaslHandshake, case-sensitive like the broker's own check):

* ``PLAIN`` -- ``authzid NUL authcid NUL password``; principal = authzid, else authcid. One round.
* ``SCRAM-SHA-256`` / ``SCRAM-SHA-512`` -- principal = the ``n=`` username of the client-first
  message. Kafka's ``ScramSaslServer`` authorises as the username and rejects an ``a=`` authzid that
  differs from it; with the ``tokenauth=true`` extension (delegation tokens) the username is a token
  id and the principal is the token's owner, which the bytes do not tell. Two rounds; success needs
  the last answer to be error-free *and* a server-final ``v=`` message.
* ``OAUTHBEARER`` -- principal = a claim (``sub`` unless configured) of the JWT in ``auth=Bearer``,
  read without checking the signature: the broker checks it, and its answer is what is trusted.
  Success is an error-free answer with *empty* bytes: Kafka answers a bad token with error code 0
  and a JSON error, the client replies ``\\x01``, and only then comes the error code.
* anything else (GSSAPI, ...) -- the principal is not in the bytes, so it stays ``ANONYMOUS`` and
  :attr:`SaslIdentity.authenticated` tells "authenticated, principal unknown"; the end of such an
  exchange is not visible in its tokens either, see :meth:`SaslIdentity.on_other_response`.

The principal is the bare name (``alice``), not Kafka's ``User:alice``, and is what the broker's
default principal builder would produce; a custom ``principal.builder.class`` or a broker whose
OAUTHBEARER claim name differs from the one given here makes the two disagree.

Error messages never quote tokens: they hold passwords, proofs and bearer tokens.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Final

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol.apis import DecodeError, decode_body
from protocol.errors import ProtocolError
from protocol.skim import layout

ANONYMOUS: Final = "ANONYMOUS"
"""Kafka's name for a client nobody has authenticated (``KafkaPrincipal.ANONYMOUS``)."""

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
OAUTHBEARER: Final = "OAUTHBEARER"


class SaslTokenError(ProtocolError):
    """A SASL token or sequence the tracker cannot follow; the proxy closes the connection."""

    kind: ClassVar[str] = "sasl"


class SaslSequenceError(SaslTokenError):
    """SASL messages arrived in an order no client/broker pair produces (or the caller mis-fed them)."""


class SaslUnsupportedError(SaslTokenError):
    """A legal exchange the tracker cannot follow (an opaque mechanism over SaslHandshake v0)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What the broker accepted. ``principal_known`` is False when the bytes cannot tell the principal
    (GSSAPI and other opaque mechanisms, SCRAM delegation tokens); ``principal`` is then ANONYMOUS."""

    principal: str
    mechanism: str
    principal_known: bool


class _Step(Enum):
    CONTINUE = 0
    SUCCESS = 1
    FAILURE = 2


class _Answer(Enum):
    """Kinds of SASL answers the broker still owes, in the order it will send them."""

    HANDSHAKE = "SaslHandshake response"
    AUTHENTICATE = "SaslAuthenticate response"
    RAW = "raw SASL token from the broker"


# --------------------------------------------------------------------------- token parsing


def _utf8(token: bytes, mechanism: str, what: str) -> str:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslTokenError(f"SASL {mechanism}: {what} is not valid UTF-8") from None


def _saslname(raw: str, mechanism: str, what: str) -> str:
    """RFC 5802 saslname: ',' and '=' travel as '=2C' and '=3D'; any other '=' must fail (5.1)."""
    if not raw:
        raise SaslTokenError(f"SASL {mechanism}: {what} is empty")
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "=":
            escape = raw[i : i + 3]
            if escape == "=2C":
                out.append(",")
            elif escape == "=3D":
                out.append("=")
            else:
                raise SaslTokenError(
                    f"SASL {mechanism}: {what} holds the escape {escape!r}; only '=2C' and '=3D' are allowed"
                )
            i += 3
        elif ch == "\x00":
            raise SaslTokenError(f"SASL {mechanism}: {what} contains a NUL character")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _gs2_header(text: str, mechanism: str) -> tuple[str | None, str]:
    """Split ``cbind-flag "," [a=authzid] ","`` off a SCRAM/OAUTHBEARER message: (authzid, rest).

    ``y`` and ``p=...`` are accepted though Kafka only speaks ``n``: the broker rejects them, and the
    tracker need not close a connection the broker will answer anyway."""
    flag, sep, rest = text.partition(",")
    if not sep or not (flag in ("n", "y") or (flag.startswith("p=") and len(flag) > 2)):
        raise SaslTokenError(f"SASL {mechanism}: message does not start with a GS2 header ('n,', 'y,' or 'p=...,')")
    field, sep, rest = rest.partition(",")
    if not sep:
        raise SaslTokenError(f"SASL {mechanism}: GS2 header is not closed by a second ','")
    if not field:
        return None, rest
    if not field.startswith("a="):
        raise SaslTokenError(f"SASL {mechanism}: GS2 header field is not an 'a=' authzid")
    return _saslname(field[2:], mechanism, "authzid"), rest


def _plain_principal(token: bytes) -> str:
    """authzid if given, else authcid. Like Kafka's ``PlainSaslServer`` only the first two NULs
    count; the password is the broker's business (an empty one is left for it to refuse)."""
    fields = token.split(b"\x00", 2)
    if len(fields) < 3:
        raise SaslTokenError(f"SASL {PLAIN}: token has {len(fields) - 1} NUL separator(s), expected 2")
    authzid = _utf8(fields[0], PLAIN, "authzid")
    authcid = _utf8(fields[1], PLAIN, "username (authcid)")
    if not authcid:
        raise SaslTokenError(f"SASL {PLAIN}: username (authcid) is empty")
    return authzid or authcid


def _scram_client_first(token: bytes, mechanism: str) -> tuple[str, bool]:
    """(username, token-authenticated) from ``gs2-header [m=...,] n=user,r=nonce[,ext=value...]``."""
    text = _utf8(token, mechanism, "client-first message")
    _authzid, bare = _gs2_header(text, mechanism)  # decoded for its syntax; Kafka authorises as n=
    attrs = bare.split(",")
    i = 1 if attrs[0].startswith("m=") else 0
    if i >= len(attrs) or not attrs[i].startswith("n="):
        raise SaslTokenError(f"SASL {mechanism}: client-first message has no 'n=' username")
    username = _saslname(attrs[i][2:], mechanism, "username")
    if i + 1 >= len(attrs) or not attrs[i + 1].startswith("r=") or len(attrs[i + 1]) == 2:
        raise SaslTokenError(f"SASL {mechanism}: client-first message has no 'r=' nonce after the username")
    token_auth = False
    for ext in attrs[i + 2 :]:
        key, eq, value = ext.partition("=")
        if not eq or not key:
            raise SaslTokenError(f"SASL {mechanism}: client-first message has an extension that is not 'key=value'")
        if key == "tokenauth":
            token_auth = value.lower() == "true"  # Java's Boolean.parseBoolean
    return username, token_auth


_AUTH_VALUE = re.compile(r"([A-Za-z0-9_]+) +([-_.A-Za-z0-9]+)")
"""``auth=`` value as Kafka's ``OAuthBearerClientInitialResponse`` accepts it: scheme, spaces, token."""


def _oauthbearer_principal(token: bytes, claim: str) -> str:
    """The ``claim`` of the JWT in an RFC 7628 client initial response, unverified."""
    text = _utf8(token, OAUTHBEARER, "client initial response")
    _authzid, rest = _gs2_header(text, OAUTHBEARER)  # Kafka requires authzid == principal; broker checks
    if len(rest) < 2 or rest[0] != "\x01" or rest[-1] != "\x01":
        raise SaslTokenError(f"SASL {OAUTHBEARER}: key/value pairs are not framed by \\x01 separators")
    pairs = rest[1:-1]
    if not pairs.endswith("\x01"):
        raise SaslTokenError(f"SASL {OAUTHBEARER}: client initial response has no key/value pairs")
    auth: str | None = None
    for pair in pairs[:-1].split("\x01"):
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise SaslTokenError(f"SASL {OAUTHBEARER}: a key/value pair is not 'key=value'")
        if key == "auth":
            auth = value
    if auth is None:
        raise SaslTokenError(f"SASL {OAUTHBEARER}: client initial response has no 'auth' pair")
    match = _AUTH_VALUE.fullmatch(auth)
    if match is None or match.group(1).lower() != "bearer":
        raise SaslTokenError(f"SASL {OAUTHBEARER}: 'auth' is not 'Bearer <token>'")
    parts = match.group(2).split(".")
    if len(parts) != 3:
        raise SaslTokenError(
            f"SASL {OAUTHBEARER}: bearer token is not a JWT (header.payload.signature), it has {len(parts)} part(s)"
        )
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, RecursionError) as exc:
        raise SaslTokenError(
            f"SASL {OAUTHBEARER}: JWT payload is not base64url-encoded JSON ({type(exc).__name__})"
        ) from None
    if not isinstance(claims, dict):
        raise SaslTokenError(f"SASL {OAUTHBEARER}: JWT payload is not a JSON object")
    principal = claims.get(claim)
    if not isinstance(principal, str) or not principal.strip():
        raise SaslTokenError(f"SASL {OAUTHBEARER}: JWT has no non-empty string claim {claim!r} to name the principal")
    return principal


# --------------------------------------------------------------------------- mechanisms


class _Exchange:
    """One mechanism's view of one exchange: client tokens and error-free broker answers alternate.

    ``client`` and ``server`` enforce the alternation, so a subclass sees each token once, in order.
    ``candidate`` is the principal the client claims (None: none yet, or unknowable)."""

    supports_raw = True
    """False when the end of the exchange cannot be seen in its tokens: over SaslHandshake v0 the
    proxy then cannot tell the last raw token from the first Kafka request."""
    completes_in_band = True
    """False when success shows only as the broker serving other requests (see on_other_response)."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self.candidate: str | None = None
        self.candidate_known = True
        self.rounds = 0
        self.failure: str | None = None
        self._awaiting = False

    def wants_token(self) -> bool:
        return not self._awaiting and self._more_tokens()

    def client(self, token: bytes) -> None:
        if not self.wants_token():
            raise SaslSequenceError(
                f"SASL {self.mechanism}: client sent a token while "
                + ("the previous one is unanswered" if self._awaiting else "the exchange expects none")
            )
        self._client(token)
        self._awaiting = True

    def server(self, token: bytes) -> _Step:
        if not self._awaiting:
            raise SaslSequenceError(f"SASL {self.mechanism}: broker answered a token the client never sent")
        self._awaiting = False
        self.rounds += 1
        return self._server(token)

    def _more_tokens(self) -> bool:
        raise NotImplementedError

    def _client(self, token: bytes) -> None:
        raise NotImplementedError

    def _server(self, token: bytes) -> _Step:
        raise NotImplementedError


class _Plain(_Exchange):
    def _more_tokens(self) -> bool:
        return self.rounds == 0

    def _client(self, token: bytes) -> None:
        self.candidate = _plain_principal(token)

    def _server(self, token: bytes) -> _Step:
        return _Step.SUCCESS  # PlainSaslServer answers success with empty bytes, failure with an error


class _Scram(_Exchange):
    def _more_tokens(self) -> bool:
        return self.rounds < 2

    def _client(self, token: bytes) -> None:
        if self.rounds == 0:
            username, token_auth = _scram_client_first(token, self.mechanism)
            self.candidate, self.candidate_known = (None, False) if token_auth else (username, True)
        # the client-final message proves the password; nothing in it names anyone

    def _server(self, token: bytes) -> _Step:
        if token.startswith(b"e="):
            self.failure = f"SASL {self.mechanism}: broker answered with a SCRAM error (e=) in round {self.rounds}"
            return _Step.FAILURE
        if self.rounds == 1:
            return _Step.CONTINUE  # server-first: r=,s=,i=
        if token.startswith(b"v="):
            return _Step.SUCCESS
        raise SaslTokenError(f"SASL {self.mechanism}: server-final message carries neither 'v=' nor 'e='")


class _OAuthBearer(_Exchange):
    def __init__(self, mechanism: str, claim: str) -> None:
        super().__init__(mechanism)
        self._claim = claim
        self._aborting = False

    def _more_tokens(self) -> bool:
        return not self._aborting

    def _client(self, token: bytes) -> None:
        if token == b"\x01":  # RFC 7628 3.2.3: the client's reply to an error challenge
            self.candidate, self._aborting = None, True
        else:  # Kafka's server also takes a fresh initial response after an error challenge
            self.candidate = _oauthbearer_principal(token, self._claim)

    def _server(self, token: bytes) -> _Step:
        if self._aborting:
            self.failure = f"SASL {OAUTHBEARER}: broker did not fail the exchange the client aborted"
            return _Step.FAILURE
        if token:
            self.candidate = None
            self.failure = f"SASL {OAUTHBEARER}: broker rejected the bearer token (error challenge)"
            return _Step.CONTINUE
        return _Step.SUCCESS


class _Opaque(_Exchange):
    """GSSAPI and other mechanisms whose tokens neither name the principal nor mark the end."""

    supports_raw = False
    completes_in_band = False

    def __init__(self, mechanism: str) -> None:
        super().__init__(mechanism)
        self.candidate_known = False

    def _more_tokens(self) -> bool:
        return True

    def _client(self, token: bytes) -> None:
        pass

    def _server(self, token: bytes) -> _Step:
        return _Step.CONTINUE


def _exchange_for(mechanism: str, claim: str) -> _Exchange:
    if mechanism == PLAIN:
        return _Plain(mechanism)
    if mechanism in (SCRAM_SHA_256, SCRAM_SHA_512):
        return _Scram(mechanism)
    if mechanism == OAUTHBEARER:
        return _OAuthBearer(mechanism, claim)
    return _Opaque(mechanism)


@dataclass(slots=True)
class _Attempt:
    exchange: _Exchange
    raw: bool
    handshake_ok: bool = False
    failed: bool = False


# --------------------------------------------------------------------------- the state machine


class SaslIdentity:
    """The identity of one client connection, kept from the SASL messages the proxy forwards.

    Feed it, in wire order, every SaslHandshake and SaslAuthenticate request when it is forwarded to
    the broker and every answer when it comes back (the answers matched to their requests by
    correlation id, as the proxy already does); with SaslHandshake v0, the raw tokens instead of
    SaslAuthenticate (see :attr:`raw_request_expected` and :attr:`raw_response_expected`). Each
    ``on_*`` call may raise :class:`SaslTokenError`; the connection must then be closed.

    :attr:`principal` is ``ANONYMOUS`` until an exchange succeeds. A new exchange on an
    authenticated connection (KIP-368 re-authentication) replaces the identity only when the broker
    accepts it; until then, and if it fails, the previous identity stays.
    """

    __slots__ = ("_claim", "_identity", "attempt", "_answers", "_last_failure", "principal")

    def __init__(self, oauthbearer_principal_claim: str = "sub") -> None:
        """``oauthbearer_principal_claim`` must match the broker's ``sasl.oauthbearer.sub.claim.name``
        (or the unsecured validator's ``unsecuredValidatorPrincipalClaimName``), both ``sub`` by default."""
        if not oauthbearer_principal_claim:
            raise ValueError("the OAUTHBEARER principal claim name must not be empty")
        self._claim = oauthbearer_principal_claim
        self._identity: Identity | None = None
        self.attempt: _Attempt | None = None
        """The exchange under way (None when none is): read by the session before every frame's SASL checks,
        which have nothing to do without one."""
        self.principal = ANONYMOUS
        """The principal the broker accepted, ``ANONYMOUS`` before any success or when unknowable. A plain
        attribute, set when the identity changes: the policy reads it for every request it charges."""
        self._answers: deque[_Answer] = deque()
        self._last_failure: str | None = None

    # ---- what the proxy reads

    @property
    def identity(self) -> Identity | None:
        """The identity the broker accepted, None before any success."""
        return self._identity

    @property
    def authenticated(self) -> bool:
        """True once an exchange succeeded, even one whose principal cannot be known (GSSAPI)."""
        return self._identity is not None

    @property
    def principal_known(self) -> bool:
        """Authenticated and the principal was read from the bytes; False means "authenticated as an
        unknown principal" (opaque mechanisms, SCRAM delegation tokens) or not authenticated."""
        return self._identity is not None and self._identity.principal_known

    @property
    def mechanism(self) -> str | None:
        """The mechanism of the accepted identity (not of an exchange still running)."""
        return self._identity.mechanism if self._identity is not None else None

    @property
    def in_progress(self) -> bool:
        """An exchange started (SaslHandshake forwarded) and has neither succeeded nor failed."""
        return self.attempt is not None and not self.attempt.failed

    @property
    def last_failure(self) -> str | None:
        """Why the latest exchange failed, for the log line; None if it did not (or none ran)."""
        return self._last_failure

    @property
    def raw_request_expected(self) -> bool:
        """The next frame from the client is a raw SASL token (SaslHandshake v0), not a Kafka request.

        True from the v0 handshake request on (the broker switches on the request's version), as long
        as the mechanism expects another client token."""
        a = self.attempt
        return a is not None and a.raw and not a.failed and a.exchange.wants_token()

    @property
    def raw_response_expected(self) -> bool:
        """The next frame from the broker is a raw SASL token: it has no correlation id."""
        return bool(self._answers) and self._answers[0] is _Answer.RAW

    # ---- what the proxy feeds

    def on_handshake_request(self, mechanism: str, version: int) -> None:
        """A SaslHandshake request is being forwarded: a new exchange starts (a re-authentication if
        the connection is already authenticated). Version 0 means raw tokens follow, 1+ SaslAuthenticate."""
        if self._answers:
            raise SaslSequenceError(
                f"SASL {mechanism}: SaslHandshake sent while the broker still owes a {self._answers[0].value}"
            )
        exchange = _exchange_for(mechanism, self._claim)
        raw = version < 1
        if raw and not exchange.supports_raw:
            raise SaslUnsupportedError(
                f"SASL {mechanism}: cannot follow this mechanism over SaslHandshake v0, where the end of "
                "its raw token exchange is invisible to a proxy; the client must use SaslHandshake v1"
            )
        self.attempt = _Attempt(exchange, raw)
        self._answers.append(_Answer.HANDSHAKE)

    def on_handshake_response(self, error_code: int) -> bool:
        """The broker's SaslHandshake answer. A non-zero error code fails the exchange. Returns False
        (a handshake alone never authenticates); the bool is for symmetry with the other answers."""
        a = self._pop(_Answer.HANDSHAKE)
        if a is None or a.failed:
            return False
        if error_code != 0:
            self._fail(a, f"SASL {a.exchange.mechanism}: broker refused the SaslHandshake (error code {error_code})")
        else:
            a.handshake_ok = True
        return False

    def on_authenticate_request(self, auth_bytes: bytes) -> None:
        """A SaslAuthenticate request is being forwarded; ``auth_bytes`` is its AuthBytes field."""
        a = self._live_attempt("SaslAuthenticate request")
        if a.raw:
            raise SaslSequenceError(
                f"SASL {a.exchange.mechanism}: SaslAuthenticate request after a SaslHandshake v0 (raw tokens expected)"
            )
        a.exchange.client(bytes(auth_bytes))
        self._answers.append(_Answer.AUTHENTICATE)

    def on_authenticate_response(self, error_code: int, auth_bytes: bytes) -> bool:
        """The broker's SaslAuthenticate answer. Returns True when it makes a (new) identity trusted."""
        a = self._pop(_Answer.AUTHENTICATE)
        return self._answer(a, error_code, bytes(auth_bytes))

    def on_raw_token_request(self, token: bytes) -> None:
        """A raw client token (SaslHandshake v0): the frame's payload, without its 4-byte size."""
        a = self._live_attempt("raw SASL token from the client")
        if not a.raw:
            raise SaslSequenceError(
                f"SASL {a.exchange.mechanism}: raw token after a SaslHandshake v1 (SaslAuthenticate expected)"
            )
        a.exchange.client(bytes(token))
        self._answers.append(_Answer.RAW)

    def on_raw_token_response(self, token: bytes) -> bool:
        """A raw broker token (SaslHandshake v0), without its 4-byte size. A v0 broker never answers
        with an error: it closes the connection. Returns True when this makes an identity trusted."""
        a = self._pop(_Answer.RAW)
        return self._answer(a, 0, bytes(token))

    def on_other_response(self) -> bool:
        """The broker answered a request that is neither SaslHandshake nor SaslAuthenticate.

        Only opaque mechanisms (GSSAPI, ...) need it: their tokens do not show where the exchange
        ends, but a broker serves other requests only once authentication is complete. Cheap, so the
        proxy may call it for every such response. Returns True when it makes an identity trusted.
        (A broker that sees a stray request mid-exchange answers it with an error and closes the
        connection; that brief "authenticated" never carries a principal.)"""
        a = self.attempt
        if self._answers or a is None or a.failed or a.raw or not a.handshake_ok:
            return False  # an answer still owed means this response predates the exchange
        ex = a.exchange
        if ex.completes_in_band or ex.rounds == 0:
            return False
        return self._succeed(a)

    # ---- internals

    def _live_attempt(self, what: str) -> _Attempt:
        a = self.attempt
        if a is None:
            raise SaslSequenceError(f"SASL: {what} with no SaslHandshake before it")
        if a.failed:
            raise SaslSequenceError(f"SASL {a.exchange.mechanism}: {what} after the exchange failed")
        return a

    def _pop(self, kind: _Answer) -> _Attempt | None:
        if not self._answers:
            raise SaslSequenceError(f"SASL: {kind.value} answers no outstanding SASL request")
        if self._answers[0] is not kind:
            raise SaslSequenceError(f"SASL: got a {kind.value} where a {self._answers[0].value} was due")
        self._answers.popleft()
        return self.attempt

    def _answer(self, a: _Attempt | None, error_code: int, token: bytes) -> bool:
        if a is None or a.failed:
            return False  # answer to a token pipelined behind a refused handshake
        mechanism = a.exchange.mechanism
        if error_code != 0:
            self._fail(a, f"SASL {mechanism}: broker refused the authentication (error code {error_code})")
            return False
        if not a.handshake_ok:  # unreachable with the FIFO, kept as a guard
            raise SaslSequenceError(f"SASL {mechanism}: token answered before the SaslHandshake")
        step = a.exchange.server(token)
        if step is _Step.SUCCESS:
            return self._succeed(a)
        if step is _Step.FAILURE:
            self._fail(a, a.exchange.failure or f"SASL {mechanism}: authentication failed")
        return False

    def _succeed(self, a: _Attempt) -> bool:
        ex = a.exchange
        if ex.candidate_known and ex.candidate is None:
            self._fail(a, f"SASL {ex.mechanism}: broker signalled success but no token named a principal")
            return False
        if ex.candidate_known and ex.candidate is not None:
            self._identity = Identity(ex.candidate, ex.mechanism, True)
        else:
            self._identity = Identity(ANONYMOUS, ex.mechanism, False)
        self._identity_changed()
        self.attempt = None
        self._last_failure = None
        return True

    def _identity_changed(self) -> None:
        self.principal = self._identity.principal if self._identity is not None else ANONYMOUS

    def _fail(self, a: _Attempt, reason: str) -> None:
        a.failed = True
        self._last_failure = reason


# --------------------------------------------------------------------------- body decoding


def _decode(cls: type[ApiMessage], body: bytes | memoryview, version: int) -> ApiMessage:
    """decode_body, after checking that every length field fits in the body.

    Why: kafka-python reads a short non-flexible ``bytes``/``string`` field without complaint and hands
    back the truncated value; a truncated token must not be read as a shorter one."""
    try:
        layout(cls, version, body)
    except ValueError as exc:
        raise DecodeError(f"{cls.name} v{version} does not parse: {exc}") from None
    return decode_body(cls, body, version)


def decode_authenticate_request(body: bytes | memoryview, version: int) -> bytes:
    """AuthBytes of a SaslAuthenticate request body (after the request header); null reads as b"".

    Raises :class:`protocol.apis.DecodeError` on a body that does not parse."""
    msg = _decode(SaslAuthenticateRequest, body, version)
    return bytes(msg.auth_bytes or b"")


def decode_authenticate_response(body: bytes | memoryview, version: int) -> tuple[int, bytes]:
    """(ErrorCode, AuthBytes) of a SaslAuthenticate response body (after the response header).

    Raises :class:`protocol.apis.DecodeError` on a body that does not parse."""
    msg = _decode(SaslAuthenticateResponse, body, version)
    return int(msg.error_code), bytes(msg.auth_bytes or b"")


def decode_handshake_request(body: bytes | memoryview, version: int) -> str:
    """Mechanism of a SaslHandshake request body; raises DecodeError on a body that does not parse."""
    msg = _decode(SaslHandshakeRequest, body, version)
    return str(msg.mechanism or "")


def decode_handshake_response(body: bytes | memoryview, version: int) -> int:
    """ErrorCode of a SaslHandshake response body; raises DecodeError on a body that does not parse."""
    msg = _decode(SaslHandshakeResponse, body, version)
    return int(msg.error_code)
