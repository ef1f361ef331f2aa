"""No address can lock out the others (issue 30): file descriptors counted as used, and shedding the biggest
address's silent or idle connections to make room, as pure policy with an injected clock."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.connections import IDLE, NEVER_SPOKE, ConnectionQuotas


class Conn:
    """A stand-in connection: the policy keys on it, and asks the injected ``is_idle`` about it."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.last_active_ms = 0
        self.busy = False

    def __repr__(self) -> str:
        return f"Conn({self.ip})"


def quotas(**kw) -> ConnectionQuotas:
    idle_ms = kw.pop("idle_ms", 1000)

    def is_idle(c: Hashable, now: int) -> bool:
        assert isinstance(c, Conn)  # the keys these tests admit
        return not c.busy and now - c.last_active_ms >= idle_ms

    return ConnectionQuotas(is_idle=is_idle, **kw)


def fill(q: ConnectionQuotas, ip: str, n: int, now: int = 0) -> list[Conn]:
    out = []
    for _ in range(n):
        c = Conn(ip)
        if q.admit(c, ip, now) is not None:
            break
        out.append(c)
    return out


def test_a_connection_that_never_spoke_costs_one_fd_and_two_once_it_speaks():
    q = quotas(max_fds=10)
    flood = fill(q, "10.0.0.2", 100)
    assert len(flood) == 10 and q.fds == 10  # two per connection would have let only five in
    q2 = quotas(max_fds=10)
    a, b = Conn("10.0.0.1"), Conn("10.0.0.1")
    assert q2.admit(a, "10.0.0.1", 0) is None and q2.spoke(a, 0) is None and q2.fds == 2
    assert q2.spoke(a, 0) is None and q2.fds == 2  # only the first bytes take the broker's fd
    assert q2.admit(b, "10.0.0.1", 0) is None and q2.fds == 3
    q2.closed(a)
    q2.closed(b)
    assert q2.fds == 0 and q2.total == 0 and q2.addresses() == 0


def test_a_flood_of_silent_connections_is_shed_oldest_first_for_another_address():
    q = quotas(max_fds=10)
    flood = fill(q, "10.0.0.2", 100)
    normal = Conn("10.0.0.1")
    assert q.admit(normal, "10.0.0.1", 5) is None
    shed = q.take_shed()
    assert [(s.key, s.kind, s.ip, s.held, s.for_ip) for s in shed] == [
        (flood[0], NEVER_SPOKE, "10.0.0.2", 9, "10.0.0.1")
    ]
    assert q.spoke(normal, 6) is None  # its broker connection: one more of the flood's goes
    assert [s.key for s in q.take_shed()] == [flood[1]]
    assert q.fds == 10 and q.per_ip("10.0.0.2") == 8
    q.closed(flood[0])  # the caller closing a shed connection later: already uncounted, ignored
    assert q.fds == 10 and q.total == 9


def test_the_biggest_address_cannot_grow_by_shedding_and_equals_do_not_shed_each_other():
    q = quotas(max_fds=6)
    fill(q, "10.0.0.2", 6)
    assert q.admit(Conn("10.0.0.2"), "10.0.0.2", 0).reason == "open_files"  # itself: refused, nothing shed
    assert not q.take_shed()
    for _ in range(2):
        assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 0) is None
    assert q.per_ip("10.0.0.1") == 2 and q.per_ip("10.0.0.2") == 4
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 0) is None  # 4 against 2: one more shed, now 3 and 3
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 0).reason == "open_files"  # 3 against 3: no more
    assert len(q.take_shed()) == 3


def test_busy_connections_are_not_shed_idle_ones_are_after_shed_idle_ms():
    q = quotas(max_fds=8, idle_ms=1000)
    flood = fill(q, "10.0.0.2", 4)
    for c in flood:
        assert q.spoke(c, 0) is None  # 8 fds: all spoke
        c.last_active_ms = 0
    flood[2].busy = True
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 500).reason == "open_files"  # none quiet long enough
    flood[0].busy = flood[1].busy = True
    shed_at = 1500
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", shed_at) is None
    assert [(s.key, s.kind) for s in q.take_shed()] == [(flood[3], IDLE)]
    assert q.fds == 7  # two freed, one taken


def test_the_search_for_an_idle_connection_is_bounded_and_moves_on():
    asked = []
    q = ConnectionQuotas(max_fds=6000, is_idle=lambda c, now: asked.append(c) or c.last_active_ms < 0)
    flood = fill(q, "10.0.0.2", 3000)
    for c in flood:
        assert q.spoke(c, 0) is None
    flood[2500].last_active_ms = -1  # the one idle connection, far down the list
    outcomes = []
    for _ in range(3):
        asked.clear()
        outcomes.append(q.admit(Conn("10.0.0.1"), "10.0.0.1", 0))
        assert len(asked) <= 1024  # making room never walks all of an address's connections
    assert [r is None for r in outcomes] == [False, False, True]  # the third search starts where the others ended
    assert [s.key for s in q.take_shed()] == [flood[2500]]


def test_shedding_can_be_switched_off_and_then_refuses_as_kafka_does():
    q = quotas(max_fds=4, shed=False)
    fill(q, "10.0.0.2", 4)
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 0).reason == "open_files"
    assert not q.take_shed()


def test_max_connections_is_shared_the_same_way_and_its_refusal_keeps_its_name():
    q = quotas(max_connections=3)
    fill(q, "10.0.0.2", 3)
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 0) is None and len(q.take_shed()) == 1
    q2 = quotas(max_connections=3, shed=False)
    fill(q2, "10.0.0.2", 3)
    assert q2.admit(Conn("10.0.0.1"), "10.0.0.1", 0).reason == "max_connections"


def test_a_newcomer_refused_for_another_reason_costs_nobody_a_connection():
    q = quotas(max_fds=3, per_ip_overrides={"10.0.0.6": 0})
    fill(q, "10.0.0.2", 3)
    assert q.admit(Conn("10.0.0.6"), "10.0.0.6", 0).reason == "max_connections_per_ip"
    assert not q.take_shed() and q.per_ip("10.0.0.2") == 3


def test_a_first_request_with_nothing_to_shed_is_refused_and_uncounted():
    q = quotas(max_fds=2)
    a, b = Conn("10.0.0.1"), Conn("10.0.0.2")
    assert q.admit(a, "10.0.0.1", 0) is None and q.admit(b, "10.0.0.2", 0) is None
    assert q.spoke(a, 0) is None  # b, the biggest (tied) and silent, gives its fd
    assert [s.key for s in q.take_shed()] == [b] and q.fds == 2
    c = Conn("10.0.0.3")
    assert q.admit(c, "10.0.0.3", 0).reason == "open_files"  # 10.0.0.1 holds 1: not two more than none
    q3 = quotas(max_fds=1)
    d = Conn("10.0.0.1")
    assert q3.admit(d, "10.0.0.1", 0) is None
    assert q3.spoke(d, 0).reason == "open_files"  # never shed itself
    assert q3.fds == 0 and q3.total == 0 and q3.addresses() == 0


# -- invariants, over any sequence of events ------------------------------------------------------------
IPS = [f"10.0.0.{i}" for i in range(1, 6)]
EVENT = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(IPS)),
    st.tuples(st.just("speak"), st.integers(0, 10_000)),
    st.tuples(st.just("close"), st.integers(0, 10_000)),
    st.tuples(st.just("busy"), st.integers(0, 10_000)),
    st.tuples(st.just("tick"), st.integers(1, 2000)),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.one_of(st.none(), st.integers(1, 8)), st.lists(EVENT, max_size=120))
def test_caps_hold_counts_add_up_and_only_the_biggest_address_is_ever_shed(max_fds, max_conns, events):
    q = quotas(max_fds=max_fds, max_connections=max_conns, idle_ms=500)
    live: list[Conn] = []  # what the caller has not closed
    spoken: set[Conn] = set()
    now = 0
    for kind, arg in events:
        counts = {ip: q.per_ip(ip) for ip in IPS}
        if kind == "admit":
            c = Conn(arg)
            c.last_active_ms = now
            if q.admit(c, arg, now) is None:
                live.append(c)
            requester = arg
        elif kind in ("speak", "close", "busy") and live:
            c = live[arg % len(live)]
            requester = c.ip
            if kind == "speak":
                c.last_active_ms = now
                if q.spoke(c, now) is None:
                    spoken.add(c)
                else:
                    live.remove(c)  # refused: the caller closes it
            elif kind == "close":
                q.closed(c)
                live.remove(c)
                spoken.discard(c)
            else:
                c.busy = not c.busy
        else:
            now += arg if kind == "tick" else 0
            continue
        biggest = max(counts.values())
        for s in q.take_shed():
            assert counts[s.ip] == biggest, (s, counts)  # only an address holding the most is shed
            if kind == "admit":
                assert s.ip != requester and counts[s.ip] >= counts[requester] + 2
            assert s.kind == NEVER_SPOKE or not s.key.busy
            live.remove(s.key)
            spoken.discard(s.key)
        assert q.fds <= max_fds and (max_conns is None or q.total <= max_conns)
        assert q.total == len(live) and q.fds == len(live) + len(spoken)
        assert all(q.per_ip(ip) == sum(c.ip == ip for c in live) for ip in IPS)
        assert q.addresses() == len({c.ip for c in live})  # no state for an address without a connection


def test_over_a_lowered_limit_one_shed_is_not_room_and_nobody_is_shed():
    q = quotas(max_fds=6)
    fill(q, "10.0.0.2", 6)
    q.max_fds = 4  # a reload lowered it: the connections already open stay
    assert q.admit(Conn("10.0.0.1"), "10.0.0.1", 0).reason == "open_files"
    assert not q.take_shed() and q.fds == 6


# -- the glue: the proxy closes what the policy shed, counts it, logs it rate-limited -----------------------------
class _Transport:
    """A client socket's transport, as far as admission and closing use it."""

    def __init__(self, ip: str) -> None:
        self.peer = (ip, 40000)
        self.closed = False

    def get_extra_info(self, name, default=None):
        return self.peer if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def test_the_proxy_closes_shed_connections_counts_them_and_logs_one_line(caplog):
    import asyncio

    from prometheus_client import generate_latest

    from config.model import ProxyConfig
    from proxy.server import Proxy

    async def main():
        proxy = Proxy(ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]}}))
        proxy.connection_quotas.max_fds = 4  # as if the open-file limit left four

        def connect(ip: str) -> _Transport:
            transport = _Transport(ip)
            proxy._accept(None).connection_made(transport)
            return transport

        flood = [connect("127.0.0.2") for _ in range(6)]
        normal = [connect("127.0.0.1") for _ in range(2)]
        await asyncio.sleep(0)  # the closed connections' callbacks
        return proxy, flood, normal

    with caplog.at_level("WARNING", logger="proxy.server"):
        proxy, flood, normal = asyncio.run(main())
    assert [t.closed for t in flood] == [True, True, False, False, True, True]  # 2 shed (oldest), 2 refused
    assert not any(t.closed for t in normal)
    assert proxy.stats.connections_shed == {"never_spoke": 2}
    assert proxy.stats.connections_refused == {"open_files": 2}
    assert proxy.connection_quotas.fds == 4 and len(proxy.connections) == 4
    lines = [r.getMessage() for r in caplog.records if "shed a connection" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.2" in lines[0] and "127.0.0.1" in lines[0]
    text = generate_latest(proxy.registry).decode()
    assert 'ktp_connections_shed_total{kind="never_spoke"} 2.0' in text
    assert 'ktp_connections_refused_total{reason="open_files"} 2.0' in text


def test_a_first_request_the_proxy_has_no_broker_fd_for_closes_its_connection_uncounted():
    import asyncio

    from config.model import ProxyConfig
    from proxy.server import Proxy

    async def main():
        proxy = Proxy(ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]}}))
        proxy.connection_quotas.max_fds = 1  # room for a client socket, none for its broker's
        transport = _Transport("127.0.0.1")
        client = proxy._accept(None)
        client.connection_made(transport)
        client.data_received(b"\x00\x00\x00\x0a")
        await asyncio.sleep(0)
        return proxy, transport

    proxy, transport = asyncio.run(main())
    assert transport.closed
    assert proxy.stats.connections_refused == {"open_files": 1}
    assert proxy.connection_quotas.fds == 0 and proxy.connection_quotas.total == 0 and not proxy.connections
