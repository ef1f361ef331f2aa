"""proxy.rules.policy.Policy without a socket or a cluster: an injected clock, a plain object as the connection.

Every quota kind's decision (charged at request or at response, never-charged APIs, replica fetches), the
throttle written into the response and the mute that follows it, shadow mode, and KIP-599 splitting and
merging. The KIP-936 holds are tests/unit/test_policy_holds.py.
"""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from config.model import ProxyConfig
from protocol.apis import Api
from protocol.headers import RequestHeader, encode_response_header, parse_request_header
from protocol.inflight import Pending, produce_acks
from protocol.request import read_request
from proxy.rules.decisions import ConnState
from proxy.rules.policy import Decision, Policy
from proxy.rules.verdicts import Answer, Defer, Replace
from proxy.stats import Stats, Traffic
from quotas.entities import QuotaEntity
from quotas.kinds import (
    BIT,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    DEFAULT_THREAD_COST_MS,
    FETCH,
    FETCH_BARE_BYTES,
    FETCH_HEAD_BYTES,
    FETCH_HEAD_MS_PER_KIB,
    KINDS,
    LIST_OFFSETS,
    PRODUCE,
    PRODUCE_ACKS_ALL_MS,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    THREAD_COST_MS,
    has_response_term,
    keys_of,
    request_percent,
    thread_ms,
    thread_percent,
)
from tests.harness.request_bodies import fetch_request

_SIZE = struct.Struct(">i")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeMute:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def hold(self) -> None:
        self.calls.append(("hold", 0.0))

    def served(self, seconds: float) -> None:
        self.calls.append(("served", seconds))

    def mute_for(self, seconds: float) -> None:
        self.calls.append(("mute_for", seconds))


class FakeConn:
    """All a policy may touch of a connection (proxy.rules.verdicts.PolicyConnection)."""

    def __init__(self, principal: str = "alice", client_id: str = "app") -> None:
        self.id, self.peer, self.label, self.client_id = "1", "127.0.0.1:1", "broker 1", client_id
        self.identity = type("I", (), {"principal": principal})()
        self.upstream_addr = ("127.0.0.1", 9092)
        self.mute = FakeMute()
        self.traffic = Traffic()
        self.policy_state = None

    async def ask(self, api_key: int, api_version: int, body: bytes) -> bytes:
        raise AssertionError("no cluster lookup expected in these tests")


def _with_client_id(header: RequestHeader, client_id: str) -> RequestHeader:
    return RequestHeader(header.api_key, header.api_version, header.correlation_id, client_id, header.body_offset)


def _policy(clock: Clock, enforce: bool = True, keep_values: bool = True, **quotas) -> Policy:
    """``keep_values``: decisions keep what each quota recorded, as with the decision log on (the tests read it)."""
    policy = Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "quotas": {
                    "enforce": enforce,
                    "enforcement": "kafka",  # Kafka's semantics are what these tests check (smooth: the default)
                    "window_num": 2,
                    "window_size_seconds": 1,
                    "controller_window_num": 2,
                    "controller_window_size_seconds": 1,
                    "entities": [{"entity": {"user": "alice"}, "quotas": quotas}],
                },
            }
        ),
        Stats(),
        clock=clock,
    )
    policy.keep_values = keep_values
    return policy


def _request(req, corr: int = 1):
    req.with_header(correlation_id=corr, client_id="app")
    frame = bytes(req.encode(header=True, framed=True))  # the whole frame, as the connection hands it on
    return parse_request_header(frame, 4), frame


def _produce(n_bytes: int = 2000, pid: int = -1, acks: int = -1):
    b = MemoryRecordsBuilder(
        2, 0, 1 << 20, producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1
    )
    b.append(0, b"k", b"v" * n_bytes)
    b.close()
    TD = ProduceRequest.TopicProduceData
    return _request(
        ProduceRequest(
            transactional_id=None,
            acks=acks,
            timeout_ms=1000,
            version=7,
            topic_data=[TD(name="t", partition_data=[TD.PartitionProduceData(index=0, records=b.buffer())])],
        )
    )


def _fetch(replica_id: int = -1):
    return _request(fetch_request(replica_id=replica_id, version=4))


def _response_frame(header, body: bytes, flexible: bool = False) -> memoryview:
    head = encode_response_header(header.correlation_id, flexible)
    return memoryview(_SIZE.pack(len(head) + len(body)) + head + body)


def _throttle_in(pieces, offset: int = 8) -> int:
    return _SIZE.unpack_from(b"".join(bytes(p) for p in pieces), offset)[0]


def test_no_quota_decides_nothing():
    clock = Clock()
    policy = _policy(clock, producer_byte_rate=1)  # alice's; bob has none
    header, request = _produce()
    assert policy.on_request(FakeConn("bob"), read_request(header, request), clock()) is None


def test_produce_over_byte_rate_holds_reads_and_throttles_the_response():
    clock = Clock()
    policy = _policy(clock, producer_byte_rate=1000)
    conn = FakeConn()
    header, request = _produce(5000)
    d = policy.on_request(conn, read_request(header, request), clock())
    assert isinstance(d, Decision)
    amount, limit, throttle = d.values[PRODUCER_BYTE_RATE]
    assert amount == len(request) - 4 and limit == 1000 and throttle > 0 and d.throttle_ms == throttle
    assert conn.mute.calls == [("hold", 0.0)]
    # The broker answers with throttle 0: the proxy's throttle goes into the field, then the mute is served.
    produce_body = b"\x00\x00\x00\x00" + _SIZE.pack(0)  # no topics, throttle_time_ms 0 (v7: after the array)
    pieces = policy.on_response(conn, Pending(header, clock(), d), _response_frame(header, produce_body), clock())
    assert _throttle_in(pieces, 12) == throttle
    assert conn.mute.calls[-1] == ("served", throttle / 1000)


def test_produce_under_byte_rate_passes_untouched():
    clock = Clock()
    policy = _policy(clock, producer_byte_rate=10**9)
    conn = FakeConn()
    header, request = _produce(100)
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.throttle_ms == 0 and conn.mute.calls == []
    frame = _response_frame(header, b"\x00\x00\x00\x00" + _SIZE.pack(0))
    assert policy.on_response(conn, Pending(header, clock(), d), frame, clock()) is None


def test_fetch_is_charged_its_response_size_and_muted_after():
    clock = Clock()
    policy = _policy(clock, consumer_byte_rate=1)
    conn = FakeConn()
    header, request = _fetch()
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.values == {} and [k.key for k, _handle, _basis in d.later] == [CONSUMER_BYTE_RATE]
    fetch_body = _SIZE.pack(0) + b"\x00\x00\x00\x00" + bytes(200)  # throttle_time_ms, no topics, padding
    frame = _response_frame(header, fetch_body)
    pieces = policy.on_response(conn, Pending(header, clock(), d), frame, clock())
    amount, _limit, throttle = d.values[CONSUMER_BYTE_RATE]
    assert amount == len(frame) - 4 and throttle > 0
    assert _throttle_in(pieces) == throttle
    assert conn.mute.calls == [("mute_for", throttle / 1000)]


def test_replica_fetches_are_never_charged():
    clock = Clock()
    policy = _policy(clock, consumer_byte_rate=1)
    header, request = _fetch(replica_id=2)
    assert policy.on_request(FakeConn(), read_request(header, request), clock()) is None


def _round_trip(policy, conn, clock, header, request, body: bytes, upstream_s: float) -> float:
    """One round trip taking ``upstream_s`` of the injected clock: what request_percentage was charged."""
    d = policy.on_request(conn, read_request(header, request), clock())
    sent = clock()
    clock.now += upstream_s
    policy.on_response(conn, Pending(header, sent, d), _response_frame(header, body), clock())
    return d.values[REQUEST_PERCENTAGE][0]


def _expected(header, request, body: bytes | None) -> float:
    """quotas.kinds.request_percent for that round trip, in percent-seconds of one thread: ``body`` is the previous
    answer of that API on the connection (None: the first), whose size the estimate's response term takes."""
    response = len(_response_frame(header, body)) - 4 if body is not None else 0
    acks = produce_acks(request, header, 4) if header.api_key == Api.PRODUCE else 1
    return request_percent(header.api_key, len(request) - 4, response, acks)


@pytest.mark.parametrize("upstream_s", [0.0001, 0.2, 5.0])
def test_request_percentage_charges_estimated_thread_time_not_upstream_time(upstream_s):
    """KIP-124 as a broker counts it: the same Metadata costs the same whether the broker took 0.1 ms or 5 s
    to answer (queues, a slow link: no thread time of its own)."""
    clock = Clock()
    policy = _policy(clock, request_percentage=1000)
    header, request = _request(MetadataRequest(topics=None, version=1))
    body = bytes(16)
    conn = FakeConn()
    first = _round_trip(policy, conn, clock, header, request, body, upstream_s)
    assert first == pytest.approx(_expected(header, request, None))
    charged = _round_trip(policy, conn, clock, header, request, body, upstream_s)
    assert charged == pytest.approx(_expected(header, request, body))
    assert 0.0015 < charged < 0.004  # 15-40 microseconds of a thread, never the 200 ms the clock moved


def test_a_request_sent_alone_is_charged_its_alone_base_one_behind_others_the_pipelined_one():
    """A consumer's Fetch (nothing else of its connection awaiting an answer: the session's ``Request.alone``) is
    charged the calibrated alone base, the same Fetch sent behind another the pipelined one: the brokers held a
    Fetch sent one at a time to half the requests of one sent sixteen in flight (issue 50). An API without an
    alone base is charged the same either way."""
    clock = Clock()
    cfg = ProxyConfig.model_validate(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
            "quotas": {
                "enforcement": "kafka",
                "request_costs": {"apis": {"Fetch": {"base_ms": 0.02, "alone_base_ms": 0.05}}},
                "entities": [{"entity": {"user": "alice"}, "quotas": {"request_percentage": 1000}}],
            },
        }
    )
    policy = Policy(cfg, Stats(), clock=clock)
    policy.keep_values = True
    costs = cfg.quotas.request_costs.costs()
    conn = FakeConn()

    def charged(header, request, alone: bool) -> float:
        r = read_request(header, request)
        r.alone = alone
        return policy.on_request(conn, r, clock()).values[REQUEST_PERCENTAGE][0]

    header, request = _fetch()
    alone = charged(header, request, True)
    assert alone == pytest.approx(costs.request_percent(Api.FETCH, len(request) - 4, 0, alone=True))
    behind = charged(header, request, False)
    assert behind == pytest.approx(costs.request_percent(Api.FETCH, len(request) - 4, 0))
    assert alone - behind == pytest.approx(0.003)  # (0.05 - 0.02) ms in percent-seconds
    meta_h, meta_r = _request(MetadataRequest(topics=None, version=1))
    assert charged(meta_h, meta_r, True) == charged(meta_h, meta_r, False) > 0


@pytest.mark.parametrize("upstream_s", [0.0001, 0.5])
def test_fetch_is_charged_its_work_whether_it_returns_at_once_or_waits_out_max_wait(upstream_s):
    clock = Clock()
    policy = _policy(clock, request_percentage=1000)
    header, request = _fetch()
    body = _SIZE.pack(0) + bytes(4)
    conn = FakeConn()
    _round_trip(policy, conn, clock, header, request, body, upstream_s)
    charged = _round_trip(policy, conn, clock, header, request, body, upstream_s)
    assert charged == pytest.approx(_expected(header, request, body)) and charged > 0


def test_produce_with_acks_all_is_charged_its_work_not_the_replication_wait():
    clock = Clock()
    policy = _policy(clock, request_percentage=1000)
    conn = FakeConn()
    small_h, small_r = _produce(10)
    body = bytes(4) + _SIZE.pack(0)
    quick = _round_trip(policy, conn, clock, small_h, small_r, body, 0.0002)
    waited = _round_trip(policy, conn, clock, small_h, small_r, body, 0.3)  # acks=-1: the followers' fetch
    assert quick == waited == pytest.approx(_expected(small_h, small_r, body)) and quick > 0
    big_h, big_r = _produce(100_000)  # more bytes to copy and check: more thread time
    big = _round_trip(policy, conn, clock, big_h, big_r, body, 0.0002)
    assert big > quick and big == pytest.approx(_expected(big_h, big_r, body))


def test_thread_time_per_api_base_and_byte_terms():
    """The estimate's shape: a fixed cost per API, then linear in request and response KiB (Fetch steeper over
    its response's first FETCH_HEAD_BYTES); unlisted APIs use the default row; no term is negative and none
    depends on time."""
    for key, (base, per_in, per_out) in {**THREAD_COST_MS, 999: DEFAULT_THREAD_COST_MS}.items():
        head = FETCH_HEAD_MS_PER_KIB * FETCH_HEAD_BYTES / 1024 if key == FETCH else 0.0
        assert thread_ms(key, 0, 0) == pytest.approx(base)
        assert thread_ms(key, 1024, 0) == pytest.approx(base + per_in)
        assert thread_ms(key, 0, 2048 + FETCH_BARE_BYTES) == pytest.approx(
            base + (2048 + FETCH_BARE_BYTES) / 1024 * per_out + head
        )
        assert 0 < base < 0.1 and per_in >= 0 and per_out >= 0
    # What the flooders send: a few hundred bytes, each charged within the 0.035-0.065 ms their brokers did
    # (BENCHMARKS.md run 8, 48-s phases: 0.040-0.058 ms in the proxy's units).
    for key in (PRODUCE, FETCH, LIST_OFFSETS):
        assert 0.035 < thread_ms(key, 200, 100) < 0.065


def test_acks_0_produce_is_charged_no_thread_time():
    """A broker records an acks=0 Produce exempt from the request quota (``KafkaApis``:
    ``sendNoOpResponseExemptThrottle``), so the proxy charges it nothing; its bytes still count (issue 50)."""
    clock = Clock()
    policy = _policy(clock, request_percentage=1000)
    conn = FakeConn()
    header, request = _produce(10, acks=0)
    d = policy.on_request(conn, read_request(header, request), clock())
    policy.on_unanswered(conn, d)
    assert d.values[REQUEST_PERCENTAGE][0] == 0.0
    header, request = _produce(10, acks=1)
    d = policy.on_request(conn, read_request(header, request), clock())
    charged = d.values[REQUEST_PERCENTAGE][0]
    assert charged > 0 and charged == pytest.approx(_expected(header, request, None))


def test_request_percentage_binds_at_the_rate_its_estimate_allows():
    """P = 1 % is 10 ms of thread a second: with ~0.025 ms a request a Metadata loop is held near 400/s, not the
    ~100/s that a 0.1 ms upstream round trip charged as wall time allowed."""
    clock = Clock()
    policy = _policy(clock, request_percentage=1)
    conn = FakeConn()
    header, request = _request(MetadataRequest(topics=None, version=1))
    body = bytes(16)
    per = _expected(header, request, body)  # percent-seconds
    served, end = 0, clock.now + 10
    while clock.now < end:  # back to back, 0.1 ms upstream each, honouring every throttle_time_ms
        d = policy.on_request(conn, read_request(header, request), clock())
        sent = clock()
        clock.now += 0.0001
        policy.on_response(conn, Pending(header, sent, d), _response_frame(header, body), clock())
        served += 1
        clock.now += d.throttle_ms / 1000
    allowed = 10 * 1 / per  # requests in 10 s at exactly 1 % (the first window's allowance on top)
    assert allowed * 0.9 < served < allowed * 1.3


def test_api_versions_and_sasl_are_never_charged():
    clock = Clock()
    policy = _policy(clock, request_percentage=1)
    from kafka.protocol.metadata.api_versions import ApiVersionsRequest
    from kafka.protocol.sasl import SaslHandshakeRequest

    for req in (ApiVersionsRequest(version=0), SaslHandshakeRequest(mechanism="PLAIN", version=1)):
        header, request = _request(req)
        assert policy.on_request(FakeConn(), read_request(header, request), clock()) is None


def test_shadow_mode_computes_and_records_but_never_holds_or_rewrites():
    clock = Clock()
    policy = _policy(clock, enforce=False, producer_byte_rate=1000)
    conn = FakeConn()
    header, request = _produce(5000)
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.throttle_ms > 0 and conn.mute.calls == []
    frame = _response_frame(header, b"\x00\x00\x00\x00" + _SIZE.pack(0))
    assert policy.on_response(conn, Pending(header, clock(), d), frame, clock()) is None
    assert policy.stats.decisions[(PRODUCER_BYTE_RATE, "throttle", True)] == 1


def test_shadow_mode_is_chosen_once_a_request_whatever_a_reload_does_before_its_answer():
    """A request decided while quotas are enforced has its throttle served at its answer, though a reload turned
    enforcement off in between; one decided in shadow mode is not served after a reload turned it back on."""
    for enforce_at_request in (True, False):
        clock = Clock()
        policy = _policy(clock, enforce=enforce_at_request, producer_byte_rate=1000)
        conn = FakeConn()
        header, request = _produce(5000)
        d = policy.on_request(conn, read_request(header, request), clock())
        assert d.throttle_ms > 0
        policy.reload(_policy(clock, enforce=not enforce_at_request, producer_byte_rate=1000).config)
        frame = _response_frame(header, b"\x00\x00\x00\x00" + _SIZE.pack(0))
        pieces = policy.on_response(conn, Pending(header, clock(), d), frame, clock())
        if enforce_at_request:
            assert pieces is not None and ("hold", 0.0) in conn.mute.calls  # rewritten and served, as decided
            assert policy.stats.decisions[(PRODUCER_BYTE_RATE, "throttle", False)] == 1
        else:
            assert pieces is None and conn.mute.calls == []
            assert policy.stats.decisions[(PRODUCER_BYTE_RATE, "throttle", True)] == 1


def test_decisions_are_counted_by_quota_action_and_shadow():
    clock = Clock()
    policy = _policy(clock, producer_byte_rate=1000)
    conn = FakeConn()
    for size in (10, 5000):  # within quota, then over it
        header, request = _produce(size)
        d = policy.on_request(conn, read_request(header, request), clock())
        frame = _response_frame(header, bytes(4) + _SIZE.pack(0))
        policy.on_response(conn, Pending(header, clock(), d), frame, clock())
    counts = policy.stats.decision_counts()
    assert counts[(PRODUCER_BYTE_RATE, "pass", False)] == 1
    assert counts[(PRODUCER_BYTE_RATE, "throttle", False)] == 1
    assert sum(counts.values()) == 2


def test_fair_share_holds_a_topic_deletion_for_the_broker_where_its_tenant_is_over_its_share():
    """A tenant held on broker 2 deletes topics through broker 1, which is open: the deletion waits for broker 2's
    share (a churn costs every broker). Before, it went at once: a flood's create/delete loop ran at 49-63
    mutations a second through an open broker while the others held its Produce (issue 48's bench)."""
    clock = Clock()
    policy = _policy(clock, producer_byte_rate=1 << 40)  # a quota that never binds
    assert policy.fair is not None
    on_1, on_2 = FakeConn(), FakeConn()
    on_2.label = "broker 2"
    header, frame = _produce(2000)
    now_ms = int(clock() * 1000)
    held, _ = policy.fair.request(on_2, ConnState(on_2.identity), read_request(header, frame), now_ms)  # type: ignore[arg-type]
    assert held is not None and held.broker.key == "broker 2"
    held.broker.limit = 64 * 1024.0  # broker 2 limited, the tenant paced at 64 KiB/s, its bucket emptied
    held.pace(64 * 1024.0, 0.1, now_ms)
    held.broker.charge(held, 64 * 1024.0, now_ms)
    header, frame = _delete_topics(["t1", "t2"])
    verdict = policy.on_request(on_1, read_request(header, frame), clock())  # type: ignore[arg-type]
    assert isinstance(verdict, Defer), f"went at once: {verdict!r}"
    assert verdict.wait_s > 0


def test_a_throttle_fair_share_gave_is_counted_as_fair_shares_not_the_static_quotas_it_passed():
    """A paced tenant's Fetch answer gets fair share's throttle (on_response raises throttle_ms to fair_ms): that is
    fair share holding it, not its consumer_byte_rate or request_percentage throttling it (which a real-cluster
    test read as a loose quota binding). A static throttle longer than fair share's stays the static quota's."""
    clock = Clock()
    policy = _policy(clock, consumer_byte_rate=10**9, request_percentage=10**6)
    conn = FakeConn()
    header, request = _fetch()
    for static_ms, fair_ms in ((0, 400), (900, 400)):
        d = policy.on_request(conn, read_request(header, request), clock())
        assert keys_of(d.noted) == [REQUEST_PERCENTAGE]  # consumer_byte_rate is charged at the response
        d.noted |= BIT[CONSUMER_BYTE_RATE]
        d.fair_ms, d.throttle_ms = fair_ms, max(static_ms, fair_ms)
        policy.recorder.record(conn, d, 100, None, int(clock() * 1000), False)  # type: ignore[arg-type]
    counts = policy.stats.decision_counts()
    assert counts[("fair_share", "held", False)] == 2
    assert counts[(CONSUMER_BYTE_RATE, "fair_share", False)] == counts[(REQUEST_PERCENTAGE, "fair_share", False)] == 1
    assert counts[(CONSUMER_BYTE_RATE, "throttle", False)] == counts[(REQUEST_PERCENTAGE, "throttle", False)] == 1


@pytest.mark.parametrize("keep_values", [True, False])
def test_a_pass_is_counted_once_for_each_kind_it_noted(keep_values):
    """Passes are counted per set of kinds (one dict entry a request); the export gives every kind its own count,
    and a decision's set is exactly the keys it noted values for. Without the decision log no values are kept,
    and the counts and throttles are the same."""
    clock = Clock()
    policy = _policy(clock, keep_values=keep_values, producer_byte_rate=10**9, request_percentage=10**6)
    conn = FakeConn()
    for _ in range(3):
        header, request = _produce(100)
        d = policy.on_request(conn, read_request(header, request), clock())
        assert keys_of(d.noted) == [PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE]  # both decided on arrival
        clock.now += 0.01
        frame = _response_frame(header, bytes(4) + _SIZE.pack(0))
        policy.on_response(conn, Pending(header, clock(), d), frame, clock())
        assert keys_of(d.noted) == [PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE] and d.throttle_ms == 0
        if keep_values:
            assert keys_of(d.noted) == [k for k in BIT if k in d.values]
        else:
            assert d.values is None
    counts = policy.stats.decision_counts()
    assert counts == {(PRODUCER_BYTE_RATE, "pass", False): 3, (REQUEST_PERCENTAGE, "pass", False): 3}


def test_kind_sets_round_trip():
    assert keys_of(0) == []
    assert keys_of(sum(BIT.values())) == list(BIT) == [k.key for k in KINDS]
    for key, bit in BIT.items():
        assert keys_of(bit) == [key]


def _create_topics(partitions: list[int], version: int = 6):
    T = CreateTopicsRequest.CreatableTopic
    topics = [
        T(name=f"t{i}", num_partitions=n, replication_factor=1, assignments=[], configs=[])
        for i, n in enumerate(partitions)
    ]
    return _request(CreateTopicsRequest(topics=topics, timeout_ms=1000, validate_only=False, version=version))


def _created(sent_frame: bytes, version: int) -> bytes:
    """The broker's answer to the (subset) request the proxy forwarded: every topic created."""
    header = parse_request_header(memoryview(sent_frame)[4:])
    assert header.body_offset is not None  # a known API
    req = CreateTopicsRequest.decode(bytes(sent_frame[4 + header.body_offset :]), version=version)
    R = CreateTopicsResponse._struct.fields["topics"].array_of.data_class
    items = [
        R(
            version=version,
            name=t.name,
            topic_id=uuid.uuid4(),
            error_code=0,
            error_message=None,
            num_partitions=t.num_partitions,
            replication_factor=1,
            configs=[],
        )
        for t in req.topics
    ]
    return CreateTopicsResponse(version=version, throttle_time_ms=0, topics=items).encode()


def test_kip599_strict_request_is_split_and_the_answer_merged_in_request_order():
    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=1)  # burst: 1/s x 2 samples x 1 s = 2 tokens
    conn = FakeConn()
    header, request = _create_topics([3, 1, 1])
    verdict = policy.on_request(conn, read_request(header, request), clock())
    assert isinstance(verdict, Defer)
    replaced = asyncio.run(verdict.decide())
    assert isinstance(replaced, Replace) and replaced.whole
    d = replaced.decision
    assert d.mutations == 3 and d.rejected == 2  # t0 spends the burst and more; t1, t2 meet a negative balance
    assert d.values[CONTROLLER_MUTATION_RATE][2] > 0
    broker = _created(replaced.frame, 6)
    frame = _response_frame(header, broker, flexible=True)
    pieces = policy.on_response(conn, Pending(header, clock(), d), frame, clock())
    merged = b"".join(bytes(p) for p in pieces)
    answer = CreateTopicsResponse.decode(merged[4 + 5 :], version=6)  # size, correlation id, empty tag section
    assert [(t.name, t.error_code) for t in answer.topics] == [("t0", 0), ("t1", 89), ("t2", 89)]
    assert answer.throttle_time_ms == d.throttle_ms
    assert conn.mute.calls == [("mute_for", d.throttle_ms / 1000)]


def test_kip599_old_version_is_admitted_whole_and_muted():
    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=1)
    conn = FakeConn()
    header, request = _create_topics([3, 1, 1], version=5)
    whole = asyncio.run(policy.on_request(conn, read_request(header, request), clock()).decide())
    assert isinstance(whole, Replace) and whole.frame == request  # forwarded as it came, its answer read whole
    d = whole.decision
    assert d.rejected == 0 and d.mutations == 5 and d.throttle_ms > 0
    clock.now += 10
    # Refilled: the next request spends tokens again, admitted whole.
    header, request = _create_topics([1], version=5)
    d2 = asyncio.run(policy.on_request(conn, read_request(header, request), clock()).decide()).decision
    assert d2.rejected == 0 and d2.values[CONTROLLER_MUTATION_RATE][0] == 1


def test_a_producer_id_remembered_per_connection_is_charged_exactly_as_the_filters_say():
    """The per-connection memo of the last producer id skips asking the bloom filters while the id is known;
    the charges must be the ones asking every time gives, across filter rotations and expiry."""
    from quotas.producer_ids import ProducerIdQuotaConfig, ProducerIdTracker

    clock = Clock()
    policy = Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "quotas": {
                    "producer_id_window_num": 2,
                    "producer_id_window_size_seconds": 2,
                    "entities": [{"entity": {"user": "alice"}, "quotas": {"producer_ids_rate": 10**6}}],
                },
            }
        ),
        Stats(),
        clock=clock,
    )
    reference = ProducerIdTracker(ProducerIdQuotaConfig(2, 2, policy.producer_ids.config.cleanup_interval_ms))
    conn = FakeConn()
    got, want = [], []
    for pid in [5] * 12 + [6] * 3 + [5] * 12:
        clock.now += 0.37  # crosses half-window rotations and whole-window expiries
        header, request = _produce(10, pid)
        d = policy.on_request(conn, read_request(header, request), clock())
        got.append(d.new_pids if d is not None else 0)
        want.append(int(reference.observe(("alice", "broker 1"), pid, round(clock() * 1000))))
    assert got == want
    assert sum(got) > 2  # the id expired and was charged again, more than once


def _charged(policy: Policy, key: str) -> float:
    """What every bucket of ``key`` has recorded so far (the manager's exact totals)."""
    return sum(t.recorded_total for (k, _scope, _bucket), t in policy.quotas._trackers.items() if k == key)


def test_a_connections_kept_quota_handles_follow_every_change():
    """A connection charges through handles bound once (quotas.manager.Bound); each way they can go stale must
    send the next request to the right bucket with the right limit: a quota altered, a client id changed on
    the connection, the principal changed (SASL), the bucket's tracker dropped (idle expiry, the cap)."""
    clock = Clock()
    policy = _policy(clock, producer_byte_rate=10**9)
    conn = FakeConn()
    header, request = _produce(1000)
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.values[PRODUCER_BYTE_RATE][1] == 10**9
    # Altered: the new limit applies at once, and the bucket keeps its history (Kafka's sensor does).
    policy.sources.set_file({QuotaEntity(user="alice"): {"producer_byte_rate": 500}})
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.values[PRODUCER_BYTE_RATE][1] == 500 and d.throttle_ms > 0
    assert _charged(policy, PRODUCER_BYTE_RATE) == 2 * (len(request) - 4)
    # The tracker idles out and is dropped: the next charge lands in a live one, not in the dropped one.
    clock.now += 4000
    policy.upkeep()
    assert len(policy.quotas) == 0
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.throttle_ms > 0 and len(policy.quotas) == 1 and _charged(policy, PRODUCER_BYTE_RATE) == len(request) - 4
    # Another principal on the same connection (SASL re-authentication): bob has no quota.
    conn.identity.principal = "bob"
    assert policy.on_request(conn, read_request(header, request), clock()) is None
    conn.identity.principal = "alice"
    assert policy.on_request(conn, read_request(header, request), clock()).values[PRODUCER_BYTE_RATE][1] == 500


def test_a_changed_client_id_on_one_connection_is_charged_to_its_own_bucket():
    clock = Clock()
    policy = Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "quotas": {
                    "enforcement": "kafka",
                    "entities": [
                        {"entity": {"client-id": "<default>"}, "quotas": {"producer_byte_rate": 10**9}},
                        {"entity": {"client-id": "slow"}, "quotas": {"producer_byte_rate": 100}},
                    ],
                },
            }
        ),
        Stats(),
        clock=clock,
    )
    policy.keep_values = True  # as with the decision log on: the limit each decision was charged against is kept
    conn = FakeConn()
    header, request = _produce(1000)
    assert policy.on_request(conn, read_request(header, request), clock()).values[PRODUCER_BYTE_RATE][1] == 10**9
    d = policy.on_request(conn, read_request(_with_client_id(header, "slow"), request), clock())
    assert d.values[PRODUCER_BYTE_RATE][1] == 100 and d.client_id == "slow"
    assert policy.on_request(conn, read_request(header, request), clock()).values[PRODUCER_BYTE_RATE][1] == 10**9
    assert len(policy.quotas) == 2


def test_a_client_id_without_quota_does_not_hide_one_with_a_quota_on_the_same_connection():
    clock = Clock()
    policy = Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "quotas": {
                    "enforcement": "kafka",
                    "entities": [{"entity": {"client-id": "slow"}, "quotas": {"producer_byte_rate": 100}}],
                },
            }
        ),
        Stats(),
        clock=clock,
    )
    policy.keep_values = True
    conn = FakeConn()
    header, request = _produce(1000)
    assert policy.on_request(conn, read_request(header, request), clock()) is None  # "app": no quota applies
    d = policy.on_request(conn, read_request(_with_client_id(header, "slow"), request), clock())
    assert d is not None and d.values[PRODUCER_BYTE_RATE][1] == 100
    assert policy.on_request(conn, read_request(header, request), clock()) is None


def test_answers_the_policy_builds_itself_take_what_kafka_python_encodes():
    """The proxy's own answers (every topic rejected; DescribeClientQuotas) are encoded by kafka-python, which
    hands back a bytearray: the compiled policy once refused it (``bytes`` parameter) and closed the connection."""
    from kafka.protocol.admin import DescribeClientQuotasRequest, DescribeClientQuotasResponse

    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=1)
    conn = FakeConn()
    header, request = _create_topics([3])
    assert isinstance(
        asyncio.run(policy.on_request(conn, read_request(header, request), clock()).decide()), Replace
    )  # whole
    header, request = _create_topics([1, 1])  # the balance is negative now: every topic rejected, answered here
    answered = asyncio.run(policy.on_request(conn, read_request(header, request), clock()).decide())
    assert isinstance(answered, Answer)
    answer = CreateTopicsResponse.decode(bytes(answered.frame[4 + 5 :]), version=6)
    assert [t.error_code for t in answer.topics] == [89, 89]
    header, request = _request(DescribeClientQuotasRequest(components=[], strict=False, version=1))
    described = policy.on_request(conn, read_request(header, request), clock())
    assert isinstance(described, Answer)
    reply = DescribeClientQuotasResponse.decode(bytes(described.frame[4 + 5 :]), version=1)  # flexible header
    assert reply.error_code == 31  # alice is no describer here; the refusal is an answer of the proxy too


# ---------------------------------------------------------------------------------------- KIP-599 current counts


class LaggingBroker(FakeConn):
    """The client's broker link, whose Metadata lags the controller as a KRaft broker's does: it knows the topics in
    ``known`` (name -> (topic id, partitions)) only, whatever the controller has created meanwhile; topics in
    ``refused`` get TOPIC_AUTHORIZATION_FAILED."""

    def __init__(self) -> None:
        super().__init__()
        self.known: dict[str, tuple[uuid.UUID, int]] = {}
        self.refused: set[str] = set()
        self.asked = 0

    async def ask(self, api_key: int, api_version: int, body: bytes) -> bytes:
        from kafka.protocol.metadata import MetadataResponse

        assert api_key == 3, f"only Metadata is asked, not api {api_key}"
        self.asked += 1
        req = MetadataRequest.decode(body, version=api_version)
        T = MetadataResponse._struct.fields["topics"].array_of.data_class
        P = T._struct.fields["partitions"].array_of.data_class
        topics = []
        for t in req.topics:
            hit = next(((n, tid, p) for n, (tid, p) in self.known.items() if n == t.name or tid == t.topic_id), None)
            if t.name in self.refused:
                topics.append(
                    T(
                        version=api_version,
                        error_code=29,
                        name=t.name,
                        topic_id=None,
                        is_internal=False,
                        partitions=[],
                        authorized_operations=None,
                    )
                )
                continue
            if hit is None:  # UNKNOWN_TOPIC_OR_PARTITION (by name) / UNKNOWN_TOPIC_ID (by id)
                topics.append(
                    T(
                        version=api_version,
                        error_code=3 if t.name else 100,
                        name=t.name,
                        topic_id=t.topic_id,
                        is_internal=False,
                        partitions=[],
                        authorized_operations=None,
                    )
                )
                continue
            name, tid, n = hit
            parts = [
                P(
                    version=api_version,
                    error_code=0,
                    partition_index=i,
                    leader_id=1,
                    leader_epoch=0,
                    replica_nodes=[1],
                    isr_nodes=[1],
                    offline_replicas=[],
                )
                for i in range(n)
            ]
            topics.append(
                T(
                    version=api_version,
                    error_code=0,
                    name=name,
                    topic_id=tid,
                    is_internal=False,
                    partitions=parts,
                    authorized_operations=None,
                )
            )
        return bytes(
            MetadataResponse(
                version=api_version, throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, topics=topics
            ).encode()
        )


def _delete_topics(names: list[str] | None = None, ids: list[uuid.UUID] | None = None, version: int = 6):
    from kafka.protocol.admin import DeleteTopicsRequest

    S = DeleteTopicsRequest.DeleteTopicState
    states = [S(name=n, topic_id=None) for n in names or []] + [S(name=None, topic_id=i) for i in ids or []]
    return _request(DeleteTopicsRequest(topics=states, timeout_ms=1000, version=version))


def _deleted(sent_frame: bytes, version: int) -> bytes:
    """The broker's (the controller's) answer to the DeleteTopics forwarded: every topic deleted."""
    from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse

    header = parse_request_header(memoryview(sent_frame)[4:])
    assert header.body_offset is not None  # a known API
    req = DeleteTopicsRequest.decode(bytes(sent_frame[4 + header.body_offset :]), version=version)
    R = DeleteTopicsResponse._struct.fields["responses"].array_of.data_class
    items = [R(version=version, name=t.name, topic_id=t.topic_id, error_code=0, error_message=None) for t in req.topics]
    return DeleteTopicsResponse(version=version, throttle_time_ms=0, responses=items).encode()


def _through(policy: Policy, conn, request_and_header, answer, clock: Clock, version: int):
    """One mutation request through the policy and the cluster: its decision."""
    header, request = request_and_header
    deferred = policy.on_request(conn, read_request(header, request), clock())
    assert isinstance(deferred, Defer)  # a mutation asks the cluster first

    async def decide() -> object:
        return await deferred.decide()

    verdict = asyncio.run(decide())
    if isinstance(verdict, Decision):  # forwarded as it came
        d, sent = verdict, request
    else:
        assert isinstance(verdict, Replace), verdict  # forwarded whole or in part
        d, sent = verdict.decision, verdict.frame
    policy.on_response(
        conn, Pending(header, clock(), d), _response_frame(header, answer(sent, version), flexible=True), clock()
    )
    return d


def test_a_topic_deleted_before_the_clients_broker_has_seen_it_created_is_charged_its_partitions():
    """The churn that went uncharged: CreateTopics is answered once the controller committed the topics, the
    client deletes them at once, and its broker (asked for current counts) has not applied them yet: it says
    UNKNOWN_TOPIC_OR_PARTITION, the controller deletes them anyway. Charged 0 before; now what the cluster answered
    the create with counts."""
    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=100)  # B = 200: nothing is throttled, only counted
    conn = LaggingBroker()
    create = _through(policy, conn, _create_topics([2, 3], version=7), _created, clock, 7)
    assert create.mutations == 5
    clock.now += 0.01
    delete = _through(policy, conn, _delete_topics(["t0", "t1"]), _deleted, clock, 6)
    assert delete.topic_partitions == [2, 3]
    assert delete.mutations == 5
    assert conn.asked == 1  # known from the create's answer: no waiting on the broker


def _noting_ids(ids: list[uuid.UUID]):
    """``_created``, noting the topic ids the cluster gave."""

    def created(frame: bytes, version: int) -> bytes:
        body = _created(frame, version)
        ids.extend(t.topic_id for t in CreateTopicsResponse.decode(body, version=version).topics)
        return body

    return created


def test_a_topic_deleted_by_id_is_charged_from_the_creates_answer():
    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=100)
    conn = LaggingBroker()
    created_ids: list[uuid.UUID] = []
    _through(policy, conn, _create_topics([4], version=7), _noting_ids(created_ids), clock, 7)
    delete = _through(policy, conn, _delete_topics(ids=created_ids), _deleted, clock, 6)
    assert delete.mutations == 4
    # Deleted: the proxy forgets it, and a topic of that name is counted from the broker again.
    conn.known["t0"] = (uuid.uuid4(), 1)
    assert _through(policy, conn, _delete_topics(["t0"]), _deleted, clock, 6).mutations == 1


def test_partitions_added_a_moment_ago_count_although_the_broker_shows_the_old_count():
    from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=100)
    conn = LaggingBroker()
    ids: list[uuid.UUID] = []
    _through(policy, conn, _create_topics([2], version=7), _noting_ids(ids), clock, 7)
    conn.known["t0"] = (ids[0], 2)  # the broker has caught up with the create, not with what follows

    def grown(frame: bytes, version: int) -> bytes:
        R = CreatePartitionsResponse._struct.fields["results"].array_of.data_class
        return CreatePartitionsResponse(
            version=version,
            throttle_time_ms=0,
            results=[R(version=version, name="t0", error_code=0, error_message=None)],
        ).encode()

    grow = _through(
        policy,
        conn,
        _request(
            CreatePartitionsRequest(
                topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="t0", count=6, assignments=None)],
                timeout_ms=1000,
                validate_only=False,
                version=3,
            )
        ),
        grown,
        clock,
        3,
    )
    assert grow.mutations == 4
    assert _through(policy, conn, _delete_topics(["t0"]), _deleted, clock, 6).mutations == 6
    # A topic of that name created anew elsewhere (another id) is the broker's to count: 6 was another topic's.
    _through(policy, conn, _create_topics([2], version=7), _created, clock, 7)
    conn.known["t0"] = (uuid.uuid4(), 3)
    assert _through(policy, conn, _delete_topics(["t0"]), _deleted, clock, 6).mutations == 3


def test_a_topic_the_broker_has_not_seen_yet_is_asked_for_again(monkeypatch):
    """Created elsewhere (another proxy, another worker): nothing here knows it, so the broker is asked again
    until it has caught up; a topic that stays unknown costs nothing after the last try."""
    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=100)
    policy.lag_rechecks_s = (0.0, 0.0, 0.0)
    conn = LaggingBroker()
    real_ask = conn.ask

    async def catching_up(api_key: int, api_version: int, body: bytes) -> bytes:
        if conn.asked == 2:
            conn.known["elsewhere"] = (uuid.uuid4(), 3)
        return await real_ask(api_key, api_version, body)

    monkeypatch.setattr(conn, "ask", catching_up)
    delete = _through(policy, conn, _delete_topics(["elsewhere", "nowhere"]), _deleted, clock, 6)
    assert delete.topic_partitions == [3, 0] and delete.mutations == 3
    assert conn.asked == 4  # once, twice more for both, then "nowhere" alone for the last try


def test_a_topic_the_client_may_not_see_is_charged_nothing_whatever_the_proxy_learnt():
    """Refused to the client (TOPIC_AUTHORIZATION_FAILED), its delete fails the same way: it changes nothing."""
    clock = Clock()
    policy = _policy(clock, controller_mutation_rate=100)
    conn = LaggingBroker()
    _through(policy, conn, _create_topics([2], version=7), _created, clock, 7)
    conn.refused.add("t0")
    delete = _through(policy, conn, _delete_topics(["t0"]), _deleted, clock, 6)
    assert delete.topic_partitions == [0] and conn.asked == 1  # and not asked again: it is no lag


def test_request_percentage_is_decided_on_arrival_so_a_pipelining_client_is_held_at_the_request_that_crosses():
    """Issue 36, pipelining: librdkafka sends thousands of requests before the first answer. A broker reads one
    a connection at a time and mutes the channel after a throttled answer, so the requests queued behind wait;
    the proxy charges each request as it arrives and holds the reads at the first one over quota (that one is
    still forwarded, and its answer carries throttle_time_ms). Responses of the pipelined requests never come in
    this test: nothing of the decision may wait for them."""
    clock = Clock()
    policy = _policy(clock, request_percentage=1)  # 10 ms of thread a second
    conn = FakeConn()
    header, request = _produce(10)
    per = _expected(header, request, None)  # percent-seconds a request
    decided = []
    for _ in range(5000):  # pipelined: all at one instant, no response read
        d = policy.on_request(conn, read_request(header, request), clock())
        decided.append(d)
        if conn.mute.calls:
            break
    assert conn.mute.calls == [("hold", 0.0)]  # held at arrival, not when a response comes
    crossing = decided[-1]
    assert crossing.holds and crossing.throttle_ms > 0
    assert all(d.throttle_ms == 0 for d in decided[:-1])
    # Kafka's windowed rate (2 windows of 1 s here) lets about quota x one window through at once, as a broker does
    assert 0.5 / per < len(decided) < 2.5 / per
    assert crossing.values[REQUEST_PERCENTAGE][0] == pytest.approx(per)
    # Produce's answer adds nothing (no response-size term): the throttle decided at arrival is the one served
    policy.on_response(
        conn, Pending(header, clock(), crossing), _response_frame(header, bytes(4) + _SIZE.pack(0)), clock()
    )
    assert conn.mute.calls[-1] == ("served", crossing.throttle_ms / 1000)


def test_request_percentage_response_term_comes_from_the_last_response_of_that_api():
    """Fetch's estimate grows with its response, which is unknown when the request arrives: the charge (one, on
    arrival, so the decision log replays it exactly) takes that term from the last Fetch answer on the connection."""
    clock = Clock()
    policy = _policy(clock, request_percentage=1000)
    conn = FakeConn()
    header, request = _fetch()
    d = policy.on_request(conn, read_request(header, request), clock())
    assert d.values[REQUEST_PERCENTAGE][0] == pytest.approx(thread_ms(FETCH, len(request) - 4, 0) / 10)
    frame = _response_frame(header, _SIZE.pack(0) + bytes(100_000))
    policy.on_response(conn, Pending(header, clock(), d), frame, clock())
    assert d.values[REQUEST_PERCENTAGE][0] == pytest.approx(thread_ms(FETCH, len(request) - 4, 0) / 10)  # no more
    d2 = policy.on_request(conn, read_request(header, request), clock())
    assert d2.values[REQUEST_PERCENTAGE][0] == pytest.approx(thread_ms(FETCH, len(request) - 4, len(frame) - 4) / 10)
    # Produce has no response term: its charge never depends on what came back
    ph, pr = _produce(10)
    d3 = policy.on_request(conn, read_request(ph, pr), clock())
    policy.on_response(conn, Pending(ph, clock(), d3), _response_frame(ph, bytes(4) + _SIZE.pack(0)), clock())
    assert conn.policy_state.last_out.keys() == {FETCH}


def test_smooth_request_percentage_paces_before_forwarding():
    """Smooth enforcement: a request over the pacing bucket waits (Defer) before the broker sees it, and the
    connection reads nothing meanwhile (the connection mutes for the Defer's wait)."""
    clock = Clock()
    policy = Policy(
        ProxyConfig.model_validate(
            {
                "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
                "quotas": {"entities": [{"entity": {"user": "alice"}, "quotas": {"request_percentage": 1}}]},
            }
        ),
        Stats(),
        clock=clock,
    )
    conn = FakeConn()
    header, request = _produce(10)
    per_ms = _expected(header, request, None) * 10
    verdicts = [policy.on_request(conn, read_request(header, request), clock()) for _ in range(200)]
    deferred = [v for v in verdicts if type(v) is Defer]
    assert deferred, "a 200-request burst at 1 % must overdraw a tenth of a second's bucket (1 ms of thread)"
    first = verdicts.index(deferred[0])
    assert 0.5 / per_ms <= first <= 1.5 / per_ms + 1  # the bucket: 1 ms of thread time, then waits
    assert deferred[-1].wait_s > deferred[0].wait_s  # each further request waits longer


@settings(max_examples=200, deadline=None)
@given(st.integers(-1, 100), st.integers(0, 1 << 20), st.integers(0, 1 << 20))
def test_thread_estimate_splits_exactly_into_arrival_and_response_parts(api_key, request_bytes, response_bytes):
    """What is charged on arrival (response 0 bytes) plus the response term is the whole estimate, and the
    response term exists exactly where the estimate grows with the response."""
    whole = thread_percent(api_key, request_bytes, response_bytes)
    response_term = whole - thread_percent(api_key, request_bytes, 0)
    assert has_response_term(api_key) == (thread_percent(api_key, 0, 1024) > thread_percent(api_key, 0, 0))
    assert response_term >= -1e-12


def test_a_produce_is_charged_the_replicated_term_by_its_topics_replication_factor():
    """Issue 50: with the topic's replication factor known from the Metadata the proxy passed on, an acks=1 Produce
    to a replicated topic is charged the followers' work and an acks=-1 one to an unreplicated topic is not; a topic
    the proxy knows nothing of goes by its acks."""
    from proxy.wire.responses import TopicIds

    clock = Clock()
    policy = _policy(clock, request_percentage=1000)
    topics = TopicIds()
    policy.topics = topics  # (the server composes it at start; here the test's own table)
    conn = FakeConn()

    def charged(acks: int) -> float:
        header, request = _produce(10, acks=acks)
        d = policy.on_request(conn, read_request(header, request), clock())
        return d.values[REQUEST_PERCENTAGE][0] * 10

    plain = thread_ms(PRODUCE, len(_produce(10, acks=1)[1]) - 4, 0)
    assert charged(-1) == pytest.approx(plain + PRODUCE_ACKS_ALL_MS)  # not known: by its acks
    assert charged(1) == pytest.approx(plain)
    topics.learn_replication({"t": 1})
    assert charged(-1) == pytest.approx(plain)
    topics.learn_replication({"t": 3})
    assert charged(1) == pytest.approx(plain + PRODUCE_ACKS_ALL_MS)
