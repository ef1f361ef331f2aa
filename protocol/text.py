"""Client text made safe for a log line or a metric label.

Why: client ids, SASL mechanism names, principals and topic names are chosen by clients. Written raw, a newline
forges a log line and a terminal escape rewrites an operator's screen; unbounded, one field fills the log.
"""

from __future__ import annotations

MAX_TEXT = 200


def printable(text: object, limit: int = MAX_TEXT) -> str:
    """``text`` with every character outside printable ASCII escaped (``\\n``, ``\\x1b``, ``\\u2028``) and cut
    to ``limit`` characters (marked with ``...``). Backslashes are escaped too, so the result is unambiguous."""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable() and "\\" not in s and len(s) <= limit:
        return s  # the usual case, without a copy
    out = s.encode("unicode_escape").decode("ascii")
    return out if len(out) <= limit else out[: max(limit - 3, 0)] + "..."
