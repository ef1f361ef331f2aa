"""proxy.stats.Traffic: a connection's decision-log summary counts each request once, whoever counted it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.stats import Traffic


def test_a_summary_leaves_out_what_had_an_event_of_its_own_and_starts_again():
    t = Traffic()
    assert t.take() is None  # nothing happened: no summary event
    t.requests, t.bytes_in, t.bytes_out = 3, 300, 900
    t.logged_request(100)
    t.logged_response(400)
    assert t.take() == (2, 200, 500)
    assert t.take() is None


def test_a_request_read_before_a_summary_and_logged_after_it_is_never_counted_twice():
    t = Traffic()
    t.requests, t.bytes_in = 1, 100
    assert t.take() == (1, 100, 0)  # the summary came first: the request is in it
    t.logged_request(100)  # its own event comes later
    assert t.take() is None  # not subtracted from the next summary's traffic (floored at zero)


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), st.booleans()), max_size=50))
def test_summaries_plus_own_events_add_up_to_the_traffic(requests):
    """Requests counted and logged within one summary period: every byte is in exactly one of the two."""
    t = Traffic()
    logged_in = logged_out = 0
    for size_in, size_out, own_event in requests:
        t.requests += 1
        t.bytes_in += size_in
        t.bytes_out += size_out
        if own_event:
            t.logged_request(size_in)
            t.logged_response(size_out)
            logged_in += size_in
            logged_out += size_out
    summary = t.take() or (0, 0, 0)
    assert summary[0] == sum(1 for *_, own in requests if not own)
    assert summary[1] + logged_in == sum(r[0] for r in requests)
    assert summary[2] + logged_out == sum(r[1] for r in requests)
