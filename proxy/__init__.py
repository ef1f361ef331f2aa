"""The asyncio glue: the only I/O of the proxy, in packages named for their job (a request walks them in this
order: socket → frame → decision → forward or answer → response rewrite → socket).

* :mod:`proxy.wire`: a client's connection and everything that carries its bytes (the sockets, TLS, the
  response rewrites and the broker directory they keep, the loop's lag, the cluster asked at start);
* :mod:`proxy.rules`: the policy and its rules, what decides on each request (quotas, pacing, fair share,
  KIP-599/936, the protected topics, the quota APIs, the decision's record);
* :mod:`proxy.fleet`: a fleet member's sync with the others (leases, reports) over the cluster;
* :mod:`proxy.decision_log`: the decision log's writers;
* :mod:`proxy.cli`: the command-line tools;
* at the top, what composes them: :mod:`proxy.server` (listeners, upstreams, reloads), :mod:`proxy.metrics`,
  :mod:`proxy.stats` (the counters every package bumps) and :mod:`proxy.build_info` (what is compiled).

``tests/unit/test_layers.py`` keeps the arrows between them one way: the rules never import the wire or the fleet's
sync, the wire never imports the fleet, and nothing but the server and the CLI imports the server.
"""
