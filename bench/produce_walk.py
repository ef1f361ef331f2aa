"""Which of the project's files one Produce request walks through, client socket to upstream socket and back.

Why: the glue should be followable; this counts, by tracing every Python call (``sys.setprofile``), the project
files whose code runs for one Produce v11 request and its response once the connection is warm (the first
request compiles and caches per-version tables; the second shows the steady path). The connection is the real
``proxy.wire.connection.Connection`` with the real policy; only the two sockets are stand-ins (transports that
record what is written), so no broker is needed: ``tests.harness.connection_rig``.

    .venv/bin/python -m bench.produce_walk [--calls]

``--calls``: instead, the calls into the connection, the session and the mute, in order, for three Produce
requests read together when one is charged over its quota: what decides that the rest wait (the session) and
what carries it out (the connection). Compiled modules hide their calls from ``sys.setprofile``: run it on the
pure-Python source (a copy of the tree without the ``.so`` files, as ``scripts/test`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from protocol.session import Pause
from tests.harness.connection_rig import ConnectionRig, produce_request

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "protocol", "quotas", "mute", "config")
EVERY_QUOTA = {
    "producer_byte_rate": 10**12,
    "consumer_byte_rate": 10**12,
    "request_percentage": 10**6,
    "controller_mutation_rate": 10**6,
    "producer_ids_rate": 10**9,
}
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


TRACED = (
    "proxy/wire/connection.py",
    "proxy/wire/connection_life.py",
    "proxy/wire/sockets.py",
    "protocol/session.py",
    "mute/channel.py",
)


async def calls_over_quota() -> list[str]:
    """The calls into :data:`TRACED` while three Produce requests, read together, meet a byte-rate quota: the one
    that overdraws it is forwarded and holds the mute, and the session keeps the rest until the mute is over."""
    rig = ConnectionRig({"producer_byte_rate": 1024}, value_bytes=4096)
    rig.round_trip(1)  # warm, and over the quota from now on
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            for name in TRACED:
                if path.endswith(name):
                    fn = frame.f_code.co_qualname
                    if not fn.startswith("<"):
                        seen.append(f"{name}:{fn}")

    conn = rig.conn
    conn.mute.cancel()  # the first round trip's throttle: start this one unmuted
    conn.resume(conn.client, Pause.MUTED)
    sys.setprofile(profile)
    try:
        conn.client.data_received(b"".join(produce_request(corr, 1, 4096) for corr in (2, 3, 4)))
    finally:
        sys.setprofile(None)
    conn.close()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--calls", action="store_true", help="the calls of three Produce requests read together, one over its quota"
    )
    args = ap.parse_args()
    from proxy.build_info import compiled_modules

    if compiled_modules():
        print(
            "note: compiled modules are loaded; their calls are invisible to sys.setprofile (run it on the "
            "pure-Python source for a full list)",
            file=sys.stderr,
        )
    if args.calls:
        for call in asyncio.run(calls_over_quota()):
            print(call)
        return
    for label, quotas in (("no quota", {}), ("every quota kind configured, none binding", EVERY_QUOTA)):
        files = asyncio.run(walk(quotas))
        print(f"{label}: {len(files)} files")
        for f in files:
            print(f"  {f}")


if __name__ == "__main__":
    main()
