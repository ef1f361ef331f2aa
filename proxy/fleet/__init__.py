"""A fleet member: one of several proxies in front of one cluster, holding one quota together.

* :mod:`proxy.fleet.parts`: the member's lease holder, ledger and alter outbox, built first and handed to the
  policy and to the sync;
* :mod:`proxy.fleet.member`: ``FleetSync``, the member's leases, reports and alters over the cluster's topics (the
  pure rules are ``quotas.fleet_*``).
"""
