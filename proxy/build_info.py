"""Which build of the per-request modules is running: compiled by mypyc, or the pure-Python source.

Why: ``scripts/setup`` compiles the modules below with mypyc when it can (about 70 % fewer instructions
per request, see BENCHMARKS.md) and falls back to the same source, uncompiled, when it cannot. An operator should see
which one a proxy runs, and a developer must never test a compiled module older than its source (Python imports
the extension module ahead of the ``.py`` beside it, so an edit would be silently ignored).

``setup.py`` and ``scripts/setup`` load this file before anything is installed: it imports the standard library only.

Compiled, type annotations are checked at run time: a bytearray (what kafka-python's ``encode`` returns) passed
or returned under a ``bytes`` annotation raises TypeError where the pure source would carry on. Keep annotations
on these modules, and on what they call, true; the integration tests run the compiled build.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from pathlib import Path

COMPILED = (
    # Pure logic on the per-request path (bench/request_cpu.py's profile), compiled as one group.
    "protocol.varint",
    "protocol.skim",
    "protocol.headers",
    "protocol.frames",
    "protocol.inflight",
    "protocol.session",
    "protocol.request",  # the request as read: every rule takes it
    "protocol.record_batches",
    "protocol.endpoint_apis",  # every Produce v10+ / Fetch v16+ response is checked for node_endpoints
    "protocol.request_fields",  # Fetch's replica id and max_bytes, read by the policy
    "quotas.rate",
    "quotas.manager",
    "quotas.throttle",
    "quotas.token_bucket",
    "quotas.kinds",
    "quotas.plans",  # the bound plan whose handles every charged request reads
    "quotas.fair_share",  # fair share: every request counted, every answer sampled while it is on
    "proxy.rules.policy",
    "proxy.rules.decisions",  # the Decision every charged request fills, read natively by the modules below
    "proxy.rules.decision_recording",  # every decision counted at its response
    "proxy.rules.producer_id_charge",  # every Produce under producer_ids_rate
    "proxy.rules.pacing",  # smooth enforcement: every paced Fetch
    "proxy.rules.fair_seat",  # fair share's per-request steps
    "mute.holds",  # the policy asks it about KIP-936 holds on every Produce
    "mute.channel",  # the connection reads its ``held`` after every request (uncompiled, a generic attribute read)
    # Every attribute of the connection is annotated (one mypy inferred from a first None refused what the policy
    # stored later) and its transports are typed Any (uvloop's are not asyncio's classes).
    "proxy.wire.connection",
    "proxy.wire.connection_life",  # the connection's base class: its pauses and resumes run per request
    "proxy.wire.sockets",  # the loop's callbacks: every read
    "proxy.stats",  # counters bumped per request
    "proxy.wire.responses",  # inspect_response: every response
    # Not quotas/entities.py: it validates configuration from files and the wire, and relies on wrong types
    # reaching its checks (mypyc would raise TypeError at the call instead of QuotaEntityError/QuotaValueError).
)

_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def compiled_sources() -> list[str]:
    """The source files of :data:`COMPILED`, relative to the repository (what setup.py hands mypyc)."""
    return [name.replace(".", "/") + ".py" for name in COMPILED]


def compiled_modules() -> list[str]:
    """The modules of :data:`COMPILED` that were loaded from an extension module (imports them)."""
    return [name for name in COMPILED if str(importlib.import_module(name).__file__).endswith(_EXTENSIONS)]


def stale_modules() -> list[str]:
    """Modules whose compiled file sits beside a newer source file: the source changed since the build, and
    Python would run the old compiled code. Looked up on disk, without importing."""
    out = []
    for name in COMPILED:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(_EXTENSIONS):
            continue
        source = Path(spec.origin).parent / (name.rsplit(".", 1)[1] + ".py")
        if source.exists() and source.stat().st_mtime > Path(spec.origin).stat().st_mtime:
            out.append(name)
    return out


def describe() -> str:
    """One line for the startup log."""
    compiled = compiled_modules()
    if not compiled:
        return "per-request modules: pure Python (not compiled; scripts/setup compiles them when it can)"
    if len(compiled) == len(COMPILED):
        return f"per-request modules: compiled by mypyc ({len(compiled)} modules)"
    return f"per-request modules: {len(compiled)} of {len(COMPILED)} compiled by mypyc"
