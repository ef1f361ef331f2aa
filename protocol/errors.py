"""The one family of errors ``protocol/`` raises for bytes that do not follow the protocol.

Why one family: whoever drives the codecs (the connection) must tell "this peer sent something malformed: close
its connection with one line" from "the proxy has a bug: show the traceback". Every decoder raises a subclass of
:class:`ProtocolError` for the first, whatever the library underneath raised; anything else is the second.
A ValueError subclass, so callers that caught ValueError before still do.
"""

from __future__ import annotations


class ProtocolError(ValueError):
    """Bytes from a peer that cannot be followed; the message says what and where."""


class ProtocolViolation(ProtocolError):
    """The stream as a whole cannot be followed any more (found by whoever drives the decoders, e.g. a request
    version beyond what the proxy decodes); decoders raise the rest of the family themselves."""
