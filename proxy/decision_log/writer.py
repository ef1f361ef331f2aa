"""The decision log: one record per request that met a quota decision, written off the event loop.

Why it exists: operators find the right quota by measuring (KIP-599 says as much). Every decision the proxy
makes - and periodic per-connection summaries of the traffic that met none - goes to rotating files that
``spark_analysis`` reads offline (usage, throttles, recommendations, what-if replay of a proposed config).

Why it looks like this:

* :meth:`DecisionLog.emit` runs on the asyncio event loop for every decided request, so it must cost almost
  nothing and can never block or raise: it appends the caller's dict to a bounded :class:`collections.deque`
  (no lock, no condition variable, no wake-up of the writer) or, when the queue is full, counts a drop. A slow
  disk therefore costs log records, never client latency.
* One background thread drains the queue every ``flush_interval`` seconds, converts events to Arrow column by
  column (or to JSON lines) and writes them. Files are written under a hidden temporary name (``.<name>.tmp``;
  Spark and Hadoop skip names starting with ``.`` or ``_``) and renamed into place only when complete, so a
  reader never sees half a Parquet file. Rotation is by age (``rotate_seconds``) and size (``rotate_bytes``).
* Files land in ``<directory>/date=YYYY-MM-DD/`` (UTC day the file was opened): Spark discovers the partition
  and can prune whole days; the analysis job ignores the extra column.
* Parquet (zstd) rather than JSON lines: a typed, versioned, columnar schema, ~10x smaller files, and Spark
  reads only the columns a query needs. Both formats are implemented; ``bench`` numbers are in
  ``docs/decision-log.md``.

The schema (version 1) is :data:`COLUMNS`; ``docs/decision-log.md`` documents every column. Unknown keys in an
event are ignored, missing ones are written as null; ``schema`` defaults to 1, ``proxy`` to the instance id,
and ``seq`` is stamped by the writer in emit order (gaps in ``seq`` show dropped events).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, final

from proxy.decision_log.topic import TopicSink
from quotas.decision_events import COLUMNS, QUOTA_KINDS, SCHEMA_VERSION, arrow_schema, column_names

__all__ = [
    "COLUMNS",
    "QUOTA_KINDS",
    "SCHEMA_VERSION",
    "DecisionLog",
    "arrow_schema",
    "column_names",
]

log = logging.getLogger(__name__)


def _coerce(kind: str, value: Any) -> Any:
    """Best-effort conversion of one bad value (slow path only); ``None`` when it cannot be converted."""
    if value is None:
        return None
    try:
        if kind in ("int32", "int64"):
            return int(value)
        if kind == "float64":
            return float(value)
        if kind == "bool":
            return bool(value)
        if kind == "string":
            return str(value)
        if kind == "list<int32>":
            return [int(v) for v in value]
    except (TypeError, ValueError, OverflowError):
        return None
    return None


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@final  # the queue tells it from an event by ``type(e) is _Gap``
class _Gap:
    """Queue marker for events dropped while the queue was full (their ``seq`` numbers are skipped)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 1


class DecisionLog:
    """Bounded, non-blocking decision log with a background writer producing atomically renamed files.

    ``emit`` is meant to be called from one thread (the event loop); everything else happens on the writer
    thread. Counters (plain ints, read them from any thread): ``written`` events in completed files (renamed
    into place, visible to readers), ``dropped`` events refused because the queue was full (or the log was
    closed), ``failed`` events lost to write errors, ``files`` files completed, ``errors`` write errors plus
    values that had the wrong type (written as null).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        instance: str,
        *,
        topic: TopicSink | None = None,
        max_queue: int = 100_000,
        rotate_seconds: float = 60.0,
        rotate_bytes: int = 128 * 1024 * 1024,
        fmt: Literal["parquet", "jsonl"] = "parquet",
        flush_interval: float = 0.5,
        row_group_rows: int = 65_536,
        compression: str = "zstd",
    ) -> None:
        if fmt not in ("parquet", "jsonl"):
            raise ValueError(f"fmt must be 'parquet' or 'jsonl', not {fmt!r}")
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        if not rotate_seconds > 0 or rotate_bytes < 1 or not flush_interval > 0 or row_group_rows < 1:
            raise ValueError("rotate_seconds, rotate_bytes, flush_interval and row_group_rows must be > 0")
        if directory is None and topic is None:
            raise ValueError("a decision log needs a directory, a topic, or both")
        self.directory = Path(directory) if directory is not None else None
        self.topic = topic
        self.instance = instance
        self.fmt = fmt
        self.max_queue = max_queue
        self.rotate_seconds = float(rotate_seconds)
        self.rotate_bytes = int(rotate_bytes)
        self.flush_interval = float(flush_interval)
        self.row_group_rows = int(row_group_rows)
        self.compression = compression
        self._schema = arrow_schema() if fmt == "parquet" else None  # fail at startup if pyarrow is missing
        self._file_prefix = "decisions-" + (_SAFE_NAME.sub("_", instance) or "proxy")
        if self.directory is not None:
            # Fail at startup, not on the writer thread, when the directory cannot be created.
            self.directory.mkdir(parents=True, exist_ok=True)
            self._clean_stale_temp_files(self.directory)

        self.written = 0
        self.dropped = 0
        self.failed = 0
        self.files = 0
        self.errors = 0
        self._seq = 0
        self._queue: collections.deque[Mapping[str, Any] | _Gap] = collections.deque()
        self._closed = False
        self._stop = threading.Event()
        self._last_error_log = 0.0
        # Writer-thread state.
        self._sink: Any = None  # open file object
        self._pq_writer: Any = None
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._opened_at = 0.0
        self._file_no = 0
        self._pending: list[Any] = []  # Arrow record batches not yet written as a row group
        self._pending_rows = 0
        self._file_rows = 0  # events accepted into the open file (written or pending)
        self._thread = threading.Thread(target=self._run, name=f"decision-log-{instance}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ hot path

    def emit(self, event: Mapping[str, Any]) -> bool:
        """Queue one event; False (and ``dropped`` += 1) when the queue is full or the log is closed.

        Never blocks and never raises: it runs on the event loop for every decided request. The dict is kept as
        is (not copied), so the caller must not mutate it after emitting.
        """
        try:
            q = self._queue
            if self._closed or len(q) >= self.max_queue:
                self.dropped += 1
                if not self._closed:  # leave a mark so the writer's seq numbers skip the dropped events
                    last = q[-1] if q else None
                    if type(last) is _Gap:
                        last.n += 1
                    else:
                        q.append(_Gap())
                return False
            q.append(event)
            return True
        except Exception:  # pragma: no cover - defensive: nothing may escape into the event loop
            self.dropped += 1
            return False

    @property
    def queued(self) -> int:
        """Events waiting for the writer (a gauge for metrics)."""
        return len(self._queue)

    def stats(self) -> dict[str, int]:
        """All counters at once, for metrics export."""
        out = {
            "written": self.written,
            "dropped": self.dropped,
            "failed": self.failed,
            "files": self.files,
            "errors": self.errors,
            "queued": len(self._queue),
        }
        if self.topic is not None:
            out["topic_sent"] = self.topic.sent
            out["topic_failed"] = self.topic.failed
        return out

    # ------------------------------------------------------------------------------------------ lifecycle

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop accepting events, write everything queued, finish and rename the open file. Idempotent.

        Blocking (joins the writer): call it from shutdown code, not from a coroutine on a busy loop (wrap it in
        ``loop.run_in_executor`` there).
        """
        self._closed = True
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.flush_interval)
            try:
                self._drain()
                if self._sink is not None and time.monotonic() - self._opened_at >= self.rotate_seconds:
                    self._finish_file()
            except Exception as exc:  # pragma: no cover - _drain handles write errors itself
                self._error("decision log writer failed", exc)
            if stopping and not self._queue:
                break
        try:
            self._finish_file()
        except Exception as exc:  # pragma: no cover
            self._error("decision log: final file not completed", exc)
        if self.topic is not None:
            try:
                self.topic.close()
            except Exception as exc:  # noqa: BLE001
                self._error(f"decision log: topic {self.topic.topic} not flushed at close", exc)

    def _drain(self) -> None:
        q = self._queue
        chunk_max = 8192  # convert in chunks: bounded memory, and the event loop gets the GIL back in between
        while q:
            batch: list[Mapping[str, Any]] = []
            pop = q.popleft
            gap = 0
            try:
                while len(batch) < chunk_max:
                    e = pop()
                    if type(e) is _Gap:
                        gap = e.n
                        break
                    batch.append(e)
            except IndexError:
                pass
            self._write_batch(batch)
            self._seq += gap  # events dropped while the queue was full: their seq numbers stay unused
            if self._sink is not None and time.monotonic() - self._opened_at >= self.rotate_seconds:
                self._finish_file()

    def _write_batch(self, batch: list[Mapping[str, Any]]) -> None:
        if not all(type(e) is dict for e in batch):  # a bad event must not take its batch down with it
            good = [e for e in batch if isinstance(e, Mapping)]
            self.errors += len(batch) - len(good)
            self.failed += len(batch) - len(good)
            batch = good
        if not batch:
            return
        first_seq = self._seq
        self._seq += len(batch)
        if self.topic is not None:
            try:
                lost = self.topic.send(batch, first_seq)
                if lost:
                    self._error(
                        f"decision log: topic {self.topic.topic} took {len(batch) - lost} of {len(batch)} "
                        "events (producer buffer full or cluster unreachable)",
                        RuntimeError("lost"),
                    )
            except Exception as exc:
                self.topic.failed += len(batch)
                self._error(f"decision log: topic {self.topic.topic} unavailable, {len(batch)} events not sent", exc)
        if self.directory is None:
            return
        rows_before = self._file_rows
        try:
            if self.fmt == "parquet":
                self._write_parquet(batch, first_seq)
            else:
                self._write_jsonl(batch, first_seq)
        except Exception as exc:
            if self._file_rows < rows_before + len(batch):  # the batch never made it into the file
                self.failed += len(batch)
            self._error(f"decision log: write failed, {len(batch)}+ events lost", exc)
            self._abandon_file()

    # ---- files

    def _open_file(self, suffix: str) -> None:
        now = time.time()
        utc = _dt.datetime.fromtimestamp(now, _dt.UTC)
        assert self.directory is not None  # files are written only with a directory (_write_batch)
        day_dir = self.directory / f"date={utc:%Y-%m-%d}"
        day_dir.mkdir(parents=True, exist_ok=True)
        self._file_no += 1
        name = f"{self._file_prefix}-{utc:%Y%m%dT%H%M%S}-{os.getpid()}-{self._file_no:06d}.{suffix}"
        self._final_path = day_dir / name
        self._tmp_path = day_dir / f".{name}.tmp"
        self._sink = open(self._tmp_path, "wb")  # noqa: SIM115 - lives across calls until rotation
        self._opened_at = time.monotonic()
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            self._pq_writer = pq.ParquetWriter(self._sink, self._schema, compression=self.compression)

    def _finish_file(self) -> None:
        """Write what is pending, close the file, fsync, and rename it into place (atomic on POSIX)."""
        if self._sink is None or self._tmp_path is None or self._final_path is None:  # all set by _open_file
            return
        try:
            if self.fmt == "parquet":
                self._flush_row_group()
                self._pq_writer.close()
            self._sink.flush()
            os.fsync(self._sink.fileno())
            self._sink.close()
            os.replace(self._tmp_path, self._final_path)
            self.files += 1
            self.written += self._file_rows
        except Exception as exc:
            self._error("decision log: could not complete a file", exc)
            self._abandon_file()
            return
        self._file_rows = 0
        self._sink = self._pq_writer = self._tmp_path = self._final_path = None

    def _abandon_file(self) -> None:
        """After a write error: drop the half-written temporary file and start afresh with the next events."""
        self.failed += self._file_rows
        self._file_rows = 0
        self._pending, self._pending_rows = [], 0
        for closer in (self._pq_writer, self._sink):
            if closer is not None:
                with contextlib.suppress(Exception):
                    closer.close()
        if self._tmp_path is not None:
            with contextlib.suppress(OSError):
                self._tmp_path.unlink()
        self._sink = self._pq_writer = self._tmp_path = self._final_path = None

    def _file_bytes(self) -> int:
        return self._sink.tell() if self._sink is not None else 0

    # ---- parquet

    def _write_parquet(self, batch: list[Mapping[str, Any]], first_seq: int) -> None:
        import pyarrow as pa

        if self._sink is None:
            self._open_file("parquet")
        assert self._schema is not None  # fmt == "parquet"
        arrays = []
        n = len(batch)
        for (name, kind), field in zip(COLUMNS, self._schema, strict=True):
            values = [e.get(name) for e in batch]
            if name == "seq":
                values = [first_seq + i if v is None else v for i, v in enumerate(values)]
            elif name == "schema":
                values = [SCHEMA_VERSION if v is None else v for v in values]
            elif name == "proxy":
                values = [self.instance if v is None else v for v in values]
            try:
                arrays.append(pa.array(values, type=field.type, size=n))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                fixed = [_coerce(kind, v) for v in values]
                self.errors += sum(1 for a, b in zip(values, fixed, strict=True) if a is not None and b is None)
                try:
                    arrays.append(pa.array(fixed, type=field.type, size=n))
                except (pa.ArrowException, TypeError, ValueError, OverflowError):
                    self.errors += n
                    arrays.append(pa.nulls(n, type=field.type))
        self._pending.append(pa.RecordBatch.from_arrays(arrays, schema=self._schema))
        self._pending_rows += n
        self._file_rows += n
        if self._pending_rows >= self.row_group_rows:
            self._flush_row_group()
            if self._file_bytes() >= self.rotate_bytes:
                self._finish_file()

    def _flush_row_group(self) -> None:
        if not self._pending:
            return
        import pyarrow as pa

        table = pa.Table.from_batches(self._pending, schema=self._schema).combine_chunks()
        self._pending, self._pending_rows = [], 0
        self._pq_writer.write_table(table, row_group_size=max(table.num_rows, 1))

    # ---- json lines

    def _write_jsonl(self, batch: list[Mapping[str, Any]], first_seq: int) -> None:
        if self._sink is None:
            self._open_file("jsonl")
        dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
        lines = []
        for i, e in enumerate(batch):
            if "seq" not in e or "proxy" not in e or "schema" not in e:
                e = {"schema": SCHEMA_VERSION, "proxy": self.instance, "seq": first_seq + i, **e}
            lines.append(dumps(e))
        lines.append("")
        self._sink.write("\n".join(lines).encode())
        self._file_rows += len(batch)
        if self._file_bytes() >= self.rotate_bytes:
            self._finish_file()

    # ---- housekeeping

    def _clean_stale_temp_files(self, directory: Path) -> None:
        """Remove temporary files this instance left behind when it crashed: they have no Parquet footer."""
        for path in directory.glob(f"date=*/.{self._file_prefix}-*.tmp"):
            with contextlib.suppress(OSError):
                path.unlink()
                log.warning("decision log: removed incomplete file %s from an earlier run", path)

    def _error(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= 60.0:  # at most one log line a minute: a full disk must not flood logs
            self._last_error_log = now
            log.error("%s: %s (errors so far: %d)", what, exc, self.errors)


def iter_events(paths: Iterable[str | os.PathLike[str]]) -> Iterable[dict[str, Any]]:
    """Read events back (tests and small tools; Spark reads the files directly)."""
    for p in paths:
        p = Path(p)
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.read_table(p).to_pylist()
        else:
            with open(p, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield json.loads(line)
