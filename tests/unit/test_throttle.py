"""KIP-219's shouldClientThrottle table, combining throttles, and Java rounding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas.throttle import (
    MAX_THROTTLE_MS,
    NEVER_CLIENT_THROTTLE,
    SHOULD_CLIENT_THROTTLE_SINCE,
    combine,
    java_round,
    should_client_throttle,
)

# The reference page's table, verbatim: first version at which the client backs off by itself.
REFERENCE = {
    0: "43 44 45 46 47 50 51 62 63 64 75",
    1: "21 22 24 25 26 28 29 30 31 33 34 35 37 38 39 40 41 42",
    2: "10 12 13 14 15 16 18 20 32",
    3: "2 11 19",
    4: "8 9",
    6: "0 3",
    8: "1",
}
NEVER = [4, 5, 6, 7, 17, 23, 27, 36, 48, 49, *range(52, 62), *range(65, 75), *range(76, 88)]


def test_table_matches_reference() -> None:
    expected = {int(k): v for v, keys in REFERENCE.items() for k in keys.split()}
    assert dict(SHOULD_CLIENT_THROTTLE_SINCE) == expected
    assert frozenset(NEVER) == NEVER_CLIENT_THROTTLE


def test_table_covers_keys_0_to_87_exactly_once() -> None:
    since = set(SHOULD_CLIENT_THROTTLE_SINCE)
    assert not since & NEVER_CLIENT_THROTTLE
    assert since | NEVER_CLIENT_THROTTLE == set(range(88))


@pytest.mark.parametrize(
    ("api_key", "below", "since"),
    [
        (0, 5, 6),
        (1, 7, 8),
        (3, 5, 6),
        (8, 3, 4),
        (9, 3, 4),
        (2, 2, 3),
        (11, 2, 3),
        (19, 2, 3),
        (18, 1, 2),
        (10, 1, 2),
        (32, 1, 2),
        (21, 0, 1),
        (42, 0, 1),
    ],
)
def test_first_version_boundaries(api_key: int, below: int, since: int) -> None:
    assert not should_client_throttle(api_key, below)
    assert should_client_throttle(api_key, since)
    assert should_client_throttle(api_key, since + 5)


@pytest.mark.parametrize("api_key", [43, 44, 45, 46, 47, 50, 51, 62, 63, 64, 75])
def test_always_from_v0(api_key: int) -> None:
    assert should_client_throttle(api_key, 0)


@pytest.mark.parametrize("api_key", NEVER)
def test_never(api_key: int) -> None:
    assert not should_client_throttle(api_key, 0)
    assert not should_client_throttle(api_key, 32_767)


@pytest.mark.parametrize("api_key", [-1, 88, 1000, 32_767])
def test_unknown_keys_never(api_key: int) -> None:
    assert not should_client_throttle(api_key, 100)


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        SHOULD_CLIENT_THROTTLE_SINCE[0] = 0  # type: ignore[index]


# ----------------------------------------------------------------------------------------- combine


def test_combine_is_max_and_non_negative() -> None:
    assert combine() == 0
    assert combine(0) == 0
    assert combine(-5) == 0
    assert combine(-5, 3, 2) == 3
    assert combine(210, 2100, 0) == 2100
    assert combine(12_000, 1000) == 12_000


def test_combine_clamps_to_int32() -> None:
    assert combine(2**40) == MAX_THROTTLE_MS
    assert combine(MAX_THROTTLE_MS) == MAX_THROTTLE_MS


@given(st.lists(st.integers(-(2**40), 2**40), max_size=8))
def test_combine_property(values: list[int]) -> None:
    got = combine(*values)
    assert 0 <= got <= MAX_THROTTLE_MS
    assert got == min(MAX_THROTTLE_MS, max([0, *values]))


# ----------------------------------------------------------------------------------------- java_round


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (0.5, 1),
        (1.5, 2),
        (2.5, 3),
        (-0.5, 0),
        (-2.5, -2),
        (-2.6, -3),
        (2.4999, 2),
        (0.0, 0),
        (float("nan"), 0),
        (float("inf"), 2**63 - 1),
        (float("-inf"), -(2**63)),
    ],
)
def test_java_round(x: float, expected: int) -> None:
    assert java_round(x) == expected
