"""A client connection's life: admission, its broker link, pausing its sides, timeouts, draining and closing.

Why a module of its own: ``proxy.wire.connection`` is the hot path (requests in, responses out); what happens once or
once a second per connection (admitted or refused, the broker connection made, a timeout checked, closed) is its
base class here, so each file holds one job. Compiled with it (``proxy.build_info.COMPILED``): the connection's
calls into this class are native. Which timeout fires is the session's decision (``Session.expiry``); carrying
it out is here.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from time import monotonic
from typing import Any

from config.model import ProxyConfig
from mute import ChannelMute
from protocol.endpoint_apis import ResponseShape
from protocol.frames import INITIAL_RECEIVE_BYTES, FrameReader, FrameReceiver, RequestBytesPool, _PoolWaiter
from protocol.principal import CertificateError, ConnectionIdentity, NoMatchingRule, PrincipalMapper
from protocol.session import Pause, Session
from protocol.text import printable
from proxy.rules.policy import Policy
from proxy.stats import ApiCounters, Stats, Traffic
from proxy.wire.brokers import BrokerDirectory
from proxy.wire.responses import StreamedTail, TopicIds
from proxy.wire.sockets import ClientSide, Side, SideOwner, UpstreamChunks, UpstreamSide
from proxy.wire.tls import peer_principal
from quotas.connections import Refusal

log = logging.getLogger("proxy.connection")  # one logger for the connection's lines, whichever file says them

_SIZE = struct.Struct(">i")


@dataclass(slots=True)
class Services:
    """What a connection uses of the proxy, and nothing more: settings, counters, the policy seat, the shared
    request pool and broker directory, and the connection limits' admit/release. (Its annotations' classes are
    imported at run time, not under TYPE_CHECKING: compiled, the dataclass resolves them.)"""

    config: ProxyConfig
    stats: Stats
    policy: Policy  # the concrete class: compiled, its methods are called natively (a Protocol is a lookup)
    request_pool: RequestBytesPool
    directory: BrokerDirectory
    topic_ids: TopicIds
    version_caps: dict[int, int]
    """A dict: compiled, the session's per-request ``get`` on it is then native."""
    admit: Callable[[ConnectionLife, str], Refusal | None]
    """A new connection from an ip: None to serve it (counted until ``release``), else why not."""
    release: Callable[[ConnectionLife], None]
    spoke: Callable[[ConnectionLife], Refusal | None]
    """Its first bytes arrived: None when a broker connection (a second fd) may be made, else why not."""
    principal_mapper: PrincipalMapper | None = None
    upstream_ssl: ssl.SSLContext | None = None
    timeline: list[Any] | None = None
    """Where the per-request timeline's records go (``proxy.wire.loop_lag``), None when it is off (the default)."""


class ConnectionLife(SideOwner):
    """A client connection's life: admitted or refused, its broker link made, its sides paused and resumed, its
    timeouts, draining and closing. :class:`proxy.wire.connection.Connection` adds what flows through it; the methods
    declared here and overridden there are the flow's (native calls, compiled)."""

    def __init__(self, services: Services, candidates: list[tuple[str, int]], label: str) -> None:
        self.services = services
        self.candidates = candidates
        self.label = label
        self.client = ClientSide(self, is_client=True)
        upstream = UpstreamSide(self, is_client=False)
        self.upstream = upstream
        self.upstream_chunks = UpstreamChunks(upstream)
        """What the broker's reads go to until the first Fetch (then ``upstream`` itself: see _buffer_reads)."""
        self.buffered_reads = False
        config = services.config
        max_frame = config.max_frame_bytes
        # Memory is taken as bytes arrive, never at a size a client merely announced: requests grow with what
        # was received (large ones reserve from the proxy-wide pool first), responses start in a small buffer.
        self._requests = FrameReader(max_frame, services.request_pool, config.request_pool_min_bytes)
        self._responses = FrameReceiver(max_frame, self._may_stream, initial=INITIAL_RECEIVE_BYTES)
        self._pool_waiter: _PoolWaiter | None = None  # queued for the request pool (protocol.frames.RequestBytesPool)
        self._tasks: set[asyncio.Task[None]] = set()  # cancelled on close: none outlives its connection
        self._connecting = False
        self._admitted = False  # counted by the connection limits until closed (or shed)
        self._refused_timer: Any = None  # the loop's TimerHandle (uvloop's is its own class)
        now = monotonic()
        self.last_active: float = now
        self._frame_since: float | None = None  # when the incomplete request frame started (while read)
        self._decided: Counter[tuple[str, bool]] = Counter()  # (api, streamed) of responses spanning reads
        self.peer = "?"
        self.upstream_addr: tuple[str, int] | None = None
        # The ordering state (in flight, held, SASL), sans-IO. The identity: SASL principal once an exchange
        # succeeds, else the client certificate's mapped name, else ANONYMOUS.
        self.session = Session(
            ConnectionIdentity(services.config.sasl.oauthbearer_principal_claim), services.version_caps
        )
        self.inflight = self.session.inflight
        self.identity = self.session.identity  # attributes, not properties: the policy reads them per request
        self._tail: StreamedTail | None = None  # the streaming response's closing tagged section
        self._shape = ResponseShape()  # its last untagged Produce/Fetch response: the next alike is not walked
        self.id = str(services.stats.connections_total)
        self._api_key = -(1 << 20)  # no int16 api key: see _api_counters
        self._api = ApiCounters()
        self.traffic = Traffic()  # since the last decision-log summary of this connection
        # Every attribute is annotated: compiled (mypyc), an attribute holds only its declared type, and one
        # inferred from a first ``None`` would refuse what the policy stores later.
        self.policy_state: Any = None  # the policy's own per-connection memo (proxy.rules.verdicts.PolicyConnection)
        self.mute = ChannelMute(asyncio.get_running_loop(), lambda: self.pause(self.client, Pause.MUTED), self._unmuted)
        self._early: list[bytes] = []  # bytes that arrived before the upstream connection was up
        self._answered_at = 0.0  # when the broker's last answer was read (fair share's service times)
        self._timeline: list[Any] | None = services.timeline  # None unless diagnosing (proxy.wire.loop_lag)
        if self._timeline is not None:  # which broker the connection's requests go to, for per-broker round trips
            self._timeline.append(("conn", self.id, self.label))
        self.draining = False
        self.closed = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def client_id(self) -> str:
        return self.session.client_id

    def other(self, side: Side) -> Side:
        return self.upstream if side is self.client else self.client

    # -- reading control ---------------------------------------------------------------------------
    def pause(self, side: Side, reason: str) -> None:
        if not side.pauses and side.transport is not None and not self.closed:
            side.transport.pause_reading()
        side.pauses.add(reason)

    def resume(self, side: Side, reason: str) -> None:
        side.pauses.discard(reason)
        if not side.pauses and side.transport is not None and not self.closed:
            side.transport.resume_reading()
            if side is self.client and self._frame_since is not None:
                self._frame_since = monotonic()  # time not read is not the client's slowness
        if reason == Pause.BACKPRESSURE and side is self.client:
            self._release_requests()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop, owned by this connection (kept referenced, cancelled when it closes)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle ---------------------------------------------------------------------------------
    def client_connected(self) -> None:
        transport = self.client.transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        ip = str(peer[0]) if peer else "?"
        refusal = self.services.admit(self, ip)
        if refusal is not None:  # over a connection limit: never served, closed at once or after the throttle
            if refusal.close_after_ms > 0:
                self.pause(self.client, Pause.REFUSED)
                self._refused_timer = asyncio.get_running_loop().call_later(refusal.close_after_ms / 1000, self.close)
            else:
                self.close()
            return
        self._admitted = True
        if self.services.principal_mapper is not None:  # TLS: the handshake is done, the certificate known
            try:
                self.identity.tls_principal = peer_principal(
                    transport.get_extra_info("ssl_object"), self.services.principal_mapper
                )
            except (NoMatchingRule, CertificateError) as exc:  # Kafka fails the authentication
                self.close(f"client certificate refused: {exc}", "tls")
                return
        # The broker connection is made when the client first sends something: a connection that never
        # speaks costs the proxy its socket only, and the cluster nothing.

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.services.config.upstream.connect_timeout_ms / 1000
        for host, port in self.candidates:
            if self.closed:
                return
            try:
                await asyncio.wait_for(
                    loop.create_connection(self._upstream_protocol, host, port, ssl=self.services.upstream_ssl), timeout
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                log.warning(
                    "%s via %s: cannot reach broker %s:%d (%s)", self.peer, self.label, host, port, exc or "timeout"
                )
                continue
            self.upstream_addr = (host, port)
            if self.closed:  # the client left while we were connecting
                self.upstream.transport.close()
                return
            early, self._early = self._early, []
            for data in early:
                self.requests_received(data)
            self.resume(self.client, Pause.CONNECTING)
            return
        self.close(f"no broker reachable among {self._candidates_text()}", "broker_unreachable")

    def _upstream_protocol(self) -> Any:
        """What the loop hands the broker's reads to: as chunks until the first Fetch (see _buffer_reads)."""
        return self.upstream if self.buffered_reads else self.upstream_chunks

    def _candidates_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.candidates) or "(unknown broker address)"

    def side_closed(self, side: Side, eof: bool) -> None:
        if self.closed:
            if side is self.upstream and not eof:
                self._requests.close()  # flushed (or aborted): whatever it still reserved goes back
            return
        if side is self.upstream:
            host, port = self.upstream_addr or ("?", 0)
            log.info("%s via %s: broker %s:%d closed the connection", self.peer, self.label, host, port)
        self.close()

    def check_timeouts(self, now: float) -> None:
        """Called about once a second: close this connection on a timeout (the session decides which,
        ``Session.expiry``); give a grown response buffer back once quiet."""
        if self.closed:
            return
        cfg = self.services.config
        expired = self.session.expiry(
            now,
            self._frame_since,
            not self.client.pauses,
            self._requests.held_bytes,
            self.last_active,
            self._requests.idle and not self._responses.streaming,
            self.upstream_addr,
            cfg.request_read_timeout_ms,
            cfg.upstream_timeout_margin_ms,
            cfg.connections_max_idle_ms,
        )
        if expired is not None:
            kind, reason = expired
            if not reason:
                log.debug(
                    "%s via %s: idle for %d ms; closing (connections_max_idle_ms)",
                    self.peer,
                    self.label,
                    (now - self.last_active) * 1000,
                )
            self.close(reason, kind)
            return
        if self.session.quiet(now, self.last_active) and (
            self.client.transport is None or self.client.transport.get_write_buffer_size() == 0
        ):
            self._responses.shrink()

    def drain(self) -> None:
        """Stop reading requests; close once every request in flight has been answered."""
        self.draining = True
        self.pause(self.client, Pause.DRAINING)
        if not self.inflight and not self._responses.streaming:  # a streamed response is popped at its head
            self.close()

    def close(self, reason: str = "", kind: str = "") -> None:
        """Close the connection; with a ``reason``, one WARNING line and ``kind`` counted as the ``reason`` label of
        ``ktp_connection_errors_total`` (a fixed vocabulary named where the error is raised, never client text)."""
        if self.closed:
            return
        if reason:
            log.warning("%s via %s: %s; closing the connection", self.peer, self.label, printable(reason, 500))
            self.services.stats.connection_errors[kind or "protocol"] += 1
        self.closed = True
        self.mute.cancel()
        if self._admitted:
            self._admitted = False
            self.services.release(self)
        if self._refused_timer is not None:
            self._refused_timer.cancel()
        if self._pool_waiter is not None:
            self.services.request_pool.cancel(self._pool_waiter)
            self._pool_waiter = None
        upstream = self.upstream.transport
        if upstream is None or not upstream.get_write_buffer_size():
            self._requests.close()
        # else: the closing transport still holds forwarded frames; their bytes go back to the request pool
        # when it has flushed them (side_closed, from connection_lost), not before.
        for task in list(self._tasks):
            task.cancel()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s via %s: closed; %d response receive buffer(s) allocated; responses spanning reads: %s",
                self.peer,
                self.label,
                self._responses.allocations,
                ", ".join(
                    f"{api} {'streamed' if s else 'assembled'} ×{n}" for (api, s), n in sorted(self._decided.items())
                )
                or "none",
            )
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()  # flushes what is already written
        if not self.done.done():
            self.done.set_result(None)

    def abort(self) -> None:
        self.close()
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.abort()

    def shed(self) -> None:
        """Closed to make room for another address's connection: the limits no longer count it (the caller
        logs and counts shedding, rate-limited; one line per connection would let a flood flood the log)."""
        self._admitted = False
        self.close()

    def idle_for_shedding(self, now: float, min_idle_s: float) -> bool:
        """Whether closing this connection loses nothing: nothing in flight, in the middle of arriving, or
        streaming, and no traffic for ``min_idle_s`` (asked only when room must be made, never per request)."""
        return (
            not self.closed
            and not self.inflight
            and self._requests.idle
            and not self._responses.streaming
            and self.session.deferred is None
            and now - self.last_active >= min_idle_s
        )

    # -- requests: client → broker -----------------------------------------------------------------

    # -- the flow's, overridden by proxy.wire.connection.Connection ---------------------------------------
    def _may_stream(self, head: memoryview) -> bool:
        raise NotImplementedError

    def _unmuted(self, hold_ended: bool) -> None:
        raise NotImplementedError

    def _release_requests(self) -> None:
        raise NotImplementedError
