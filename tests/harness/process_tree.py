"""What a process tree has used, read from /proc: its CPU (to the nanosecond when every thread is still there) and
its peak resident memory. The benchmarks charge a proxy, ours or a peer, for its whole tree this way
(``bench.run``); ``tests/unit/test_process_tree.py`` holds the readings to the CPU this process burns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass(frozen=True)
class CpuReading:
    """The CPU a process tree has used so far, two ways (see :func:`cpu_between`)."""

    ticks: float
    """psutil's user+system seconds of the processes (reaped children via children_*): complete, exited threads
    included, but in clock ticks (10 ms, 7 % of a 0.15 s probe run)."""
    tasks: dict[tuple[int, int], int]
    """(pid, tid) -> ns on CPU of every live thread (``/proc/<pid>/task/<tid>/schedstat``: the scheduler's own
    sum_exec_runtime, which the ticks are rounded from)."""


def cpu_reading(proc: psutil.Process) -> CpuReading:
    """Both counts of a process and its live descendants, from one walk of the tree."""
    ticks = 0.0
    tasks: dict[tuple[int, int], int] = {}
    for p in tree(proc):
        try:
            t = p.cpu_times()
            tids = os.listdir(f"/proc/{p.pid}/task")
        except (psutil.NoSuchProcess, OSError):
            continue
        ticks += t.user + t.system + (t.children_user + t.children_system if p is proc else 0.0)
        for tid in tids:
            try:
                tasks[(p.pid, int(tid))] = int(Path(f"/proc/{p.pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return CpuReading(ticks, tasks)


def cpu_between(before: CpuReading, after: CpuReading) -> tuple[float, bool]:
    """CPU seconds used between two readings, and whether to the nanosecond.

    Exact (the threads' schedstat deltas, new threads in full) when every thread of ``before`` is still there;
    a thread or child that exited took its exact time with it, so then the ticks' difference is returned."""
    if before.tasks.keys() - after.tasks.keys() or not after.tasks:
        return after.ticks - before.ticks, False
    return sum(ns - before.tasks.get(k, 0) for k, ns in after.tasks.items()) / 1e9, True


def tree_peak_rss(proc: psutil.Process) -> int:
    """Peak resident set (VmHWM) in bytes, summed over the process tree."""
    total = 0
    for p in tree(proc):
        try:
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total
