"""``workers: N``: N proxy processes on one host, sharing every listener port (SO_REUSEPORT).

One Python process is one core. With SO_REUSEPORT the kernel spreads new connections over the processes
listening on a port, so N processes serve N times the connections without a load balancer in front. Each
process is the ordinary proxy (``python -m proxy.cli`` with the same arguments and ``KTP_WORKER=i`` in its
environment); this module only supervises them:

* SIGTERM/SIGINT stop every worker (each drains as a single proxy does) and then the supervisor;
  SIGHUP is passed on (each worker reloads its configuration);
* a worker that dies is restarted (after 1 s, doubling to 30 s while it keeps dying young), with one
  WARNING line each time; its clients reconnect, as they would to a restarted broker;
* a worker that exits with status 2 (a configuration or startup error) stops them all: the next one would
  meet the same error.

What the workers share is the kernel's listening sockets and, through ``quotas.state_file``, the quotas
altered through the proxy; each enforces quotas on the connections it holds (docs/fleet.md, "Running several
instances").
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

WORKER_ENV = "KTP_WORKER"
#: A worker alive this long counts as started: dying later is a crash to restart, not a startup error.
STARTED_AFTER_S = 10.0
RESTART_BACKOFF_S = (1.0, 30.0)


def worker_index() -> int | None:
    """This process's worker index when it was started by the supervisor, else None."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value is not None and value.isdigit() else None


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = RESTART_BACKOFF_S[0]
    restart_at: float | None = None


def supervise(argv: list[str], count: int, grace_s: float) -> int:
    """Run ``count`` workers with the command-line ``argv`` until told to stop; the exit status of the whole."""
    stopping: list[int] = []
    hup: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGHUP, lambda signum, _frame: hup.append(signum))
    workers = [_Worker(i) for i in range(count)]

    def start(w: _Worker) -> None:
        env = {**os.environ, WORKER_ENV: str(w.index)}
        w.proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", *argv], env=env)
        w.started, w.restart_at = time.monotonic(), None

    log.info("starting %d workers sharing the listener ports", count)
    for w in workers:
        start(w)
    status = 0
    while not stopping:
        time.sleep(0.2)
        if hup:
            hup.clear()
            for w in workers:
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGHUP)
        now = time.monotonic()
        for w in workers:
            if w.proc is not None and (code := w.proc.poll()) is not None:
                w.proc = None
                if code == 2:
                    log.error(
                        "worker %d exited with status 2 (configuration or startup error, above); stopping all workers",
                        w.index,
                    )
                    status = 2
                    stopping.append(0)
                    break
                young = now - w.started < STARTED_AFTER_S
                w.backoff = min(w.backoff * 2, RESTART_BACKOFF_S[1]) if young else RESTART_BACKOFF_S[0]
                w.restart_at = now + w.backoff
                log.warning("worker %d exited with status %s; restarting it in %.0f s", w.index, code, w.backoff)
            elif w.proc is None and w.restart_at is not None and now >= w.restart_at:
                start(w)
    live = [w.proc for w in workers if w.proc is not None and w.proc.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 10.0
    for proc in live:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker pid %d did not stop within the shutdown grace; killing it", proc.pid)
            proc.kill()
            proc.wait()
    log.info("all workers stopped")
    return status
