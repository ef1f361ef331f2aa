import asyncio

import pytest

from protocol.addresses import BrokerEndpoint
from proxy.wire.brokers import BrokerDirectory, NoBrokerPort


class FakeListeners:
    def __init__(self):
        self.started: list[tuple[int, int]] = []

    async def __call__(self, node_id: int, port: int) -> int:
        self.started.append((node_id, port))
        return port or 40000 + len(self.started)


def test_new_brokers_get_listeners_once_at_first_plus_node_id():
    listeners = FakeListeners()
    d = BrokerDirectory("proxy.local", (19093, 19100), listeners)

    async def go():
        await d.learn([BrokerEndpoint(1, "k1", 9092), BrokerEndpoint(2, "k2", 9092)])
        await d.learn([BrokerEndpoint(1, "k1", 9092), BrokerEndpoint(3, "k3", 9092)])

    asyncio.run(go())
    assert listeners.started == [(1, 19094), (2, 19095), (3, 19096)]
    assert d.map_endpoint(BrokerEndpoint(3, "k3", 9092)) == ("proxy.local", 19096)
    assert d.upstream_of(2) == ("k2", 9092)


def test_moved_broker_keeps_its_listener_but_changes_upstream():
    listeners = FakeListeners()
    d = BrokerDirectory("p", None, listeners)
    asyncio.run(d.learn([BrokerEndpoint(5, "old", 1)]))
    asyncio.run(d.learn([BrokerEndpoint(5, "new", 2)]))
    assert len(listeners.started) == 1
    assert d.upstream_of(5) == ("new", 2)


def test_node_ids_beyond_the_range_take_free_ports_until_none_left():
    d = BrokerDirectory("p", (100, 101), FakeListeners())
    asyncio.run(d.learn([BrokerEndpoint(1000, "a", 1), BrokerEndpoint(1, "b", 1)]))
    assert d.ports == {1000: 100, 1: 101}
    with pytest.raises(NoBrokerPort, match="100-101 has no free port for broker 7"):
        asyncio.run(d.learn([BrokerEndpoint(7, "c", 1)]))


def test_unknown_broker_is_never_passed_through():
    d = BrokerDirectory("p", None, FakeListeners())
    with pytest.raises(LookupError, match="no proxy listener for broker 9"):
        d.map_endpoint(BrokerEndpoint(9, "k9", 9092))


def test_a_port_held_by_something_else_moves_the_broker_to_the_next_free_one():
    busy = {19094, 19095}

    class Busy(FakeListeners):
        async def __call__(self, node_id: int, port: int) -> int:
            if port in busy:
                raise OSError(98, "Address already in use")
            return await super().__call__(node_id, port)

    listeners = Busy()
    d = BrokerDirectory("p", (19093, 19096), listeners)
    asyncio.run(d.learn([BrokerEndpoint(1, "k1", 9092), BrokerEndpoint(2, "k2", 9092)]))
    assert d.ports == {1: 19093, 2: 19096}
    with pytest.raises(NoBrokerPort):
        asyncio.run(d.learn([BrokerEndpoint(3, "k3", 9092)]))
