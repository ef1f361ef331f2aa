"""A valid body of every API the proxy decodes, in every version kafka-python knows: what the fuzzers mutate
(``tests/unit/test_hostile_input.py``, ``tests/integration/test_hostile_clients.py``, ``bench.fuzz_proxy``).

:data:`BODIES` holds (api key, version, body bytes) for CreateTopics, DeleteTopics, CreatePartitions,
DescribeClientQuotas and AlterClientQuotas: the requests the proxy parses to charge or answer them.
"""

from __future__ import annotations

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeClientQuotasRequest,
)


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
