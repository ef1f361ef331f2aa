"""bench/soak.py's fit, run as a program on made-up samples (``--fit``): the slope, its 95 % interval, the warm-up
left out and the verdict; and the ``ktp_asyncio_tasks`` gauge the soak samples."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading

from prometheus_client.parser import text_string_to_metric_families

from proxy import metrics
from proxy.stats import Stats
from tests.support import REPO, http_get

KEYS = ("rss_mib", "fds", "threads", "tasks", "buckets", "connections", "pid_users", "pid_bytes", "dlog_queued")
"""What a soak sample holds (and ``pool_bytes``, ``t_min``)."""


def _table(tmp_path, samples: list[dict[str, float]], *args: str) -> dict[str, list[str]]:
    """``bench.soak --fit`` over ``samples``, run as a program (tests import nothing from bench/): its table's
    rows, by quantity label, as lists of cells."""
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--fit", str(path), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [ln.strip("|").split("|") for ln in done.stdout.splitlines() if ln.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def _samples(minutes: int = 30, **series) -> list[dict[str, float]]:
    """One sample a minute; ``series[key](k, hours)`` gives each quantity, the rest are constant."""
    out = []
    for k in range(minutes + 1):
        h = k / 60
        s = {key: 10.0 for key in KEYS}
        s["pool_bytes"] = 0.0
        s.update({key: f(k, h) for key, f in series.items()})
        s["t_min"] = float(k)
        out.append(s)
    return out


def _wiggle(k: int, size: float) -> float:
    return size if k % 2 else -size


def test_each_kind_of_series_gets_its_verdict(tmp_path):
    rows = _table(
        tmp_path,
        _samples(
            rss_mib=lambda k, h: 100 + 40 * h + _wiggle(k, 0.5),  # +20 over the run
            tasks=lambda k, h: 100 + 4 * h + _wiggle(k, 0.05),  # +2: significant, 2 % of the level
            buckets=lambda k, h: 60 + _wiggle(k, 5),  # a saw-tooth, no trend
            connections=lambda k, h: 100 - 40 * h + _wiggle(k, 0.5),
            threads=lambda k, h: 9.0,
            pool_bytes=lambda k, h: math.nan,  # a gauge the proxy did not export
        ),
        "--warmup",
        "0",
    )
    assert rows["RSS, MiB"][-1] == "GROWS"
    assert rows["RSS, MiB"][-2] == "+18.2 %"  # 20 over a mean of 110
    assert rows["asyncio tasks"][-1] == "within noise"
    assert rows["tracked quota buckets"][-1] == "flat"
    assert rows["client connections"][-1] == "falls"
    assert rows["threads"][3:] == ["0.00", "0.00 … 0.00", "+0.0 %", "flat"]  # a constant: slope 0, no width
    assert rows["request pool bytes"][0] == "not exported"


def test_a_tighter_tolerance_calls_small_growth_growth(tmp_path):
    rows = _table(tmp_path, _samples(tasks=lambda k, h: 100 + 4 * h + _wiggle(k, 0.05)), "--tolerance", "0.01")
    assert rows["asyncio tasks"][-1] == "GROWS"


def test_the_warm_up_is_left_out_of_the_fit(tmp_path):
    samples = _samples(fds=lambda k, h: 500.0 if k < 3 else 25.0 + _wiggle(k, 1))
    assert _table(tmp_path, samples, "--warmup", "0")["open file descriptors"][-1] == "falls"
    kept = _table(tmp_path, samples, "--warmup", "3")["open file descriptors"]
    assert kept[0] == "26.0" and kept[-1] == "flat"


def test_the_interval_is_the_textbook_one(tmp_path):
    samples = [s for s in _samples(240) if s["t_min"] % 60 == 0]
    for s, y in zip(samples, (1, 3, 2, 5, 4), strict=True):
        s["rss_mib"] = 1000.0 * y
    # slope 800 per hour; residual sum of squares 3.6e6 and Sxx 10 h²: se = sqrt(3.6e6 / 3 / 10) = 346.4;
    # t(0.975, 3 df) = 3.1824: 800 ± 1,102.4
    rss = _table(tmp_path, samples, "--warmup", "0")["RSS, MiB"]
    assert rss[3:5] == ["800.0", "-302.4 … 1,902"] and rss[-1] == "flat"


def test_the_metrics_port_exports_the_loops_task_count():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        port = metrics.serve(metrics.make_registry(Stats(), lambda: 0, list), "127.0.0.1", 0, loop)
        before = _tasks(http_get(port, "/metrics")[1])
        waiting = [asyncio.run_coroutine_threadsafe(asyncio.sleep(30), loop) for _ in range(4)]
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)  # after the four were made (FIFO)
        assert _tasks(http_get(port, "/metrics")[1]) == before + 4
        for f in waiting:
            f.cancel()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def _tasks(page: str) -> float:
    return next(f.samples[0].value for f in text_string_to_metric_families(page) if f.name == "ktp_asyncio_tasks")
