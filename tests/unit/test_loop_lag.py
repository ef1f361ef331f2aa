"""The event-loop lag histogram and the timeline (proxy/wire/loop_lag.py, issue 37)."""

from __future__ import annotations

import asyncio
import json
import time

from prometheus_client import generate_latest

from proxy import metrics
from proxy.stats import Stats
from proxy.wire.loop_lag import BUCKETS_S, TIMELINE_INTERVAL_S, LoopLag


def test_observations_land_in_cumulative_buckets():
    lag = LoopLag()
    for x in (0.0005, 0.003, 0.003, 0.2, 5.0):
        lag.observe(x)
    buckets = dict(lag.buckets())
    assert buckets["0.001"] == 1
    assert buckets["0.005"] == 3
    assert buckets["0.25"] == 4
    assert buckets[str(BUCKETS_S[-1])] == 4
    assert buckets["+Inf"] == 5
    assert lag.max_s == 5.0


def test_a_loop_held_by_synchronous_work_shows_as_lag_and_in_the_timeline(tmp_path):
    """The sampler sees a blocked loop (a connection's synchronous slice of work) as one late timer, and the
    timeline records it with the loop's own CPU time over the interval (busy, not merely unscheduled)."""
    path = tmp_path / "timeline.jsonl"
    lag = LoopLag(str(path))

    async def main() -> None:
        lag.start(asyncio.get_running_loop())
        await asyncio.sleep(0.05)
        end = time.thread_time() + 0.1
        while time.thread_time() < end:  # hold the loop for 0.1 s of its CPU, as a connection's long turn would
            pass
        await asyncio.sleep(0.05)
        lag.stop()

    asyncio.run(main())
    # The timer due next may have been armed up to one interval before the loop was held: it is that much less late.
    assert lag.max_s >= 0.1 - TIMELINE_INTERVAL_S
    records = [json.loads(line) for line in path.read_text().splitlines()]
    worst = max((r for r in records if r[0] == "lag"), key=lambda r: r[2])
    assert worst[2] >= 0.1 - TIMELINE_INTERVAL_S and worst[3] >= 0.1  # the loop's thread was busy for all of it


def test_the_histogram_is_exported():
    lag = LoopLag()
    lag.observe(0.02)
    registry = metrics.make_registry(Stats(), lambda: 0, list, loop_lag=lag)
    text = generate_latest(registry).decode()
    assert 'ktp_event_loop_lag_seconds_bucket{le="0.025"} 1.0' in text
    assert "ktp_event_loop_lag_seconds_count 1.0" in text
    assert "ktp_event_loop_lag_max_seconds 0.02" in text


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("KTP_TIMELINE", raising=False)
    assert LoopLag.from_env().timeline is None
    monkeypatch.setenv("KTP_TIMELINE", "/tmp/x")
    assert LoopLag.from_env(worker=2)._path == "/tmp/x.2"
