"""Progress for long runs: one log line per stage, and a heartbeat with Spark's own task counts.

Why not Spark's console progress bar: it redraws one terminal line (useless in a log file or CI) and says
nothing about which of the job's stages is running.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from pyspark import SparkContext

log = logging.getLogger("spark_analysis")


class Progress:
    """Named stages with timings; ``heartbeat_s`` > 0 also logs running Spark stages' task counts."""

    def __init__(self, sc: SparkContext | None = None, total: int | None = None, heartbeat_s: float = 15.0) -> None:
        self.sc = sc
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self.timings: list[tuple[str, float]] = []
        self._current: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if sc is not None and heartbeat_s > 0:
            self._thread = threading.Thread(
                target=self._beat, args=(sc, heartbeat_s), daemon=True, name="spark-analysis-progress"
            )
            self._thread.start()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.done += 1
        label = f"[{self.done}/{self.total}]" if self.total else f"[{self.done}]"
        log.info("%s %s ...", label, name)
        self._current = name
        t = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - t
            self.timings.append((name, took))
            self._current = None
            log.info("%s %s done in %.1f s (total %.1f s)", label, name, took, time.monotonic() - self.started)

    def _beat(self, sc: SparkContext, every: float) -> None:
        while not self._stop.wait(every):
            try:
                tracker = sc.statusTracker()
                parts = []
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        parts.append(
                            f"spark stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks"
                            f" ({info.numActiveTasks} running)"
                        )
                if parts and self._current:
                    log.info("  ... %s: %s", self._current, "; ".join(parts))
            except Exception:  # noqa: BLE001 - progress must never break the job
                return

    def close(self) -> None:
        self._stop.set()
