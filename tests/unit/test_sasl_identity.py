import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol.apis import Api, DecodeError
from protocol.headers import encode_response_header, parse_request_header, response_body_offset
from protocol.sasl_identity import (
    ANONYMOUS,
    SaslIdentity,
    SaslSequenceError,
    SaslTokenError,
    SaslUnsupportedError,
    decode_authenticate_request,
    decode_authenticate_response,
    decode_handshake_request,
    decode_handshake_response,
)

SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33


# ---------------------------------------------------------------- token builders


def plain(user, password="pw", authzid=""):
    return f"{authzid}\0{user}\0{password}".encode()


def scram_first(saslname, authzid=None, flag="n", ext=""):
    a = f"a={authzid}" if authzid is not None else ""
    return f"{flag},{a},n={saslname},r=fyko+d2lbbFgONRv9qkxdawL{ext}".encode()


SERVER_FIRST = b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
CLIENT_FINAL = b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
SERVER_FINAL = b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ="


def b64url(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def jwt(claims, header=None):
    """Unsigned JWS as Kafka's unsecured login module makes it: header.payload. (empty signature)."""
    return f"{b64url(header or {'alg': 'none'})}.{b64url(claims)}."


def oauth(token, authzid=None, ext=""):
    a = f"a={authzid}" if authzid is not None else ""
    return f"n,{a},\x01auth=Bearer {token}\x01{ext}\x01".encode()


# ---------------------------------------------------------------- flow drivers


def handshake(sasl, mechanism, version=1, error=0):
    sasl.on_handshake_request(mechanism, version)
    return sasl.on_handshake_response(error)


def authenticate(sasl, token, error=0, answer=b""):
    sasl.on_authenticate_request(token)
    return sasl.on_authenticate_response(error, answer)


def plain_login(sasl, user, **kw):
    handshake(sasl, "PLAIN")
    return authenticate(sasl, plain(user, **kw))


def scram_login(sasl, saslname, mechanism="SCRAM-SHA-256", final=SERVER_FINAL, **kw):
    handshake(sasl, mechanism)
    assert authenticate(sasl, scram_first(saslname, **kw), answer=SERVER_FIRST) is False
    return authenticate(sasl, CLIENT_FINAL, answer=final)


def assert_anonymous(sasl):
    assert sasl.principal == ANONYMOUS
    assert not sasl.authenticated and not sasl.principal_known
    assert sasl.identity is None and sasl.mechanism is None


# ---------------------------------------------------------------- PLAIN


def test_starts_anonymous():
    assert_anonymous(SaslIdentity())


def test_plain_without_authzid():
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN")
    sasl.on_authenticate_request(plain("alice"))
    assert sasl.in_progress and sasl.principal == ANONYMOUS  # candidate, not yet trusted
    assert sasl.on_authenticate_response(0, b"") is True
    assert (sasl.principal, sasl.mechanism, sasl.authenticated, sasl.principal_known) == ("alice", "PLAIN", True, True)
    assert not sasl.in_progress and sasl.last_failure is None


def test_plain_with_authzid():
    sasl = SaslIdentity()
    assert plain_login(sasl, "alice", authzid="admin") is True
    assert sasl.principal == "admin"


def test_plain_utf8_name_and_password_with_nul():
    sasl = SaslIdentity()
    plain_login(sasl, "zoë", password="a\0b")  # like Kafka, only the first two NULs separate
    assert sasl.principal == "zoë"


def test_plain_failure_never_sets_identity():
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN")
    assert authenticate(sasl, plain("alice"), error=SASL_AUTHENTICATION_FAILED) is False
    assert_anonymous(sasl)
    assert "58" in sasl.last_failure and not sasl.in_progress


@pytest.mark.parametrize(
    "token, why",
    [
        (b"alice\0pw", "NUL"),
        (b"", "NUL"),
        (b"\0\0pw", "empty"),
        (b"\xff\0alice\0pw", "UTF-8"),
        (b"\0\xc3\0pw", "UTF-8"),
    ],
)
def test_plain_malformed(token, why):
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN")
    with pytest.raises(SaslTokenError, match=f"PLAIN.*{why}"):
        sasl.on_authenticate_request(token)


def test_error_messages_do_not_quote_the_password():
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN")
    with pytest.raises(SaslTokenError) as info:
        sasl.on_authenticate_request(b"\0\0s3cr3t")
    assert "s3cr3t" not in str(info.value)


def test_handshake_refused():
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN", error=UNSUPPORTED_SASL_MECHANISM)
    assert_anonymous(sasl)
    assert "33" in sasl.last_failure
    with pytest.raises(SaslSequenceError):
        sasl.on_authenticate_request(plain("alice"))


# ---------------------------------------------------------------- SCRAM


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_happy_path(mechanism):
    sasl = SaslIdentity()
    assert scram_login(sasl, "bob", mechanism=mechanism) is True
    assert (sasl.principal, sasl.mechanism, sasl.principal_known) == ("bob", mechanism, True)


def test_scram_not_trusted_after_server_first():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, scram_first("bob"), answer=SERVER_FIRST)
    sasl.on_authenticate_request(CLIENT_FINAL)
    assert_anonymous(sasl)
    assert sasl.on_authenticate_response(0, SERVER_FINAL) is True
    assert sasl.principal == "bob"


@pytest.mark.parametrize(
    "saslname, user",
    [("a=2Cb", "a,b"), ("a=3Db", "a=b"), ("=3D=2C=3D", "=,="), ("=2C", ","), ("x=3D2C", "x=2C")],
)
def test_scram_saslname_escapes(saslname, user):
    sasl = SaslIdentity()
    scram_login(sasl, saslname)
    assert sasl.principal == user


@pytest.mark.parametrize("saslname", ["a=2cb", "a=41b", "ab=", "ab=2", "=", "a=3d"])
def test_scram_bad_escape(saslname):
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    with pytest.raises(SaslTokenError, match="SCRAM-SHA-256.*escape"):
        sasl.on_authenticate_request(scram_first(saslname))


def test_scram_principal_is_username_not_authzid():
    sasl = SaslIdentity()
    scram_login(sasl, "bob", authzid="bob")
    assert sasl.principal == "bob"
    sasl = SaslIdentity()
    scram_login(sasl, "bob", authzid="root")  # a real broker refuses this; if it ever accepted, it is bob
    assert sasl.principal == "bob"


@pytest.mark.parametrize("flag", ["y", "p=tls-unique"])
def test_scram_other_gs2_flags_parse(flag):
    sasl = SaslIdentity()
    scram_login(sasl, "bob", flag=flag)
    assert sasl.principal == "bob"


def test_scram_reserved_mext_and_extensions():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, b"n,,m=x,n=bob,r=abc,foo=bar", answer=SERVER_FIRST)
    authenticate(sasl, CLIENT_FINAL, answer=SERVER_FINAL)
    assert sasl.principal == "bob"


def test_scram_delegation_token_principal_unknown():
    sasl = SaslIdentity()
    assert scram_login(sasl, "tokenid123", ext=",tokenauth=TRUE") is True
    assert sasl.authenticated and not sasl.principal_known
    assert sasl.principal == ANONYMOUS and sasl.mechanism == "SCRAM-SHA-256"


def test_scram_server_final_error_gives_no_identity():
    sasl = SaslIdentity()
    assert scram_login(sasl, "bob", final=b"e=invalid-proof") is False
    assert_anonymous(sasl)
    assert "e=" in sasl.last_failure


def test_scram_server_first_error_code_gives_no_identity():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    assert authenticate(sasl, scram_first("nobody"), error=SASL_AUTHENTICATION_FAILED) is False
    assert_anonymous(sasl)


def test_scram_final_error_code_gives_no_identity():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-512")
    authenticate(sasl, scram_first("bob"), answer=SERVER_FIRST)
    assert authenticate(sasl, CLIENT_FINAL, error=SASL_AUTHENTICATION_FAILED, answer=b"") is False
    assert_anonymous(sasl)


def test_scram_server_final_without_verifier_is_malformed():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, scram_first("bob"), answer=SERVER_FIRST)
    sasl.on_authenticate_request(CLIENT_FINAL)
    with pytest.raises(SaslTokenError, match="neither"):
        sasl.on_authenticate_response(0, b"")
    assert_anonymous(sasl)


@pytest.mark.parametrize(
    "token",
    [
        b"",
        b"n=bob,r=abc",
        b"n,,r=abc",
        b"n,,n=bob",
        b"n,,n=bob,r=",
        b"n,,n=,r=abc",
        b"x,,n=bob,r=abc",
        b"n,b=x,n=bob,r=abc",
        b"n,,n=bob,r=abc,noequals",
        b"n,a=,n=bob,r=abc",
        b"n,,n=b\xffob,r=abc",
    ],
)
def test_scram_malformed_client_first(token):
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    with pytest.raises(SaslTokenError, match="SCRAM-SHA-256"):
        sasl.on_authenticate_request(token)


def test_scram_third_client_token_is_a_sequence_error():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, scram_first("bob"), answer=SERVER_FIRST)
    sasl.on_authenticate_request(CLIENT_FINAL)
    with pytest.raises(SaslSequenceError):
        sasl.on_authenticate_request(CLIENT_FINAL)  # previous one unanswered


# ---------------------------------------------------------------- OAUTHBEARER


def test_oauthbearer_sub_claim():
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    assert authenticate(sasl, oauth(jwt({"sub": "carol", "exp": 2_000_000_000}))) is True
    assert (sasl.principal, sasl.mechanism, sasl.principal_known) == ("carol", "OAUTHBEARER", True)


def test_oauthbearer_with_authzid_and_extensions():
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, oauth(jwt({"sub": "carol"}), authzid="carol", ext="traceId=123\x01"))
    assert sasl.principal == "carol"


def test_oauthbearer_custom_claim():
    sasl = SaslIdentity(oauthbearer_principal_claim="client_id")
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, oauth(jwt({"sub": "svc-uuid-1", "client_id": "billing"})))
    assert sasl.principal == "billing"


def test_oauthbearer_missing_custom_claim():
    sasl = SaslIdentity(oauthbearer_principal_claim="client_id")
    handshake(sasl, "OAUTHBEARER")
    with pytest.raises(SaslTokenError, match="OAUTHBEARER.*client_id"):
        sasl.on_authenticate_request(oauth(jwt({"sub": "svc"})))


def test_empty_claim_name_rejected():
    with pytest.raises(ValueError):
        SaslIdentity(oauthbearer_principal_claim="")


def test_oauthbearer_error_challenge_then_abort():
    """Kafka answers a bad token with error code 0 and a JSON error; the client sends \\x01; then the error."""
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    sasl.on_authenticate_request(oauth(jwt({"sub": "mallory"})))
    assert sasl.on_authenticate_response(0, b'{"status":"invalid_token"}') is False
    assert_anonymous(sasl)
    assert sasl.in_progress
    sasl.on_authenticate_request(b"\x01")
    assert sasl.on_authenticate_response(SASL_AUTHENTICATION_FAILED, b"") is False
    assert_anonymous(sasl)
    assert not sasl.in_progress


def test_oauthbearer_abort_answered_without_error_is_still_no_identity():
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, oauth(jwt({"sub": "mallory"})), answer=b'{"status":"invalid_token"}')
    assert authenticate(sasl, b"\x01", answer=b"") is False
    assert_anonymous(sasl)


def test_oauthbearer_new_initial_response_after_error_challenge():
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, oauth(jwt({"sub": "carol", "exp": 1})), answer=b'{"status":"invalid_token"}')
    assert authenticate(sasl, oauth(jwt({"sub": "carol"}))) is True
    assert sasl.principal == "carol"


@pytest.mark.parametrize(
    "token",
    [
        b"n,,auth=Bearer x.y.z",  # no \x01 framing
        b"n,,\x01\x01",  # no pairs
        b"n,,\x01foo=bar\x01\x01",  # no auth
        b"n,,\x01auth=Basic abc\x01\x01",
        b"n,,\x01auth=Bearer\x01\x01",
        b"n,,\x01auth=Bearer abc\x01\x01",  # not a JWT
        b"n,,\x01auth=Bearer a.b.c.d.e\x01\x01",  # JWE-like
        b"n,,\x01auth=Bearer a.%%%.c\x01\x01",
        oauth("eyJhbGciOiJub25lIn0.e30x."),  # bad base64 length
        oauth("eyJhbGciOiJub25lIn0.bm90IGpzb24."),  # 'not json'
        oauth(jwt(["sub", "x"])),  # not an object
        oauth(jwt({"sub": 42})),
        oauth(jwt({"sub": "  "})),
        oauth(f"h.{base64.urlsafe_b64encode(b'[' * 100_000).rstrip(b'=').decode()}."),  # deep nesting
    ],
)
def test_oauthbearer_malformed(token):
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    with pytest.raises(SaslTokenError, match="OAUTHBEARER"):
        sasl.on_authenticate_request(token)


def test_oauthbearer_token_not_in_error_message():
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    secret = jwt({"nosub": "x"})
    with pytest.raises(SaslTokenError) as info:
        sasl.on_authenticate_request(oauth(secret))
    assert secret not in str(info.value)


# ---------------------------------------------------------------- opaque mechanisms (GSSAPI)


def test_gssapi_authenticated_as_unknown_principal():
    sasl = SaslIdentity()
    sasl.on_other_response()  # ApiVersions answered before the handshake: nothing happens
    handshake(sasl, "GSSAPI")
    assert sasl.on_other_response() is False  # no round yet
    for token, answer in [(b"\x60\x82krb-ap-req", b"\x60ap-rep"), (b"", b"\x05\x04wrap"), (b"\x05\x04wrap", b"")]:
        assert authenticate(sasl, token, answer=answer) is False
    assert not sasl.authenticated and sasl.in_progress
    assert sasl.on_other_response() is True
    assert sasl.authenticated and not sasl.principal_known
    assert (sasl.principal, sasl.mechanism) == (ANONYMOUS, "GSSAPI")
    assert sasl.on_other_response() is False


def test_gssapi_failure():
    sasl = SaslIdentity()
    handshake(sasl, "GSSAPI")
    authenticate(sasl, b"\x60tok", error=SASL_AUTHENTICATION_FAILED)
    assert sasl.on_other_response() is False
    assert_anonymous(sasl)


def test_gssapi_over_handshake_v0_is_unsupported():
    with pytest.raises(SaslUnsupportedError, match="GSSAPI"):
        SaslIdentity().on_handshake_request("GSSAPI", 0)


def test_other_response_does_nothing_for_in_band_mechanisms():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, scram_first("bob"), answer=SERVER_FIRST)
    assert sasl.on_other_response() is False
    assert_anonymous(sasl)


def test_mechanism_names_are_case_sensitive_like_the_broker():
    sasl = SaslIdentity()
    handshake(sasl, "plain")  # the broker refuses it; here it is simply an opaque mechanism
    authenticate(sasl, plain("alice"))
    sasl.on_other_response()
    assert sasl.principal == ANONYMOUS


# ---------------------------------------------------------------- re-authentication (KIP-368)


def test_reauth_success_replaces():
    sasl = SaslIdentity()
    plain_login(sasl, "alice")
    handshake(sasl, "PLAIN")
    sasl.on_authenticate_request(plain("bob"))
    assert sasl.principal == "alice" and sasl.in_progress  # old identity until the broker says yes
    assert sasl.on_authenticate_response(0, b"") is True
    assert sasl.principal == "bob"


def test_reauth_failure_keeps():
    sasl = SaslIdentity()
    scram_login(sasl, "alice")
    assert scram_login(sasl, "mallory", final=b"e=invalid-proof") is False
    assert (sasl.principal, sasl.authenticated) == ("alice", True)
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, scram_first("mallory"), error=SASL_AUTHENTICATION_FAILED)
    assert sasl.principal == "alice"
    assert sasl.last_failure is not None


def test_reauth_refused_handshake_keeps():
    sasl = SaslIdentity()
    plain_login(sasl, "alice")
    handshake(sasl, "PLAIN", error=34)  # broker without re-auth: ILLEGAL_SASL_STATE, connection stays
    assert sasl.principal == "alice" and not sasl.in_progress


def test_reauth_oauthbearer_failed_challenge_keeps():
    sasl = SaslIdentity()
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, oauth(jwt({"sub": "carol"})))
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, oauth(jwt({"sub": "carol"})), answer=b'{"status":"invalid_token"}')
    authenticate(sasl, b"\x01", error=SASL_AUTHENTICATION_FAILED)
    assert sasl.principal == "carol"


def test_reauth_gssapi_keeps_until_other_response():
    sasl = SaslIdentity()
    plain_login(sasl, "alice")  # the broker would refuse a mechanism change; the tracker does not care
    handshake(sasl, "GSSAPI")
    authenticate(sasl, b"tok", answer=b"")
    assert sasl.principal == "alice"
    sasl.on_other_response()
    assert sasl.principal == ANONYMOUS and sasl.authenticated and sasl.mechanism == "GSSAPI"


# ---------------------------------------------------------------- SaslHandshake v0: raw tokens


def test_raw_plain():
    sasl = SaslIdentity()
    assert not sasl.raw_request_expected and not sasl.raw_response_expected
    sasl.on_handshake_request("PLAIN", 0)
    assert sasl.raw_request_expected  # the broker switches to raw tokens on the request's version
    assert not sasl.raw_response_expected  # the handshake response still has a Kafka header
    sasl.on_handshake_response(0)
    sasl.on_raw_token_request(plain("alice"))
    assert not sasl.raw_request_expected and sasl.raw_response_expected
    assert sasl.principal == ANONYMOUS
    assert sasl.on_raw_token_response(b"") is True  # an empty raw token, not a closed connection
    assert sasl.principal == "alice"
    assert not sasl.raw_request_expected and not sasl.raw_response_expected


def test_raw_scram():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-512", version=0)
    sasl.on_raw_token_request(scram_first("dave"))
    assert sasl.on_raw_token_response(SERVER_FIRST) is False
    assert sasl.raw_request_expected
    sasl.on_raw_token_request(CLIENT_FINAL)
    assert sasl.principal == ANONYMOUS
    assert sasl.on_raw_token_response(SERVER_FINAL) is True
    assert sasl.principal == "dave" and not sasl.raw_request_expected


def test_raw_scram_error():
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256", version=0)
    sasl.on_raw_token_request(scram_first("dave"))
    sasl.on_raw_token_response(SERVER_FIRST)
    sasl.on_raw_token_request(CLIENT_FINAL)
    assert sasl.on_raw_token_response(b"e=invalid-proof") is False
    assert_anonymous(sasl)
    assert not sasl.raw_request_expected


def test_raw_token_pipelined_behind_handshake():
    sasl = SaslIdentity()
    sasl.on_handshake_request("PLAIN", 0)
    sasl.on_raw_token_request(plain("erin"))
    assert not sasl.raw_response_expected  # the handshake response comes first, with its header
    sasl.on_handshake_response(0)
    assert sasl.raw_response_expected
    assert sasl.on_raw_token_response(b"") is True
    assert sasl.principal == "erin"


def test_raw_and_framed_do_not_mix():
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN", version=0)
    with pytest.raises(SaslSequenceError):
        sasl.on_authenticate_request(plain("alice"))
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN", version=1)
    with pytest.raises(SaslSequenceError):
        sasl.on_raw_token_request(plain("alice"))


# ---------------------------------------------------------------- sequencing


def test_authenticate_without_handshake():
    with pytest.raises(SaslSequenceError, match="no SaslHandshake"):
        SaslIdentity().on_authenticate_request(plain("alice"))


def test_stray_authenticate_after_success():
    sasl = SaslIdentity()
    plain_login(sasl, "alice")
    with pytest.raises(SaslSequenceError):
        sasl.on_authenticate_request(plain("bob"))
    assert sasl.principal == "alice"


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.on_handshake_response(0),
        lambda s: s.on_authenticate_response(0, b""),
        lambda s: s.on_raw_token_response(b""),
    ],
)
def test_answer_without_request(call):
    with pytest.raises(SaslSequenceError):
        call(SaslIdentity())


def test_wrong_answer_kind():
    sasl = SaslIdentity()
    sasl.on_handshake_request("PLAIN", 1)
    with pytest.raises(SaslSequenceError, match="SaslHandshake response was due"):
        sasl.on_authenticate_response(0, b"")


def test_handshake_while_answer_outstanding():
    sasl = SaslIdentity()
    handshake(sasl, "PLAIN")
    sasl.on_authenticate_request(plain("alice"))
    with pytest.raises(SaslSequenceError):
        sasl.on_handshake_request("PLAIN", 1)


def test_pipelined_authenticate_behind_refused_handshake_is_absorbed():
    sasl = SaslIdentity()
    sasl.on_handshake_request("PLAIN", 1)
    sasl.on_authenticate_request(plain("alice"))
    sasl.on_handshake_response(UNSUPPORTED_SASL_MECHANISM)
    assert sasl.on_authenticate_response(0, b"") is False  # a failed exchange stays failed
    assert_anonymous(sasl)


def test_pipelined_authenticate_behind_accepted_handshake():
    sasl = SaslIdentity()
    sasl.on_handshake_request("PLAIN", 1)
    sasl.on_authenticate_request(plain("alice"))
    sasl.on_handshake_response(0)
    assert sasl.on_authenticate_response(0, b"") is True
    assert sasl.principal == "alice"


# ---------------------------------------------------------------- body decoding with kafka-python's classes


@pytest.mark.parametrize("version", [0, 1, 2])
def test_decode_authenticate_request(version):
    token = plain("alice")
    body = SaslAuthenticateRequest(auth_bytes=token, version=version).encode(version=version)
    assert decode_authenticate_request(bytes(body), version) == token
    assert decode_authenticate_request(memoryview(bytes(body)), version) == token


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("error, message, auth", [(0, None, SERVER_FINAL), (58, "Authentication failed", b"")])
def test_decode_authenticate_response(version, error, message, auth):
    resp = SaslAuthenticateResponse(
        error_code=error, error_message=message, auth_bytes=auth, session_lifetime_ms=3_600_000, version=version
    )
    assert decode_authenticate_response(bytes(resp.encode(version=version)), version) == (error, auth)


def test_decode_null_auth_bytes_is_empty():
    assert decode_authenticate_request(b"\xff\xff\xff\xff", 0) == b""
    assert decode_authenticate_response(b"\x00\x3a\x00\x03bad\xff\xff\xff\xff", 0) == (58, b"")


@pytest.mark.parametrize("version", [0, 1, 2])
def test_decode_truncated_is_decode_error(version):
    body = bytes(SaslAuthenticateRequest(auth_bytes=b"abcdef", version=version).encode(version=version))
    with pytest.raises(DecodeError):
        decode_authenticate_request(body[:-3], version)


@pytest.mark.parametrize("version", [0, 1])
def test_decode_handshake(version):
    req = SaslHandshakeRequest(mechanism="SCRAM-SHA-512", version=version).encode(version=version)
    assert decode_handshake_request(bytes(req), version) == "SCRAM-SHA-512"
    resp = SaslHandshakeResponse(error_code=33, mechanisms=["PLAIN"], version=version).encode(version=version)
    assert decode_handshake_response(bytes(resp), version) == 33


@pytest.mark.parametrize("version", [1, 2])
def test_whole_frames_through_headers(version):
    """How the proxy will use it: header parsed by protocol.headers, body decoded here."""
    msg = SaslAuthenticateRequest(auth_bytes=scram_first("bob"), version=version)
    msg.with_header(correlation_id=9, client_id="cli")
    frame = bytes(msg.encode(header=True))
    header = parse_request_header(frame)
    assert (header.api_key, header.api_version) == (Api.SASL_AUTHENTICATE, version)
    sasl = SaslIdentity()
    handshake(sasl, "SCRAM-SHA-256")
    sasl.on_authenticate_request(decode_authenticate_request(frame[header.body_offset :], version))

    resp = SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=SERVER_FIRST, version=version)
    rframe = encode_response_header(9, flexible=version >= 2) + bytes(resp.encode(version=version))
    off = response_body_offset(rframe, Api.SASL_AUTHENTICATE, version)
    sasl.on_authenticate_response(*decode_authenticate_response(rframe[off:], version))
    authenticate(sasl, CLIENT_FINAL, answer=SERVER_FINAL)
    assert sasl.principal == "bob"


# ---------------------------------------------------------------- fuzzing

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"]


def near_valid_tokens():
    """Arbitrary bytes, plus mutations of real tokens so the parsers get past their first checks."""
    seeds = [plain("alice"), scram_first("bob"), CLIENT_FINAL, oauth(jwt({"sub": "carol"})), b"\x01"]
    mutated = st.tuples(st.sampled_from(seeds), st.integers(0, 200), st.binary(max_size=8)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + len(t[2]) :]
    )
    return st.one_of(st.binary(max_size=200), mutated)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(MECHANISMS),
    st.booleans(),
    st.lists(near_valid_tokens(), min_size=1, max_size=4),
    st.integers(1, 32767),
)
def test_fuzz_tokens_with_failure_answers(mechanism, raw, tokens, error):
    """Arbitrary tokens raise only SaslTokenError, and without a success answer nothing is trusted."""
    sasl = SaslIdentity()
    try:
        handshake(sasl, mechanism, version=0 if raw else 1)
        for token in tokens:
            if raw:
                sasl.on_raw_token_request(token)
                # a v0 broker signals failure by closing: the proxy never calls on_raw_token_response
                break
            sasl.on_authenticate_request(token)
            sasl.on_authenticate_response(error, b"")
            sasl.on_other_response()
    except SaslTokenError:
        pass
    assert not sasl.authenticated and sasl.principal == ANONYMOUS


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(MECHANISMS),
    st.booleans(),
    st.lists(
        st.tuples(
            near_valid_tokens(),
            st.sampled_from([b"", SERVER_FIRST, SERVER_FINAL, b"e=x", b"{}"]),
            st.sampled_from([0, 0, 58]),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_fuzz_tokens_with_any_answers(mechanism, raw, rounds):
    """Only SaslTokenError, and an identity only right after an answer that means success."""
    sasl = SaslIdentity()
    try:
        handshake(sasl, mechanism, version=0 if raw else 1)
        for token, answer, error in rounds:
            if raw:
                sasl.on_raw_token_request(token)
                trusted = sasl.on_raw_token_response(answer)
            else:
                sasl.on_authenticate_request(token)
                trusted = sasl.on_authenticate_response(error, answer)
            assert trusted == sasl.authenticated
            if trusted:
                assert raw or error == 0
                if mechanism.startswith("SCRAM"):
                    assert answer.startswith(b"v=")
                elif mechanism == "OAUTHBEARER":
                    assert answer == b""
                elif mechanism == "GSSAPI":
                    raise AssertionError("opaque mechanisms never complete in band")
                break
    except SaslTokenError:
        pass


CALLS = st.one_of(
    st.tuples(st.just("hs"), st.sampled_from(MECHANISMS), st.integers(0, 1)),
    st.tuples(st.just("hs_resp"), st.sampled_from([0, 0, 33])),
    st.tuples(st.just("auth"), near_valid_tokens()),
    st.tuples(st.just("auth_resp"), st.sampled_from([0, 0, 58]), st.binary(max_size=40)),
    st.tuples(st.just("raw"), near_valid_tokens()),
    st.tuples(st.just("raw_resp"), st.binary(max_size=40)),
    st.tuples(st.just("other")),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(CALLS, max_size=12))
def test_fuzz_call_sequences(calls):
    """Any order of calls: only SaslTokenError, and the identity changes only on a call that says so."""
    sasl = SaslIdentity()
    for call in calls:
        before = sasl.identity
        changed = False
        try:
            match call:
                case ("hs", mechanism, version):
                    sasl.on_handshake_request(mechanism, version)
                case ("hs_resp", error):
                    changed = sasl.on_handshake_response(error)
                case ("auth", token):
                    sasl.on_authenticate_request(token)
                case ("auth_resp", error, answer):
                    changed = sasl.on_authenticate_response(error, answer)
                    assert not changed or error == 0
                case ("raw", token):
                    sasl.on_raw_token_request(token)
                case ("raw_resp", answer):
                    changed = sasl.on_raw_token_response(answer)
                case ("other",):
                    changed = sasl.on_other_response()
        except SaslTokenError:
            pass
        if not changed:
            assert sasl.identity is before


@pytest.mark.parametrize("version", [0, 1])
def test_decode_response_truncated_inside_auth_bytes(version):
    body = bytes(
        SaslAuthenticateResponse(
            error_code=0, error_message=None, auth_bytes=SERVER_FINAL, session_lifetime_ms=0, version=version
        ).encode(version=version)
    )
    with pytest.raises(DecodeError):
        decode_authenticate_response(body[: 2 + 2 + 4 + 5], version)  # kafka-python alone returns b"v=rmF"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 2), st.booleans())
def test_fuzz_decode_helpers(body, version, request):
    try:
        if request:
            decode_authenticate_request(body, version)
        else:
            decode_authenticate_response(body, version)
    except DecodeError:
        pass
