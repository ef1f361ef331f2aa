"""A victim producer and a flooder, each in a process of its own, for the tests of fair share (issue 48).

    python -m tests.harness.flood victim <bootstrap> <topic> <seconds> <out.json>
    python -m tests.harness.flood flood <bootstrap> <topic> <seconds> <out.json> [<client id> [<producers>]]

Why processes: the flooder's produce loop holds the GIL between librdkafka calls, and a victim in the same
interpreter would be timed waiting for it. Why the issue's shapes: the victim is 200 records/s of 1 KiB,
``acks=all``, ``linger.ms=0``, round-robin over the topic's partitions, timed from ``produce()`` to its delivery
callback (the process polls whenever it is not sending, so a callback runs as soon as librdkafka queues it); the
flooder is librdkafka producers at full speed, 16 KiB records in batches of up to 1 MB, ``acks=all``, no quota
anywhere (librdkafka pipelines without limit by default: the flood that held a neighbour 45 s).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from pathlib import Path

VICTIM_RATE = 200
VICTIM_RECORD = 1024
FLOOD_RECORD = 16 * 1024
FLOOD_BATCH = 1_000_000


def victim(bootstrap: str, topic: str, seconds: float, out: Path, client_id: str = "victim") -> None:
    """VICTIM_RATE records a second on a fixed schedule; every record's (sent, latency) in ``out``, monotonic."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": 120_000,  # a flooded cluster held the victim 45 s: lose nothing
        }
    )
    partitions = len(p.list_topics(topic, timeout=15).topics[topic].partitions)
    rows: list[tuple[float, float]] = []
    errors: list[str] = []

    def delivered(sent: float, err, _msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            rows.append((sent, time.monotonic() - sent))

    value = os.urandom(VICTIM_RECORD)
    start = time.monotonic()
    n = int(seconds * VICTIM_RATE)
    for i in range(n):
        due = start + i / VICTIM_RATE
        while (wait := due - time.monotonic()) > 0:
            p.poll(wait)
        p.produce(topic, value, partition=i % partitions, on_delivery=functools.partial(delivered, time.monotonic()))
        p.poll(0)
    left = p.flush(150)
    out.write_text(json.dumps({"start": start, "rows": rows, "errors": errors[:10], "error_count": len(errors),
                               "undelivered": left, "sent": n}))  # fmt: skip


def flood(
    bootstrap: str, topic: str, seconds: float, out: Path, client_id: str = "flooder", producers: int = 2
) -> None:
    """``producers`` producers at full speed for ``seconds``; what they had acknowledged, in ``out``."""
    from confluent_kafka import KafkaError, Producer

    stats = [{"delivered": 0, "errors": 0} for _ in range(producers)]
    stop_at = time.monotonic() + seconds

    def one(k: int) -> None:
        s = stats[k]
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "acks": "all",
                "linger.ms": 10,
                "batch.size": FLOOD_BATCH,
                "queue.buffering.max.kbytes": 8192,
                "message.timeout.ms": 60_000,
            }
        )

        def done(err, _msg) -> None:
            if err is None:
                s["delivered"] += 1
            elif err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                s["errors"] += 1

        partitions = len(p.list_topics(topic, timeout=15).topics[topic].partitions)
        value = os.urandom(FLOOD_RECORD)
        i = 0
        while time.monotonic() < stop_at:
            try:
                p.produce(topic, value, partition=(i + k) % partitions, on_delivery=done)
            except BufferError:
                p.poll(0.05)
                continue
            i += 1
            if i % 64 == 0:
                p.poll(0)
        p.purge(in_queue=True, in_flight=False)
        p.flush(30)

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 90)
    delivered = sum(s["delivered"] for s in stats)
    out.write_text(json.dumps({"delivered_bytes": delivered * FLOOD_RECORD, "errors": sum(s["errors"] for s in stats)}))


def main(argv: list[str]) -> int:
    role, bootstrap, topic, seconds, out, *rest = argv
    if role == "victim":
        victim(bootstrap, topic, float(seconds), Path(out), *rest)
    elif role == "flood":
        flood(
            bootstrap, topic, float(seconds), Path(out), rest[0] if rest else "flooder", int(rest[1]) if rest[1:] else 2
        )
    else:
        raise SystemExit(f"unknown role {role!r}: victim or flood")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
