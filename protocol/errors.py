"""The one family of errors ``protocol/`` raises for bytes that do not follow the protocol.

Why one family: whoever drives the codecs (the connection) must tell "this peer sent something malformed: close
its connection with one line" from "the proxy has a bug: show the traceback". Every decoder raises a subclass of
:class:`ProtocolError` for the first, whatever the library underneath raised; anything else is the second.
A ValueError subclass, so callers that caught ValueError before still do.

Each class names its ``kind``: the ``reason`` label of ``ktp_connection_errors_total`` when it closes a
connection. A class attribute, not a reading of the message: a reworded message must not move a metric.
"""

from __future__ import annotations

from typing import ClassVar


class ProtocolError(ValueError):
    """Bytes from a peer that cannot be followed; the message says what and where."""

    kind: ClassVar[str] = "protocol"


class ProtocolViolation(ProtocolError):
    """The stream as a whole cannot be followed any more (found by whoever drives the decoders, e.g. a request
    version beyond what the proxy decodes); decoders raise the rest of the family themselves."""


class MalformedRequest(ProtocolViolation):
    """A request whose body (or a record batch in it) the proxy had to read and could not."""

    kind: ClassVar[str] = "malformed_request"
