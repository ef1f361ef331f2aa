"""tests.harness.measure's arithmetic of samples and latencies: the percentiles and 1-s slices the benchmarks' tables
are built from (bench.isolation's), and the dirty page cache a benchmark waits on."""

from __future__ import annotations

import pytest

from tests.harness.measure import (
    dirty_bytes,
    percentile,
    settled_latencies,
    slice_increments,
    spread,
    value_at,
)


def test_percentile_interpolates_between_ranks_like_numpy():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 25) == 2.0
    assert percentile(values, 90) == pytest.approx(4.6)  # numpy.percentile([1..5], 90) == 4.6
    assert percentile([7.0], 99) == 7.0


def test_p99_of_a_hundred_values_sees_the_tail():
    values = [1.0] * 98 + [50.0, 100.0]
    assert percentile(values, 99) == pytest.approx(50.5)  # between rank 98 (50) and 99 (100)


def test_percentile_refuses_nonsense():
    with pytest.raises(ValueError):
        percentile([], 50)
    assert percentile([], 50, empty=0.0) == 0.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_value_at_interpolates_and_clamps():
    pts = [(10.0, 0.0), (11.0, 100.0), (13.0, 100.0), (14.0, 400.0)]
    assert value_at(pts, 9.0) == 0.0
    assert value_at(pts, 10.5) == 50.0
    assert value_at(pts, 12.0) == 100.0
    assert value_at(pts, 13.5) == 250.0
    assert value_at(pts, 20.0) == 400.0


def test_slices_are_whole_seconds_and_drop_the_partial_end():
    # 100 units/s for 3 s, then a burst of 600 in the 4th second, sampled every 0.5 s
    pts = [(t / 2, 50.0 * t) for t in range(7)] + [(3.5, 450.0), (4.0, 900.0)]
    inc = slice_increments(pts, 0.0, 4.7)
    assert inc == pytest.approx([100.0, 100.0, 100.0, 600.0])  # [4, 4.7) is not a whole slice
    assert sum(slice_increments(pts, 0.0, 4.0)) == pytest.approx(value_at(pts, 4.0) - value_at(pts, 0.0))


def test_slices_of_a_window_shorter_than_one_slice_are_none():
    assert slice_increments([(0.0, 0.0), (1.0, 5.0)], 0.2, 1.0) == []


def test_spread_is_min_median_max():
    assert spread([3.0, 1.0, 2.0, 10.0]) == (1.0, 2.5, 10.0)
    with pytest.raises(ValueError):
        spread([])


def test_settled_latencies_keep_records_sent_inside_the_window():
    rows = [(0.5, 0.100, 0.0), (1.0, 0.002, 0.0), (2.9, 0.003, 0.0), (3.0, 0.500, 0.0)]
    assert settled_latencies(rows, 1.0, 3.0) == [0.002, 0.003]


def test_dirty_bytes_adds_dirty_and_writeback_from_meminfo():
    meminfo = (
        "MemTotal:       24684132 kB\nDirty:              1864 kB\nWriteback:           100 kB\n"
        "WritebackTmp:          7 kB\nHugePages_Total:       0\n"
    )
    assert dirty_bytes(meminfo) == (1864 + 100) * 1024  # not WritebackTmp, not MemTotal
    assert dirty_bytes("MemTotal: 1 kB\n") == 0
