"""DecisionLog: never blocks or raises on emit, drops and counts when full, rotates, renames atomically, flushes."""

from __future__ import annotations

import glob
import os
import time

import pyarrow.parquet as pq
import pytest

from proxy.decision_log.writer import COLUMNS, SCHEMA_VERSION, DecisionLog, arrow_schema, iter_events


def _event(i: int, **extra) -> dict:
    e = {
        "event": "request",
        "ts_ms": 1_767_225_600_000 + i,
        "conn": "c1",
        "user": "alice",
        "client_id": "app",
        "api_key": 0,
        "api_version": 9,
        "requests": 1,
        "bytes_in": 1000 + i,
        "bytes_out": 0,
        "mutations": 0,
        "new_pids": 0,
        "upstream_ms": 1.5,
        "action": "pass",
        "throttle_ms": 0,
        "shadow": False,
        "produce_value": float(1000 + i),
        "produce_limit": 1e6,
        "produce_throttle_ms": 0,
        "rejected_topics": 0,
    }
    e.update(extra)
    return e


def _visible(d) -> list[str]:
    """What Spark would read: files not starting with '.' or '_'."""
    return sorted(p for p in glob.glob(f"{d}/date=*/*") if not os.path.basename(p).startswith((".", "_")))


def _hidden(d) -> list[str]:
    return sorted(glob.glob(f"{d}/date=*/.*"))


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_roundtrip_close_flushes_and_stamps_defaults(tmp_path, fmt):
    log = DecisionLog(tmp_path, "proxy-1", fmt=fmt, flush_interval=0.05)
    for i in range(1000):
        assert log.emit(_event(i)) is True
    log.close()
    files = _visible(tmp_path)
    assert len(files) == 1 and log.files == 1 and files[0].endswith("." + fmt)
    assert log.written == 1000 and log.dropped == 0 and log.failed == 0
    rows = list(iter_events(files))
    assert [r["seq"] for r in rows] == list(range(1000))
    assert {r["proxy"] for r in rows} == {"proxy-1"} and {r["schema"] for r in rows} == {SCHEMA_VERSION}
    assert rows[7]["bytes_in"] == 1007 and rows[7]["user"] == "alice"
    assert not _hidden(tmp_path)
    if fmt == "parquet":
        table = pq.read_table(files[0])
        assert table.schema.names == [n for n, _ in COLUMNS]
        assert table.schema.equals(arrow_schema(), check_metadata=False)
        assert table.column("fetch_value").null_count == 1000  # missing keys are null


def test_file_is_hidden_until_complete(tmp_path):
    log = DecisionLog(tmp_path, "p", rotate_seconds=3600, flush_interval=0.01, row_group_rows=1)
    log.emit(_event(0))
    assert _wait(lambda: _hidden(tmp_path))  # being written, under a name Spark skips
    assert _visible(tmp_path) == []
    log.close()
    assert len(_visible(tmp_path)) == 1 and not _hidden(tmp_path)
    assert pq.read_table(_visible(tmp_path)[0]).num_rows == 1


def test_rotation_by_size(tmp_path):
    log = DecisionLog(tmp_path, "p", rotate_bytes=1, row_group_rows=10, flush_interval=0.01)
    for i in range(100):
        log.emit(_event(i))
        if i % 10 == 9:  # the writer converts what it drains at once; let it drain 10 at a time
            assert _wait(lambda: log.queued == 0)
    log.close()
    files = _visible(tmp_path)
    assert len(files) == log.files >= 10
    assert sum(pq.read_metadata(f).num_rows for f in files) == 100 == log.written
    assert sorted(r["seq"] for r in iter_events(files)) == list(range(100))


def test_rotation_by_time(tmp_path):
    log = DecisionLog(tmp_path, "p", rotate_seconds=0.05, flush_interval=0.01)
    log.emit(_event(0))
    assert _wait(lambda: log.files == 1)  # rotated by age, without a new event arriving
    log.emit(_event(1))
    log.close()
    assert log.files == 2 and len(_visible(tmp_path)) == 2 and log.written == 2


def test_full_queue_drops_counts_and_leaves_seq_gap(tmp_path):
    log = DecisionLog(tmp_path, "p", max_queue=10, flush_interval=3600)  # the writer sleeps: nothing drains
    results = [log.emit(_event(i)) for i in range(25)]
    assert results == [True] * 10 + [False] * 15
    assert log.dropped == 15 and log.queued >= 10
    log.close()  # close wakes the writer, which writes what was queued
    assert log.written == 10 and log.dropped == 15
    log2_rows = list(iter_events(_visible(tmp_path)))
    assert [r["seq"] for r in log2_rows] == list(range(10))
    # events after the drop continue at seq 25, so the gap tells the analysis that 15 are missing
    log = DecisionLog(tmp_path / "b", "p", max_queue=3, flush_interval=0.3)
    assert [log.emit(_event(i)) for i in range(5)] == [True] * 3 + [False] * 2  # within one writer nap
    assert _wait(lambda: log.queued == 0)
    log.emit(_event(99))
    log.close()
    assert [r["seq"] for r in iter_events(_visible(tmp_path / "b"))] == [0, 1, 2, 5]


def test_emit_never_raises_and_bad_values_become_null(tmp_path):
    log = DecisionLog(tmp_path, "p", flush_interval=0.01)
    assert log.emit(_event(0, produce_value="not a number", api_key="0"))
    assert log.emit(None)  # type: ignore[arg-type]  # garbage is queued, then discarded by the writer
    assert log.emit(_event(1))
    log.close()
    assert log.emit(_event(2)) is False  # after close: dropped, not raised
    rows = list(iter_events(_visible(tmp_path)))
    assert len(rows) == 2 and rows[0]["produce_value"] is None and rows[0]["api_key"] == 0
    assert rows[1]["produce_value"] == 1001.0
    assert log.errors >= 2 and log.failed == 1 and log.dropped == 1


def test_write_errors_are_counted_not_raised(tmp_path, monkeypatch):
    log = DecisionLog(tmp_path, "p", flush_interval=0.01)

    def broken(suffix):
        raise OSError("disk full")

    monkeypatch.setattr(log, "_open_file", broken)
    assert log.emit(_event(0))
    assert _wait(lambda: log.failed == 1)
    monkeypatch.undo()
    log.emit(_event(1))  # the writer recovers with the next events
    log.close()
    assert log.errors >= 1 and log.written == 1 and len(_visible(tmp_path)) == 1


def test_stale_temp_files_of_this_instance_are_removed(tmp_path):
    day = tmp_path / "date=2026-01-01"
    day.mkdir()
    mine = day / ".decisions-p-20260101T000000-1-000001.parquet.tmp"
    other = day / ".decisions-q-20260101T000000-1-000001.parquet.tmp"
    mine.write_bytes(b"half")
    other.write_bytes(b"half")
    DecisionLog(tmp_path, "p").close()
    assert not mine.exists() and other.exists()


def test_emit_is_cheap(tmp_path):
    log = DecisionLog(tmp_path, "p", max_queue=200_001, flush_interval=3600)
    e = _event(0)
    t = time.perf_counter()
    for _ in range(200_000):
        log.emit(e)
    per = (time.perf_counter() - t) / 200_000
    log.close()
    assert per < 20e-6  # ~0.1-1 us on this machine; generous for loaded CI
    assert log.written == 200_000


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        DecisionLog(tmp_path, "p", fmt="csv")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DecisionLog(tmp_path, "p", max_queue=0)
