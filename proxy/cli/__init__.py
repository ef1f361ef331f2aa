"""The command-line tools: what starts a proxy or talks to one from a shell.

* :mod:`proxy.cli.main`: ``kafka-throttle-proxy run|check-config|quotas|calibrate`` (the installed command, and
  ``python -m proxy.cli``);
* :mod:`proxy.cli.quota_admin`: its ``quotas describe|alter|delete`` subcommand, DescribeClientQuotas /
  AlterClientQuotas over one connection to a proxy;
* :mod:`proxy.cli.calibrate`: its ``calibrate`` subcommand, what the cluster's brokers charge each request
  (``quotas.request_costs``), measured straight against the cluster;
* :mod:`proxy.cli.supervisor`: ``workers: N``, the process that starts and restarts N proxy processes.

Nothing below ``proxy.cli`` imports it: the server learns which worker it is from its caller. This ``__init__``
imports nothing, so ``python -m proxy.cli`` costs the standard library only before the command is chosen.
"""
