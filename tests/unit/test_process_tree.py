"""tests.harness.process_tree's CPU readings: exact from the threads' schedstat, the clock ticks only when a thread
went away."""

from __future__ import annotations

import os
import threading
import time

import psutil

from tests.harness.process_tree import CpuReading, cpu_between, cpu_reading


def test_the_threads_deltas_are_summed_and_a_new_thread_counts_in_full():
    before = CpuReading(1.00, {(1, 1): 5_000_000_000, (1, 2): 1_000_000_000})
    after = CpuReading(1.20, {(1, 1): 5_100_000_000, (1, 2): 1_020_000_000, (1, 3): 3_000_000})
    cpu, exact = cpu_between(before, after)
    assert exact
    assert abs(cpu - 0.123) < 1e-12  # 100 ms + 20 ms + the new thread's 3 ms, not the ticks' 200 ms


def test_a_thread_that_exited_falls_back_to_the_ticks():
    """Its exact time went with it: the ticks (which the kernel keeps for dead threads) are complete."""
    before = CpuReading(1.00, {(1, 1): 5_000_000_000, (1, 2): 1_000_000_000})
    after = CpuReading(1.20, {(1, 1): 5_100_000_000})
    assert cpu_between(before, after) == (after.ticks - before.ticks, False)


def test_a_live_reading_follows_the_cpu_this_process_burns():
    me = psutil.Process(os.getpid())
    before = cpu_reading(me)
    assert (os.getpid(), threading.get_native_id()) in before.tasks
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:  # busy: 200 ms of CPU in this thread
        pass
    burnt = time.process_time() - t0
    cpu, exact = cpu_between(before, cpu_reading(me))
    assert exact
    # Other threads of the test process may run a little too; nothing here sleeps, so it cannot be less.
    assert burnt - 0.005 <= cpu < burnt + 0.1
