"""A client's connection and everything that carries its bytes, both ways.

* :mod:`proxy.wire.connection` (with its base :mod:`proxy.wire.connection_life`): one client connection and its
  upstream, carrying out what the session (``protocol.session``) read and the policy (:mod:`proxy.rules.policy`)
  decided: forward, answer, wait, mute;
* :mod:`proxy.wire.sockets`: the two sockets as asyncio protocols; :mod:`proxy.wire.tls`: SSL contexts and a
  handshake's principal;
* :mod:`proxy.wire.responses`: each response on its way back (broker addresses, ApiVersions, protected topics
  left out, the topic ids learned), and :mod:`proxy.wire.brokers`, the broker directory it keeps;
* :mod:`proxy.wire.loop_lag`: how late the event loop runs (every connection shares it);
* :mod:`proxy.wire.discovery`, :mod:`proxy.wire.quota_import`: the cluster asked at start (its brokers, its own
  client quotas).
"""
