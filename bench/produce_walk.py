"""Which of the project's files one Produce request walks through, client socket to upstream socket and back.

Why: the glue should be followable; this counts, by tracing every Python call (``sys.setprofile``), the project
files whose code runs for one Produce v11 request and its response once the connection is warm (the first
request compiles and caches per-version tables; the second shows the steady path). The connection is the real
``proxy.connection.Connection`` with the real policy; only the two sockets are stand-ins (transports that
record what is written), so no broker is needed: ``tests.harness.connection_rig``.

    .venv/bin/python -m bench.produce_walk
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.harness.connection_rig import ConnectionRig

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "protocol", "quotas", "mute", "config")
EVERY_QUOTA = {"producer_byte_rate": 10**12, "consumer_byte_rate": 10**12, "request_percentage": 10**6,
               "controller_mutation_rate": 10**6, "producer_ids_rate": 10**9}
"""Every quota kind configured for the client's user, none binding."""


async def walk(quotas: dict) -> list[str]:
    harness = ConnectionRig(quotas)
    files: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            try:
                rel = Path(frame.f_code.co_filename).resolve().relative_to(ROOT)
            except ValueError:
                return
            if rel.parts[0] in PACKAGES:
                files.add(str(rel))

    harness.round_trip(1)  # warm: per-version tables compiled once
    sys.setprofile(profile)
    try:
        harness.round_trip(2)
    finally:
        sys.setprofile(None)
    harness.conn.close()
    return sorted(files)


def main() -> None:
    for label, quotas in (("no quota", {}), ("every quota kind configured, none binding", EVERY_QUOTA)):
        files = asyncio.run(walk(quotas))
        print(f"{label}: {len(files)} files")
        for f in files:
            print(f"  {f}")


if __name__ == "__main__":
    main()
