"""A valid body of every API the proxy decodes, in every version kafka-python knows: what the fuzzers mutate
(``tests/unit/test_hostile_input.py``, ``tests/integration/test_hostile_clients.py``, ``bench.fuzz_proxy``).

:data:`BODIES` holds (api key, version, body bytes) for CreateTopics, DeleteTopics, CreatePartitions,
DescribeClientQuotas and AlterClientQuotas: the requests the proxy parses to charge or answer them.

:func:`fetch_request` is the one consumer Fetch the tests and benchmarks build by hand.
"""

from __future__ import annotations

import uuid

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeClientQuotasRequest,
)
from kafka.protocol.consumer import FetchRequest


def _bodies():
    ct = CreateTopicsRequest.CreatableTopic
    for v in range(CreateTopicsRequest.min_version, CreateTopicsRequest.max_version + 1):
        yield (
            19,
            v,
            CreateTopicsRequest(
                topics=[ct(name="a", num_partitions=3, replication_factor=1, assignments=[], configs=[])],
                timeout_ms=1,
                validate_only=False,
            ).encode(version=v),
        )
    for v in range(DeleteTopicsRequest.min_version, DeleteTopicsRequest.max_version + 1):
        r = (
            DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name="a", topic_id=None)], timeout_ms=1)
            if v >= 6
            else DeleteTopicsRequest(topic_names=["a", "b"], timeout_ms=1)
        )
        yield 20, v, r.encode(version=v)
    cp = CreatePartitionsRequest.CreatePartitionsTopic
    for v in range(CreatePartitionsRequest.min_version, CreatePartitionsRequest.max_version + 1):
        yield (
            37,
            v,
            CreatePartitionsRequest(
                topics=[cp(name="a", count=4, assignments=None)], timeout_ms=1, validate_only=False
            ).encode(version=v),
        )
    comp = DescribeClientQuotasRequest.ComponentData
    for v in range(DescribeClientQuotasRequest.min_version, DescribeClientQuotasRequest.max_version + 1):
        yield (
            48,
            v,
            DescribeClientQuotasRequest(
                components=[comp(entity_type="user", match_type=0, match="a")], strict=False
            ).encode(version=v),
        )
    e = AlterClientQuotasRequest.EntryData
    for v in range(AlterClientQuotasRequest.min_version, AlterClientQuotasRequest.max_version + 1):
        yield (
            49,
            v,
            AlterClientQuotasRequest(
                entries=[
                    e(
                        entity=[e.EntityData(entity_type="user", entity_name="a")],
                        ops=[e.OpData(key="producer_byte_rate", value=1000.0, remove=False)],
                    )
                ],
                validate_only=True,
            ).encode(version=v),
        )


BODIES = [(k, v, bytes(b)) for k, v, b in _bodies()]


def fetch_request(
    *topics: str | tuple[str | None, uuid.UUID | None],
    partition: int = 0,
    fetch_offset: int = 0,
    partition_max_bytes: int = 1 << 20,
    max_wait_ms: int = 500,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    replica_id: int = -1,
    version: int | None = None,
) -> FetchRequest:
    """A consumer's FetchRequest of ``partition`` of each of ``topics`` (a name, or (name, topic id): from v13 the
    id is what is sent), none when no topic is given; read uncommitted, no fetch session. ``version``, when
    given, is the one it encodes in (else the one it is sent with)."""
    part = FetchRequest.FetchTopic.FetchPartition
    named = [(t, None) if isinstance(t, str) else t for t in topics]
    fields = dict(
        replica_id=replica_id,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        topics=[
            FetchRequest.FetchTopic(
                topic=name,
                topic_id=topic_id,
                partitions=[
                    part(partition=partition, fetch_offset=fetch_offset, partition_max_bytes=partition_max_bytes)
                ],
            )
            for name, topic_id in named
        ],
    )
    return FetchRequest(**fields) if version is None else FetchRequest(version=version, **fields)
