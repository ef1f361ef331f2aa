"""The policy and its rules: what decides on each request, with no socket and no clock of its own (the connection
passes the time in).

* :mod:`proxy.rules.policy`: the dispatcher, ``Policy.on_request`` / ``on_response``: every rule below is a step
  it hands the request (``protocol.request.Request``, read once) to;
* :mod:`proxy.rules.decisions` and :mod:`proxy.rules.verdicts`: what it decides (a ``Decision`` it alone fills) and
  the one type the connection executes;
* the rules: :mod:`proxy.rules.pacing` (smooth enforcement), :mod:`proxy.rules.fair_seat` (fair share),
  :mod:`proxy.rules.mutation_quota` with :mod:`proxy.rules.partition_counts` and :mod:`proxy.rules.topic_counts`
  (KIP-599), :mod:`proxy.rules.producer_id_charge` (KIP-936), :mod:`proxy.rules.guard_answers` (the proxy's own
  topics), :mod:`proxy.rules.client_quota_api` (Describe/AlterClientQuotas answered here);
* :mod:`proxy.rules.decision_recording`: each decision counted and logged at its response.

Nothing here imports :mod:`proxy.wire` but its topic-id table (learned from responses, read for the request
quota's replication term), nor :mod:`proxy.fleet`'s sync: the policy is built with the fleet's parts.
"""
