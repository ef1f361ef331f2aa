"""The demo's producer: sends as fast as it can through the proxy and prints what the quota does to it.

It is an ordinary kafka-python producer (nothing in it knows about the proxy), so what it prints is what any
client sees: its acknowledged rate every two seconds against the quota in force, the largest ``throttle_time_ms``
its responses carried in that interval (the client's own ``throttle-time-max`` metric over a one-second sample
window), and the quota itself, asked every interval with DescribeClientQuotas as ``kafka-configs --describe``
does, so a quota altered while it runs shows at once. It runs until Ctrl-C (or ``--seconds``) and ends with what
it got against the most the proxy's enforcement lets through (``--enforcement``: ``smooth``, the default, at most
quota x (run + burst) and one request; ``kafka``, a windowed rate, quota x (run + window)), and a ``DEMO-RESULT``
line the demo's test reads.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

MIB = 1 << 20
RECORD = 16 * 1024
#: Unacknowledged records at most (2 MiB): without a bound the client's 32 MiB buffer takes half a minute to drain
#: at 1 MiB/s after the run.
IN_FLIGHT_RECORDS = 128
#: Kafka's default quota window (11 samples of 1 s): the rate is measured over the last 10-11 s, so a fresh client
#: gets about quota x 10 s through before the throttle bites, and over a run of T seconds at most quota x (T + 11).
WINDOW_S = 11.0


@dataclass
class Acked:
    """Bytes acknowledged by the cluster, as (monotonic time, cumulative bytes) points."""

    total: int = 0
    points: list[tuple[float, int]] = field(default_factory=list)

    def add(self, n: int) -> None:
        self.total += n
        self.points.append((time.monotonic(), self.total))

    def between(self, t0: float, t1: float) -> int:
        """Bytes acknowledged in [t0, t1)."""
        before = next((b for t, b in reversed(self.points) if t < t0), 0)
        upto = next((b for t, b in reversed(self.points) if t < t1), 0)
        return upto - before


def _throttle_max_ms(producer) -> float:
    """The producer's own throttle-time-max metric (the largest throttle_time_ms in its recent responses)."""
    best = 0.0
    for metrics in producer.metrics().values():
        value = metrics.get("throttle-time-max")
        if isinstance(value, int | float) and value == value and value > best:  # NaN != NaN: no sample yet
            best = float(value)
    return best


def read_quota(bootstrap: str, client_id: str) -> float | None:
    """The ``producer_byte_rate`` in force for ``client_id``, asked of the cluster (here: the proxy) with
    DescribeClientQuotas, as ``kafka-configs --describe --entity-type clients`` does; None if none is set or the
    answer did not come."""
    from kafka.protocol.admin import DescribeClientQuotasRequest

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    C = DescribeClientQuotasRequest.ComponentData
    req = DescribeClientQuotasRequest(
        components=[C(entity_type="client-id", match_type=0, match=client_id)], strict=False
    )
    req.API_VERSION = 0
    req.with_header(correlation_id=1, client_id=f"{client_id}-describe")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(req.encode(header=True, framed=True))
            size = int.from_bytes(_read(sock, 4), "big")
            resp = req.header.get_response_class().decode(_read(sock, size), header=True)
    except (OSError, ValueError):
        return None
    if resp.error_code:
        return None
    for entry in resp.entries or []:
        for value in entry.values:
            if value.key == "producer_byte_rate":
                return float(value.value)
    return None


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf


def run(
    bootstrap: str,
    quota: float,
    seconds: float,
    topic: str,
    client_id: str,
    trace: str | None = None,
    enforcement: str = "smooth",
    burst_s: float = 0.1,
) -> int:
    from kafka import KafkaProducer  # the client library, imported where it is used
    from kafka.errors import KafkaError

    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # it warns on every throttled response; we summarise
    # A one-second sample window: throttle-time-max then covers about the last two seconds, one report line.
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks=1,
        linger_ms=5,
        batch_size=256 * 1024,
        max_request_size=1 * MIB,
        max_block_ms=60_000,
        metrics_sample_window_ms=1000,
        metrics_num_samples=2,
    )
    acked, failed = Acked(), [0]
    value = bytes(RECORD)
    until = f"for {seconds:.0f} s" if seconds > 0 else "until Ctrl-C"
    print(
        f"demo producer: client id {client_id!r}, sending {RECORD >> 10} KiB records to topic {topic!r} as fast "
        f"as it can {until}; quota {quota / MIB:.2f} MiB/s",
        flush=True,
    )
    start = time.monotonic()
    stop = threading.Event()
    throttle_seen = [0.0]
    quotas_seen = [quota]

    def report() -> None:  # on its own thread, so a send blocked by the throttle does not delay the lines
        tick = start
        while not stop.wait(max(0.0, tick + 2.0 - time.monotonic())):
            tick += 2.0
            got = acked.between(tick - 2.0, tick) / 2.0
            throttle = _throttle_max_ms(producer)
            throttle_seen[0] = max(throttle_seen[0], throttle)
            now_quota = read_quota(bootstrap, client_id) or quotas_seen[-1]
            if now_quota != quotas_seen[-1]:
                quotas_seen.append(now_quota)
                print(f"  quota for {client_id!r} is now {now_quota / MIB:.2f} MiB/s", flush=True)
            print(
                f"  t={tick - start:4.0f} s  acked {acked.total / MIB:6.1f} MiB  last 2 s {got / MIB:5.2f} MiB/s "
                f"({got / now_quota:4.0%} of {now_quota / MIB:.2f} MiB/s)  throttle_time_ms max {throttle:5.0f}",
                flush=True,
            )

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    in_flight: deque = deque()
    interrupted = [False]
    signal.signal(signal.SIGINT, lambda *_: interrupted.__setitem__(0, True))  # finish with the summary
    try:
        while (seconds <= 0 or time.monotonic() < start + seconds) and not interrupted[0]:
            fut = producer.send(topic, value)
            fut.add_callback(lambda _md: acked.add(RECORD))
            fut.add_errback(lambda _exc: failed.__setitem__(0, failed[0] + 1))
            in_flight.append(fut)
            while len(in_flight) > IN_FLIGHT_RECORDS:  # bounded: the run ends when the clock says, not minutes later
                in_flight.popleft().get(timeout=60)
        for fut in in_flight:
            fut.get(timeout=60)
    except KafkaError as exc:
        print(f"demo producer: {exc}", flush=True)
        failed[0] += 1
    finally:
        end = time.monotonic()
        stop.set()
        reporter.join()
        producer.close(timeout=10)
    run_s = end - start
    if len(quotas_seen) == 1 and enforcement == "kafka":
        allowed = quota * (run_s + WINDOW_S)
        bound = (
            f"quota {quota / MIB:.2f} MiB/s: Kafka's windowed rate lets at most quota x (run + {WINDOW_S:.0f} s) "
            f"= {allowed / MIB:.1f} MiB through in that time"
        )
    elif len(quotas_seen) == 1:
        allowed = quota * (run_s + burst_s)
        bound = (
            f"quota {quota / MIB:.2f} MiB/s: smooth pacing lets at most quota x (run + {burst_s:g} s) "
            f"= {allowed / MIB:.1f} MiB and one request through in that time"
        )
    else:
        bound = "the quota changed during the run: " + " -> ".join(f"{q / MIB:.2f}" for q in quotas_seen) + " MiB/s"
    burst = ", the first burst included" if enforcement == "kafka" else ""
    print(
        f"acked {acked.total / MIB:.1f} MiB in {run_s:.0f} s: {acked.total / run_s / MIB:.2f} MiB/s on average{burst} "
        f"({bound}); the largest throttle_time_ms the client got: {throttle_seen[0]:.0f}; failed sends: {failed[0]}",
        flush=True,
    )
    if trace:  # every acknowledgement, for bench/throttle_shape.py's plot
        with open(trace, "w") as out:
            out.write("t_s,acked_bytes\n")
            out.writelines(f"{t - start:.4f},{b}\n" for t, b in acked.points)
    print(
        f"DEMO-RESULT acked_bytes={acked.total} run_s={run_s:.3f} quota={quota:.0f} "
        f"throttle_ms={throttle_seen[0]:.0f} failed={failed[0]}",
        flush=True,
    )
    return 0 if failed[0] == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--quota", type=float, default=MIB, help="the producer_byte_rate it is held to (bytes/s)")
    ap.add_argument("--seconds", type=float, default=0.0, help="how long to send; 0 (the default): until Ctrl-C")
    ap.add_argument("--topic", default="demo")
    ap.add_argument("--client-id", default="demo-producer")
    ap.add_argument("--trace", help="write every acknowledgement as CSV (t_s, acked_bytes) to this file")
    ap.add_argument(
        "--enforcement",
        choices=("smooth", "kafka"),
        default="smooth",
        help="the proxy's quotas.enforcement, for the bound the summary compares against (default smooth)",
    )
    ap.add_argument("--burst-seconds", type=float, default=0.1, help="the proxy's quotas.smooth_burst_seconds")
    args = ap.parse_args()
    return run(
        args.bootstrap_server,
        args.quota,
        args.seconds,
        args.topic,
        args.client_id,
        args.trace,
        args.enforcement,
        args.burst_seconds,
    )


if __name__ == "__main__":
    sys.exit(main())
