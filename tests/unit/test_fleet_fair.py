"""quotas.fleet_fair: the record a fleet member writes where it has light tenants (fair share in a fleet)."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.fleet_fair import MAGIC, MAX_BROKERS, MAX_BYTES, MAX_KEY_BYTES, MAX_VALID_MS, LightReport
from quotas.fleet_leases import MAGIC as LEASE_MAGIC
from quotas.fleet_reports import MAGIC as USAGE_MAGIC
from quotas.fleet_reports import MAX_MEMBER_BYTES, MAX_REPORT_BYTES, ReportError

HEAD = struct.Struct("<4sqIHH")


def raw(entries: list[tuple[bytes, bytes]], member: bytes = b"m", ts: int = 1_000, valid: int = 3_000,
        n: int | None = None, magic: bytes = MAGIC) -> bytes:  # fmt: skip
    """A report built by hand: (key bytes, amount bytes) per broker, every header field settable."""
    body = b"".join(bytes((len(k),)) + k + a for k, a in entries)
    return HEAD.pack(magic, ts, valid, len(member), len(entries) if n is None else n) + member + body


def amount(x: float, base: float = 0.0) -> bytes:
    """A broker's amounts: the light tenants' demand and the member's baseline there."""
    return struct.pack("<dd", x, base)


def test_round_trip():
    rep = LightReport(
        "proxy-a-w1", 1_733_400_000_000, 3_000, {"broker 1": 150_000.0, "kafka-2:9092": 0.0}, {"broker 1": 1.25}
    )
    back = LightReport.decode(rep.encode())
    assert back == rep
    # a baseline not yet known (or not a time) is written as none; one for a broker not reported, not at all
    odd = LightReport("m", 1, 1, {"a": 1.0, "b": 2.0}, {"a": math.inf, "b": -1.0, "c": 2.0})
    assert LightReport.decode(odd.encode()).base == {}
    assert LightReport.decode(LightReport("é-member", 0, 1, {}).encode()) == LightReport("é-member", 0, 1, {})


def test_the_magic_is_neither_the_lease_records_nor_the_usage_reports():
    assert len({MAGIC, LEASE_MAGIC, USAGE_MAGIC}) == 3
    assert LightReport("m", 1, 1, {}).encode()[:4] == MAGIC


def test_the_writer_leaves_out_what_no_reader_would_take_and_stays_bounded():
    light = {f"broker {i:05d}": float(i) for i in range(MAX_BROKERS + 10)}
    light["x" * (MAX_KEY_BYTES + 1)] = 1.0  # too long a key
    light["broker nan"] = math.nan
    light["broker neg"] = -1.0
    light["broker inf"] = math.inf
    data = LightReport("m" * (MAX_MEMBER_BYTES + 5), 5, MAX_VALID_MS, light).encode()
    assert len(data) <= MAX_BYTES <= MAX_REPORT_BYTES
    back = LightReport.decode(data)
    assert len(back.light) == MAX_BROKERS
    assert list(back.light) == sorted(k for k in light if k.startswith("broker 0"))[:MAX_BROKERS]
    assert back.member == "m" * MAX_MEMBER_BYTES
    # a member id cut inside a character is cut before it instead (a reader refuses one that is not UTF-8)
    cut = LightReport("a" * (MAX_MEMBER_BYTES - 1) + "é", 5, 1, {}).encode()
    assert LightReport.decode(cut).member == "a" * (MAX_MEMBER_BYTES - 1)
    with pytest.raises(ValueError, match="counts for 1 to"):
        LightReport("m", 5, MAX_VALID_MS + 1, {}).encode()
    with pytest.raises(ValueError, match="counts for 1 to"):
        LightReport("m", 5, 0, {}).encode()


def test_the_largest_report_the_bounds_allow_is_within_the_fleets_limit():
    light = {f"{i:04d}" + "k" * (MAX_KEY_BYTES - 4): 1.0 for i in range(MAX_BROKERS)}
    data = LightReport("m" * MAX_MEMBER_BYTES, 5, 1, light).encode()
    assert len(data) == MAX_BYTES and len(LightReport.decode(data).light) == MAX_BROKERS


GOOD = (b"broker 1", amount(1.0))


@pytest.mark.parametrize(
    "data, says",
    [
        (b"x" * (MAX_REPORT_BYTES + 1), "is over"),
        (MAGIC + b"\0" * 5, "shorter than its"),
        (raw([GOOD], magic=LEASE_MAGIC), "is not"),
        (raw([GOOD], magic=USAGE_MAGIC), "is not"),
        (raw([GOOD], ts=-1), "is negative"),
        (raw([GOOD], valid=0), "counts for 0 ms"),
        (raw([GOOD], valid=MAX_VALID_MS + 1), f"counts for {MAX_VALID_MS + 1} ms"),
        (raw([GOOD], member=b""), "member id of 0 bytes"),
        (raw([GOOD], member=b"m" * (MAX_MEMBER_BYTES + 1)), f"member id of {MAX_MEMBER_BYTES + 1} bytes"),
        (raw([GOOD], member=b"\xff\xfe"), "member id is not UTF-8"),
        (raw([], n=MAX_BROKERS + 1), f"names {MAX_BROKERS + 1} brokers"),
        (HEAD.pack(MAGIC, 1, 1, 50, 0) + b"m", "member id runs past"),
        (raw([GOOD], n=2), "broker 1 of 2 runs past"),
        (raw([(b"", amount(1.0))]), "key of 0 bytes"),
        (raw([(b"broker 1", b"\0" * 15)]), "key of 8 bytes"),
        (raw([(b"\xc3(", amount(1.0))]), "key is not UTF-8"),
        (raw([(b"broker 1", amount(-1.0))]), "is -1.0, not a finite amount"),
        (raw([(b"broker 1", amount(math.nan))]), "is nan"),
        (raw([(b"broker 1", amount(math.inf))]), "is inf"),
        (raw([(b"broker 1", amount(1.0, -2.0))]), "baseline on 'broker 1' is -2.0 ms"),
        (raw([(b"broker 1", amount(1.0, math.nan))]), "baseline on 'broker 1' is nan ms"),
        (raw([GOOD, GOOD]), "names broker 'broker 1' twice"),
        (raw([GOOD]) + b"\0", "1 bytes after its 1 brokers"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",  # named by what the refusal says, not by its bytes
)
def test_each_malformed_report_is_refused_saying_what_is_wrong(data, says):
    with pytest.raises(ReportError, match="light report") as err:
        LightReport.decode(data)
    assert says in str(err.value)


@settings(max_examples=300, deadline=None)
@given(
    light=st.dictionaries(
        st.text(min_size=1, max_size=60), st.floats(0, 1e12, allow_nan=False, allow_infinity=False), max_size=30
    ),
    member=st.text(min_size=1, max_size=40),
    ts=st.integers(0, 1 << 62),
    valid=st.integers(1, MAX_VALID_MS),
    base=st.floats(0.001, 1e6),
)
def test_any_report_round_trips(light, member, ts, valid, base):
    rep = LightReport(member, ts, valid, light, {k: base for k in light})
    assert LightReport.decode(rep.encode()) == rep


@settings(max_examples=500, deadline=None)
@given(tail=st.binary(max_size=200), valid=st.integers(0, (1 << 32) - 1), mlen=st.integers(0, 40), n=st.integers(0, 9))
def test_garbage_after_the_magic_is_refused_or_read_never_anything_else(tail, valid, mlen, n):
    data = HEAD.pack(MAGIC, 1, valid, mlen, n) + tail
    try:
        rep = LightReport.decode(data)
    except ReportError:
        return
    assert LightReport.decode(rep.encode()) == rep  # what it reads is a well-formed report
