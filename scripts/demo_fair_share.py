"""The fair-share demo (``scripts/run-embedded --demo fair-share``): a light producer beside a flooder, no quota.

    python -m scripts.demo_fair_share --bootstrap-server HOST:PORT --metrics URL [--seconds N]

A light producer and a flooder, ordinary aiokafka clients (nothing in them knows about the proxy), each in a
process of its own, so the flooder's event loop and GIL are never the light producer's latency:

- the light one, client id ``demo-light``: 200 records a second of 1 KiB on a fixed schedule, ``acks=all``,
  ``linger_ms=0``, each timed from ``send()`` to its acknowledgement;
- the flooder, client id ``demo-flooder``: producers at full speed, batches of about 1 MB, ``acks=all``,
  from a few seconds after the light one starts (its first lines are the light one alone).

Why aiokafka: it is installed with the proxy, and builds its batches in C (kafka-python computes CRC-32C in pure
Python: a 1 MB batch costs it a quarter of a second of CPU, no flood). It sends one request at a time per
connection, so the flood is several producers (FLOOD_PRODUCERS), each with its connection: their requests queue
at the broker together, as a pipelining client's do. Why twelve: on a 2-core machine with one broker, four left
the light producer's p99 with fair share off (a median of 83 ms over the 2-s lines) near what it was on (52 ms);
with twelve, in four runs, off 0.14-0.9 s against 14-108 ms on (each run 5 x or more), the flood 4-20 x faster.

Every 2 s one line: the light producer's p50 and p99 over the last 2 s (every record acknowledged in them, and
every record still waiting, counted at its age so far: a stall shows while it lasts), the flooder's acknowledged
MiB/s over the same 2 s, and what fair share is doing, read from the proxy's metrics: ``off`` when it exports no
``ktp_fair_share_limited`` series (``quotas.fair_share.enabled: false``), else whether the broker is limited and
the flooder's share (``ktp_fair_share_tenant_share_bytes``). At the end the light producer's p99 and the
flooder's rate with fair share on and off, and a ``DEMO-FAIR-RESULT`` line the demo's test reads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import re
import signal
import statistics
import sys
import time
import urllib.request
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

MIB = 1 << 20
LIGHT_CLIENT_ID = "demo-light"
FLOOD_CLIENT_ID = "demo-flooder"
LIGHT_TOPIC = "demo-light"
FLOOD_TOPIC = "demo-flood"
LIGHT_RATE = 200
LIGHT_RECORD = 1024
FLOOD_RECORD = 16 * 1024
FLOOD_BATCH = 1_000_000
FLOOD_PRODUCERS = 12
FLOOD_PARTITIONS = 12
FLOOD_AFTER_S = 6.0
"""The light producer alone first: three lines of what its latency is with nobody beside it."""
REPORT_S = 2.0


def _die_with_parent() -> None:
    """Linux: this process gets SIGTERM when the one that started it dies, however it dies (a SIGKILLed demo must
    not leave a flooder running against nothing)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def _emit(kind: str, **values: float) -> None:
    """One line for the runner on stdout: ``KIND {json}``."""
    print(kind, json.dumps(values), flush=True)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0-100) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


# ------------------------------------------------------------------------------------------------ the light one


async def light(bootstrap: str) -> int:
    """LIGHT_RATE records a second until SIGINT/SIGTERM; every REPORT_S a ``LIGHT`` line."""
    from aiokafka import AIOKafkaProducer

    _die_with_parent()
    stop = asyncio.Event()
    _stop_on_signals(stop)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=LIGHT_CLIENT_ID,
        acks="all",
        linger_ms=0,
        request_timeout_ms=120_000,  # a flooded broker may hold it for seconds: count that, do not fail on it
    )
    await producer.start()
    value = os.urandom(LIGHT_RECORD)
    pending: dict[int, float] = {}  # record number -> when it was sent
    acked: deque[tuple[float, float]] = deque()  # (when acknowledged, latency), the last REPORT_S
    errors = [0]

    def done(i: int, fut: asyncio.Future) -> None:
        sent = pending.pop(i)
        if fut.cancelled() or fut.exception() is not None:
            errors[0] += 1
        else:
            now = time.monotonic()
            acked.append((now, now - sent))

    async def report() -> None:
        tick = time.monotonic()
        while True:
            tick += REPORT_S
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            now = time.monotonic()
            while acked and acked[0][0] < now - REPORT_S:
                acked.popleft()
            lat = [latency for _, latency in acked] + [now - sent for sent in pending.values()]
            _emit(
                "LIGHT",
                t=now,
                acked=len(acked),
                waiting=len(pending),
                p50_ms=percentile(lat, 50) * 1000 if lat else 0.0,
                p99_ms=percentile(lat, 99) * 1000 if lat else 0.0,
                errors=errors[0],
            )

    reporter = asyncio.create_task(report())
    start, i = time.monotonic(), 0
    try:
        while not stop.is_set():
            due = start + i / LIGHT_RATE
            with contextlib.suppress(asyncio.TimeoutError):  # the schedule, or a signal, whichever comes first
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))
            if stop.is_set():
                break
            pending[i] = time.monotonic()  # before send(): a send held up by a stalled broker is latency too
            fut = await producer.send(LIGHT_TOPIC, value)
            fut.add_done_callback(lambda f, i=i: done(i, f))
            i += 1
    finally:
        reporter.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 10)
    return 0


# ------------------------------------------------------------------------------------------------ the flooder


async def flood(bootstrap: str, producers: int) -> int:
    """``producers`` producers at full speed, ~1 MB batches round the partitions, until SIGINT/SIGTERM; twice a
    second a ``FLOOD`` line with the bytes acknowledged so far."""
    from aiokafka import AIOKafkaProducer

    _die_with_parent()
    stop = asyncio.Event()
    _stop_on_signals(stop)
    acked, errors = [0], [0]

    def done(nbytes: int, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            errors[0] += 1
        else:
            acked[0] += nbytes

    async def one(k: int) -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=FLOOD_CLIENT_ID,
            acks="all",
            linger_ms=10,
            max_batch_size=FLOOD_BATCH,
            max_request_size=FLOOD_BATCH + 64 * 1024,
            request_timeout_ms=60_000,
        )
        await p.start()
        value = os.urandom(FLOOD_RECORD)
        partitions = sorted(await p.partitions_for(FLOOD_TOPIC))
        n = 0
        try:
            while not stop.is_set():
                batch = p.create_batch()
                records = 0
                while batch.append(key=None, value=value, timestamp=None) is not None:
                    records += 1
                # Waits while this partition's previous batch is not yet sent: the backpressure of a full buffer.
                fut = await p.send_batch(batch, FLOOD_TOPIC, partition=partitions[(n + k) % len(partitions)])
                fut.add_done_callback(lambda f, b=records * FLOOD_RECORD: done(b, f))
                n += 1
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.stop(), 5)  # its last batches matter to nobody

    async def report() -> None:
        while True:
            _emit("FLOOD", t=time.monotonic(), acked_bytes=acked[0], errors=errors[0])
            await asyncio.sleep(0.5)

    reporter = asyncio.create_task(report())
    tasks = [asyncio.create_task(one(k)) for k in range(producers)]
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    reporter.cancel()
    _emit("FLOOD", t=time.monotonic(), acked_bytes=acked[0], errors=errors[0])
    return 0


# ------------------------------------------------------------------------------------------------ the runner


@dataclass
class FairState:
    """What the proxy's metrics say fair share is doing."""

    on: bool
    limited: list[str] = field(default_factory=list)
    """Brokers it limits now."""
    flooder_share: float = 0.0
    """The flooder's share on the limited brokers (work bytes/s), summed; 0 when nobody paces it."""

    def describe(self) -> str:
        if not self.on:
            return "fair share off"
        if not self.limited:
            return "fair share on, not limiting"
        share = f", flooder held to {self.flooder_share / MIB:.1f} MiB/s" if self.flooder_share > 0 else ""
        return f"fair share limiting {', '.join(self.limited)}{share}"


_SAMPLE = re.compile(r"^(ktp_fair_share_\w+)\{([^}]*)\} (\S+)$")


def fair_state(metrics_text: str) -> FairState:
    """Fair share's state from a Prometheus scrape of the proxy: on while it exports ``ktp_fair_share_limited``
    (a broker it watches; none while ``quotas.fair_share.enabled`` is false), limiting where that is 1."""
    state = FairState(on=False)
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, value = m.group(1), float(m.group(3))
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if name == "ktp_fair_share_limited":
            state.on = True
            if value > 0:
                state.limited.append(labels.get("broker", "?"))
        elif name == "ktp_fair_share_tenant_share_bytes" and labels.get("client_id") == FLOOD_CLIENT_ID:
            state.flooder_share += value
    return state


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return None


async def _create_topics(bootstrap: str, flood_partitions: int) -> None:
    """The flood's topic with a partition per producer, the light one's with one; created before the clock starts,
    so neither waits for a topic to be made on its first send."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="demo-admin")
    await admin.start()
    try:
        for name, partitions in ((LIGHT_TOPIC, 1), (FLOOD_TOPIC, flood_partitions)):
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scripts.demo_fair_share", *args, stdout=asyncio.subprocess.PIPE
    )


async def _stop(child: asyncio.subprocess.Process) -> int:
    """SIGINT (what Ctrl-C sends it anyway), then SIGKILL if it has not ended in 20 s; its exit status."""
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(child.wait(), 20)
        except TimeoutError:
            child.kill()
    return await child.wait()


async def _lines(proc: asyncio.subprocess.Process, kind: str) -> AsyncIterator[dict[str, float]]:
    """A child's ``KIND {json}`` lines, as they come."""
    assert proc.stdout is not None
    async for raw in proc.stdout:
        got, _, body = raw.decode().partition(" ")
        if got == kind:
            yield json.loads(body)


class _Flood:
    """The flooder's process, started when its time comes, and what it has had acknowledged, when."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.started = math.inf
        self.points: deque[tuple[float, int]] = deque(maxlen=64)  # (monotonic, cumulative bytes): half a minute
        self._reader: asyncio.Task[None] | None = None

    async def start(self, bootstrap: str, producers: int) -> None:
        self.started = time.monotonic()
        self.points.append((self.started, 0))
        self.proc = await _spawn("flood", bootstrap, str(producers))
        self._reader = asyncio.create_task(self._read(self.proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        async for v in _lines(proc, "FLOOD"):
            self.points.append((v["t"], int(v["acked_bytes"])))

    def rate(self, t0: float, t1: float) -> float:
        """Bytes per second acknowledged between t0 and t1 (as of its last report before each)."""

        def at(t: float) -> int:
            return next((b for ts, b in reversed(self.points) if ts <= t), 0)

        return (at(t1) - at(t0)) / (t1 - t0)

    async def stop(self) -> int:
        if self.proc is None:
            return 0
        code = await _stop(self.proc)
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        return code


async def run(bootstrap: str, metrics: str, seconds: float, producers: int) -> int:
    _die_with_parent()  # and its children with it, each by the same means
    stop = asyncio.Event()
    _stop_on_signals(stop)
    await _create_topics(bootstrap, producers)
    until = f"for {seconds:.0f} s" if seconds > 0 else "until Ctrl-C"
    print(
        f"fair-share demo, {until}: {LIGHT_CLIENT_ID!r} sends {LIGHT_RATE} records/s of {LIGHT_RECORD >> 10} KiB "
        f"(acks=all, linger 0); {FLOOD_CLIENT_ID!r} ({producers} producers, ~1 MB batches, acks=all) floods from "
        f"t={FLOOD_AFTER_S:.0f} s; no quota anywhere",
        flush=True,
    )
    start = time.monotonic()
    light_proc = await _spawn("light", bootstrap)
    flood = _Flood()
    rows: list[tuple[bool, bool, float, float]] = []  # beside the flood: (on, limiting, light p99 ms, flood B/s)

    async def report() -> None:
        async for v in _lines(light_proc, "LIGHT"):
            now = v["t"]
            text = await asyncio.to_thread(_scrape, metrics)
            state = fair_state(text) if text is not None else None
            rate = flood.rate(now - REPORT_S, now) if flood.proc is not None else 0.0
            print(
                f"  t={now - start:4.0f} s  light p50 {v['p50_ms']:7.1f} ms  p99 {v['p99_ms']:7.1f} ms "
                f"({v['acked']:3.0f} acked, {v['waiting']:3.0f} waiting)  flooder {rate / MIB:6.1f} MiB/s  "
                + (state.describe() if state is not None else "(the proxy's metrics did not answer)"),
                flush=True,
            )
            if state is not None and now - REPORT_S >= flood.started:  # the whole 2 s beside the flood
                rows.append((state.on, bool(state.limited), v["p99_ms"], rate))
            if flood.proc is None and now - start >= FLOOD_AFTER_S - 0.5:
                print(f"  ... {FLOOD_CLIENT_ID!r} starts flooding", flush=True)
                await flood.start(bootstrap, producers)

    printer = asyncio.create_task(report())
    waits = {printer, asyncio.create_task(stop.wait())}  # the light producer ended, or Ctrl-C
    if seconds > 0:
        waits.add(asyncio.create_task(asyncio.sleep(seconds)))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    light_rc, flood_rc = await asyncio.gather(_stop(light_proc), flood.stop())
    with contextlib.suppress(asyncio.CancelledError):
        await printer
    return _summary(rows, light_rc, flood_rc)


def _summary(rows: list[tuple[bool, bool, float, float]], light_rc: int, flood_rc: int) -> int:
    """The light producer's p99 and the flooder's rate beside the flood, with fair share on and off (medians of the
    2-s lines: one line's p99 is a few records' luck)."""
    parts, result = [], []
    for on in (True, False):
        mine = [(p99, rate, limiting) for state, limiting, p99, rate in rows if state == on]
        if not mine:
            continue
        p99 = statistics.median(p for p, _, _ in mine)
        rate = statistics.median(r for _, r, _ in mine) / MIB
        limiting = sum(1 for *_, lim in mine if lim)
        name = "on" if on else "off"
        parts.append(
            f"fair share {name}: light p99 {p99:.1f} ms, flooder {rate:.1f} MiB/s ({len(mine)} lines"
            + (f", {limiting} limiting)" if on else ")")
        )
        result.append(f"{name}_lines={len(mine)} {name}_p99_ms={p99:.1f} {name}_flood_mib_s={rate:.1f}")
    print(
        "beside the flood (medians of the 2-s lines): " + ("; ".join(parts) if parts else "no line of it"),
        flush=True,
    )
    print(f"DEMO-FAIR-RESULT light_rc={light_rc} flood_rc={flood_rc} " + " ".join(result), flush=True)
    return 0 if light_rc == 0 and flood_rc == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role")
    lp = sub.add_parser("light", help="the light producer alone (the runner starts it)")
    lp.add_argument("bootstrap")
    fp = sub.add_parser("flood", help="the flooder alone (the runner starts it)")
    fp.add_argument("bootstrap")
    fp.add_argument("producers", type=int)
    ap.add_argument("--bootstrap-server")
    ap.add_argument("--metrics", help="the proxy's metrics URL (http://HOST:PORT/metrics)")
    ap.add_argument("--seconds", type=float, default=0.0, help="how long to run; 0 (the default): until Ctrl-C")
    ap.add_argument("--producers", type=int, default=FLOOD_PRODUCERS, help="the flooder's producers")
    args = ap.parse_args()
    if args.role == "light":
        return asyncio.run(light(args.bootstrap))
    if args.role == "flood":
        return asyncio.run(flood(args.bootstrap, args.producers))
    if not args.bootstrap_server or not args.metrics:
        ap.error("--bootstrap-server and --metrics are required")
    return asyncio.run(run(args.bootstrap_server, args.metrics, args.seconds, args.producers))


if __name__ == "__main__":
    sys.exit(main())
