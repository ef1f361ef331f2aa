"""The APIs whose responses are known to carry no broker address, and up to which version.

Why: the proxy rewrites broker addresses only in the responses ``protocol.addresses`` decodes
(``ADDRESS_APIS``) and withdraws the APIs it cannot rewrite (``protocol.api_versions.WITHDRAWN``);
every other API is forwarded as opaque bytes at whatever version the broker advertises. A new
Kafka release can add an API, or a version of an old one, whose response names brokers (KIP-951
added ``NodeEndpoints`` to Produce v10 and Fetch v16, KIP-853 added ``Nodes[].Listeners`` to
DescribeQuorum v2); forwarded unread, it would hand clients an address that bypasses the proxy.
So an API is forwarded unread only as far as this table vouches for it, and
``tests/integration/test_api_coverage.py`` fails when the cluster speaks an API or a version
that is neither rewritten, withdrawn nor listed here.

How it was checked: against apache/kafka's message specs
(``clients/src/main/resources/common/message/*Response.json``) as shipped in
``kafka-clients-4.4.0.jar``, every response whose request lists ``"broker"`` among its
``listeners`` (the APIs a broker's client listener serves; controller-only APIs such as Vote or
UpdateRaftVoter never reach the proxy). A response carries an address if, at some version, it has
a ``Host``/``Port`` field, or a ``NodeEndpoints``/``Leader…``/``Listeners`` struct holding
host and port, at any depth (``commonStructs`` included). Fields named like that which are not
broker addresses were read and accepted:

* ``ClientHost`` (DescribeGroups, ConsumerGroupDescribe, ShareGroupDescribe, StreamsGroupDescribe):
  the address a *client* connected from;
* ``Host`` in DescribeAcls/DeleteAcls: an ACL's host pattern;
* ``UserEndpoint{Host, Port}`` in StreamsGroupHeartbeat/StreamsGroupDescribe: the
  ``application.server`` a Kafka Streams instance announces for interactive queries, set by
  clients, never a broker's.

The value is the highest version checked; a version above it is unexamined, not address-free.
DescribeQuorum is listed up to v1 only: from v2 its ``Nodes[].Listeners`` name every controller's
host and port (``tests/integration/test_api_coverage.py`` records the proxy forwarding them).
To extend the table for a new release: read the new ``*Response.json`` files (or run the
integration test, which walks the cluster's own jar the same way) and raise the versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

CHECKED_AGAINST: Final = "4.4.0"
"""The apache/kafka release whose message specs the table was read from."""

ADDRESS_FREE: Final[Mapping[int, int]] = MappingProxyType({
    2: 11,  # ListOffsets
    8: 10,  # OffsetCommit
    9: 10,  # OffsetFetch
    11: 9,  # JoinGroup
    12: 4,  # Heartbeat
    13: 5,  # LeaveGroup
    14: 5,  # SyncGroup
    15: 6,  # DescribeGroups (ClientHost: the client's address)
    16: 5,  # ListGroups
    17: 1,  # SaslHandshake
    18: 5,  # ApiVersions
    19: 7,  # CreateTopics
    20: 6,  # DeleteTopics
    21: 2,  # DeleteRecords
    22: 6,  # InitProducerId
    23: 4,  # OffsetForLeaderEpoch
    24: 5,  # AddPartitionsToTxn
    25: 4,  # AddOffsetsToTxn
    26: 5,  # EndTxn
    27: 2,  # WriteTxnMarkers
    28: 6,  # TxnOffsetCommit
    29: 3,  # DescribeAcls (Host: an ACL's host pattern)
    30: 3,  # CreateAcls
    31: 3,  # DeleteAcls (Host: an ACL's host pattern)
    32: 4,  # DescribeConfigs
    33: 2,  # AlterConfigs
    34: 2,  # AlterReplicaLogDirs
    35: 5,  # DescribeLogDirs
    36: 2,  # SaslAuthenticate
    37: 3,  # CreatePartitions
    38: 3,  # CreateDelegationToken
    39: 2,  # RenewDelegationToken
    40: 2,  # ExpireDelegationToken
    41: 3,  # DescribeDelegationToken
    42: 3,  # DeleteGroups
    43: 2,  # ElectLeaders
    44: 1,  # IncrementalAlterConfigs
    45: 1,  # AlterPartitionReassignments
    46: 0,  # ListPartitionReassignments
    47: 0,  # OffsetDelete
    48: 1,  # DescribeClientQuotas
    49: 1,  # AlterClientQuotas
    50: 0,  # DescribeUserScramCredentials
    51: 0,  # AlterUserScramCredentials
    55: 1,  # DescribeQuorum: v2+ carries Nodes[].Listeners{Host, Port} (controller addresses)
    57: 2,  # UpdateFeatures
    61: 0,  # DescribeProducers
    64: 0,  # UnregisterBroker
    65: 0,  # DescribeTransactions
    66: 2,  # ListTransactions
    68: 1,  # ConsumerGroupHeartbeat
    69: 1,  # ConsumerGroupDescribe (ClientHost)
    71: 0,  # GetTelemetrySubscriptions
    72: 0,  # PushTelemetry
    74: 1,  # ListConfigResources
    75: 0,  # DescribeTopicPartitions
    76: 1,  # ShareGroupHeartbeat
    77: 1,  # ShareGroupDescribe (ClientHost)
    80: 1,  # AddRaftVoter
    81: 0,  # RemoveRaftVoter
    83: 0,  # InitializeShareGroupState
    84: 0,  # ReadShareGroupState
    85: 1,  # WriteShareGroupState
    86: 0,  # DeleteShareGroupState
    87: 1,  # ReadShareGroupStateSummary
    88: 1,  # StreamsGroupHeartbeat (UserEndpoint: a Streams instance's application.server)
    89: 1,  # StreamsGroupDescribe (ClientHost; UserEndpoint as above)
    90: 1,  # DescribeShareGroupOffsets
    91: 0,  # AlterShareGroupOffsets
    92: 0,  # DeleteShareGroupOffsets
    93: 0,  # StreamsGroupTopologyDescriptionUpdate
    94: 0,  # UnregisterController
})  # fmt: skip
"""API key -> highest version whose response is known to carry no broker address."""

NOT_BROKER_ADDRESSES: Final = frozenset({"ClientHost", "UserEndpoint"})
"""Spec field names that look like addresses but are not brokers' (see the module docstring); the
ACL ``Host`` is told apart by its API (:data:`ACL_HOST_APIS`), as its name is the plain ``Host``."""

ACL_HOST_APIS: Final = frozenset({29, 31})
"""DescribeAcls and DeleteAcls: their ``Host`` is an ACL's host pattern."""


def address_free(api_key: int, version: int) -> bool:
    """Whether the response to ``api_key`` at ``version`` is known to carry no broker address."""
    checked = ADDRESS_FREE.get(api_key)
    return checked is not None and version <= checked


def offered_caps(decoded: Mapping[int, int]) -> dict[int, int]:
    """The highest version of each API clients may use through the proxy (what ApiVersions advertises and what a
    request may carry): the APIs the proxy decodes up to the schemas it decodes them with (``decoded``), every
    other one up to the version vouched for here. A version a newer Kafka adds, which might start naming
    brokers (as DescribeQuorum v2 did), is then never negotiated through the proxy until someone has read it."""
    return {**ADDRESS_FREE, **decoded}
