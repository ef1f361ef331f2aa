"""The CPU work's guard (issue 31, item 5): instructions per live Produce round trip, counted by callgrind around
a real broker and a real librdkafka producer (``python -m bench.live_instructions``, run as a program), against
the committed baseline in ``bench/instructions-baseline.json``. Instruction counts do not move with the machine's
load, so this can fail on code alone: a rise above 5 % fails until the baseline is raised in a commit that says
why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
ALLOWED_RISE = 1.05


def test_instructions_per_round_trip_stay_within_5_percent_of_the_baseline(tmp_path):
    baseline = json.loads((REPO / "bench" / "instructions-baseline.json").read_text())["per_round_trip"]
    counts = tmp_path / "counts.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.live_instructions", "--round-trips", "400", "--json", str(counts)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    measured = json.loads(counts.read_text())
    for side, base in baseline.items():
        print(
            f"{side}: {measured[side]:,} instructions per round trip (baseline {base:,}, {measured[side] / base:.3f}x)"
        )
    rises = {side: measured[side] / base for side, base in baseline.items() if measured[side] > base * ALLOWED_RISE}
    assert not rises, f"instructions per round trip rose past 5 % of the baseline: {rises}"
