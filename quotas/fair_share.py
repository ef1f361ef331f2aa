"""Capacity-aware fair share: protection nobody has to configure (issue 48).

Pure policy, time passed in (monotonic milliseconds); the proxy feeds it what it measured and asks it what waits.

The loop, per broker (docs/fair-share.md has the picture and the figures):

1. **Signal.** Every request the proxy forwards and the broker answers is a sample of how long the broker took on
   it: its *service time*, from when the broker could start on it (it was sent, and the connection's previous
   response had come back: a broker reads one request of a connection at a time) to its response. A request's
   *queueing delay* is its service time minus the baseline of its class (API, acks, size): the windowed minimum
   of that class's service times (BBR's min-RTT filter, not an average, which drifts up in a long incident). Per
   tick, the broker's delay ``q`` is the median of its samples' delays.
2. **Control law** on the work admitted to the broker per second, ``limit`` (bytes of requests and of Fetch
   answers, plus :data:`REQUEST_WORK` a request and :data:`MUTATION_WORK` a topic created or deleted): above the
   target ``d`` it is cut multiplicatively (never below half at once); while the tick's delay is below ``d`` and
   its average below :data:`GROW_BELOW` ``× d`` it grows while the admitted work actually uses it (additively,
   :data:`GROW_MIN` a tick, or :data:`GROW_FRACTION` of a large limit; faster back towards where the last cut
   started, :data:`RECOVER_FRACTION`), in between it holds. Samples of requests sent before the last change are
   ignored, so one standing queue is not cut for twice.
3. **Max-min division** of the limit among the broker's active tenants by their measured demand (Doorman's
   FAIR_SHARE): one water level; a tenant below it is never delayed, a tenant above it is paced at it.

What makes it safe to have on by default: the limit is only ever cut while it protects somebody. A broker with one
active tenant, or with tenants that all use about the same, is never limited (cutting them all alike protects none
of them); the limit never falls below what the light tenants use plus :attr:`FairShareSettings.min_limit` for the
others (:meth:`BrokerLoad._floor`). The known failure modes of the adaptive systems this borrows from, and what
here answers each (docs/fair-share.md):

- a minimum RTT that ratchets up under sustained load (envoy#11579): samples sent before a change are ignored,
  and the minimum is kept over two epochs (:data:`BASELINE_EPOCH_MS`), refreshed by the fast samples a
  controlled broker still gives;
- probes that pin concurrency low until requests fail (envoy#8337): there are no probes; the baseline comes from
  the traffic itself;
- an additive term that grows the limit forever near the target (concurrency-limits PR #134): growth only while
  the averaged delay is below :data:`GROW_BELOW` ``× d`` and only while the limit is used; a hold band in between;
- a dropped or coalesced answer reporting a near-zero round trip (concurrency-limits #176): a response read in the
  same read as the previous one has no service time of its own and is not a sample (the proxy skips it), and a
  class's baseline is used only after :data:`MIN_BASELINE_SAMPLES`;
- an averaged baseline that drifts up during a long incident: the baseline is a minimum, never an average.
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

from quotas.token_bucket import TokenBucket

MIB: Final = 1024 * 1024

# ------------------------------------------------------------------------------------------ the parameters
# Every constant of the loop, with why it has its value. Those an operator may want to move are settings
# (FairShareSettings, config's quotas.fair_share); these are the loop's own.

TICK_MS: Final = 100
"""The control interval. Why 100 ms: a flood's first queue builds in a few hundred milliseconds, and a tick must
hold a few samples of a lightly loaded broker (a producer at 200 records/s gives ~7 samples per broker a tick)."""
MIN_SAMPLES: Final = 3
"""A tick decides on at least this many samples: the median of one or two is one request's luck. Fewer are kept
for the next tick (up to :data:`MAX_CARRY_TICKS`)."""
MAX_CARRY_TICKS: Final = 10
"""Samples older than this many ticks are dropped undecided: a second-old delay says nothing of now."""
MAX_TICK_SAMPLES: Final = 24
"""Samples kept per broker per tick at most (the tick's first ones; later ones still feed the baselines): a tick's
median needs no more, memory stays bounded whatever the request rate, and the tick's sort stays cheap (sorting 256
was most of a tick's cost)."""
BASELINE_EPOCH_MS: Final = 30_000
"""A class's baseline is the minimum over the current epoch and the previous one (30-60 s). Long enough that a
tick of noise does not move it; short enough that a broker that really became slower (a new disk, a busier host)
is believed within a minute. A held broker still answers some requests at once, which keeps it honest."""
_EPOCH_S: Final = BASELINE_EPOCH_MS / 1000
MIN_BASELINE_SAMPLES: Final = 8
"""A class's baseline is trusted after this many samples; before that its samples are not delays."""
DECREASE: Final = 0.1
"""Above the target, the limit is multiplied by ``1 - DECREASE × (q - d) / d``: a cut proportional to the excess
(Breakwater's 0.02 per excess target acts every 10 µs; here a tick is 100 ms)."""
MAX_CUT: Final = 0.5
"""Never below half at once (the issue, and TCP's halving): a single bad tick cannot starve a tenant."""
Q_TAU_MS: Final = 1_000
"""Growth and release read the delay averaged over about this long (``q_avg``), cuts the tick's own: a tick's
median of a dozen samples moves by as much as the delay a flood adds near the target, so growing on one low tick
would ratchet the limit up on noise, while a real queue shows in one tick and is cut at once."""
GROW_BELOW: Final = 0.7
"""Growth only while the averaged delay is below ``GROW_BELOW × d`` (and the tick's below ``d``); between that and
``d`` the limit holds (a band against the grow-forever drift of an additive term near the target, concurrency-limits
PR #134)."""
GROW_FRACTION: Final = 0.01
"""Growth per tick from :data:`RECOVER_UNTIL` of the limit the last cut started from on, as a fraction of the
limit (about +10 % a second; at least :data:`GROW_MIN`): probing for more, slowly enough that the queue it builds
is seen before it grows much."""
RECOVER_FRACTION: Final = 0.2
"""Growth per tick below :data:`RECOVER_UNTIL` of the limit the last cut started from: a fifth of the gap
(CUBIC's concave part: back near the last good limit within a second after a cut, then probing slowly past it)."""
RECOVER_UNTIL: Final = 0.9
"""Below this fraction of the limit the last cut started from, growth is :data:`RECOVER_FRACTION` of the gap."""
GROW_MIN: Final = 32 * 1024
"""Growth per tick at least, in work bytes per second (0.3 MiB/s a second): from the floor, the limit still finds a
few MiB/s in seconds."""
USED_FRACTION: Final = 0.5
"""Growth only while the work admitted in the tick is at least this fraction of the limit: a limit nobody uses
would otherwise grow without bound while idle, and a later flood would meet no limit at all."""
SPARSE_SHARE: Final = 0.25
"""A tenant using less than this share of a limited broker's limit, and not held back, is *sparse*: paced at no
less than :data:`LIGHT_HEADROOM` times its own demand, whatever the heavy tenants' level (FQ-CoDel's sparse flows).
Why not max-min alone: a flooder spread over twenty client ids is twenty tenants, each with a level below what a
steady producer beside it uses, and max-min would hold that producer down to the flood's level."""
SPARSE_TOTAL: Final = 0.5
"""Sparse tenants together are given at most this share of the limit; past it the heaviest of them are heavy: a
tenant that invents client ids cannot make every one of them sparse."""
SPARSE_AFTER_MS: Final = 5_000
"""A heavy tenant becomes sparse again only after this long without being held back (and using less than half the
sparse share): a flooder's client id that is held, then briefly is not, stays heavy."""
GRACE_MS: Final = 2_000
"""A new tenant on a limited broker is paced at no less than half the sparse share for this long: its demand is not
known yet (its average starts at zero), and a new steady producer must not be held at the flood's level before it is
seen to be light. A new flooder's demand passes the sparse share within this time and it is heavy from then on."""
GRACE_SHARE: Final = 0.5 * SPARSE_SHARE
"""What a new sparse tenant is paced at no less than, as a share of the limit (:data:`GRACE_MS`). It counts at that
against :data:`SPARSE_TOTAL` while it is new: at most four new tenants at once are sparse by grace alone."""
LIGHT_HEADROOM: Final = 2.0
"""A light tenant is paced at no less than this many times its own demand (:meth:`BrokerLoad._divide`): its bursts
(a batch after a pause, a rebalance's commits) fit with room to spare, however low the heavy tenants' level."""
FLEET_LIGHT: Final = 0.5
"""In a fleet, a tenant not held back and using less than this part of its member's part of the floor
(:attr:`FairShareSettings.min_limit` / members) is light in what the member tells the others (:meth:`FairShare.light`),
whatever its neighbours here. Why: a member sees only its own clients, and lightness is relative to the others on the
broker, most of whom it cannot see; with one tenant on a broker (the victim whose flooder is on another member) or
tenants alike, it would find nobody light and tell nothing, and the member with the flooder would never limit it. A
tenant this small is never held by its own member's limit (which never falls below that floor, twice its demand:
:data:`LIGHT_HEADROOM`), so asking the others to protect it costs it nothing; a flooder is far above it. What it
does not cover: a member's lone tenant above it (raise ``min_work_rate`` to protect larger ones)."""
RELEASE_MS: Final = 10_000
"""A limited broker is released (unlimited again) once nobody has been held back for this long and the delay is
low: a limit learned in one incident does not slow a healthy cluster's next burst."""
DEMAND_TAU_MS: Final = 1_000
"""A tenant's demand is its work per second, averaged over about this long (Doorman's wants, measured)."""
HELD_MS: Final = 300
"""A tenant held back within this long counts as held (wanting more than it gets): a held request asks again at
least every 250 ms (``proxy.rules.pacing.PACE_RECHECK_MS``), so one still waiting is seen in every tick."""
ACTIVE_MS: Final = 2_000
"""A tenant counts as active on a broker while it sent work there within this long, or is held back there (a request
paced at a low share may wait longer than this, and is the tenant the limit exists for)."""
IDLE_MS: Final = 60_000
"""A tenant's state on a broker is dropped after this long without a request (bounded state)."""
MAX_TENANTS: Final = 1_000
"""Tenants tracked per broker at most; past it new ones share :data:`OTHER`. Tenant keys come from clients."""
OTHER: Final = "__other__"
"""The tenant that stands for every tenant past :data:`MAX_TENANTS` (also its metric label)."""
REQUEST_WORK: Final = 1024
"""Work a request costs beyond its bytes: a broker's time per request is not free (a flood of tiny requests is
work too). One KiB: a producer at 200 records/s a broker counts ~0.2 MiB/s, far below any share."""
MUTATION_WORK: Final = 256 * 1024
"""Work per topic in a CreateTopics, DeleteTopics or CreatePartitions request (per topic, not per partition: the
request's topics are counted without decoding their partition counts). Measured on the isolation bench: a
create/delete loop of 2-partition topics at ~53 partition mutations a second cost the victim about what 4-8 MiB/s
of appends per broker did (docs/fair-share.md), ~0.25-0.5 MiB a partition mutation, so ~0.5-1 MiB a 2-partition
topic over the cluster: 256 KiB a topic on each broker it reaches is the low end of that. Charged on every broker
the tenant is active on, not only the one the request went to (:meth:`FairShare.charge_mutation`)."""
SPREAD_BROKERS: Final = 256
"""A mutation's work is charged on at most this many brokers besides its own (:meth:`FairShare.charge_mutation`):
a cluster's brokers, with room for the bootstrap listeners' loops; the loop runs per mutation request, and
:meth:`FairShare.broker` keeps up to 4096 loops."""

SURGE_FACTOR: Final = 2.0
"""Slow start (:meth:`BrokerLoad.start`): on an open broker where somebody else is active, a tenant whose work in one
tick passes this many times its demand, plus the broker's room (:data:`START_ROOM` a second), is surging, and is
paced before any signal says whether the broker can take it. Why: a broker limits nobody until its delay shows, and
by then a flood of 1-MB batches had forwarded 47-85 MiB in its first second (a smooth quota, 2-3): the brokers were
still digesting it tens of seconds later (issue 48's isolation bench, 2026-12-07)."""
START_ROOM: Final = 2.0 * MIB
"""Work per second a tenant may bring unpaced beside others before it is surging (:data:`SURGE_FACTOR`), and what a
start paces the surging tenants at together, at least (more if ``min_work_rate`` is more): a light tenant (the
isolation bench's victim, 0.07-0.14 MiB/s a broker with its requests' work; 1.6 MiB/s for the unit tests' heaviest,
800 1-KiB records a second) is inside it; a flood's first 1-MB batch is not. Twice the 1.15 MiB/s a broker that a
smooth quota set by hand at fair share's settled rate held the bench's flood to: a start is not meant to hold a
flood below where the control law would."""
START_BURST: Final = 1.0 * MIB
"""Work a *settled* tenant (known for :data:`DEMAND_TAU_MS`) may bring in one tick beyond the room and twice its
demand: a light producer's batch after a pause (librdkafka's largest, 1 MB) is not a surge. A new tenant has no
such allowance: its demand is not known, and the flood's first batches are exactly that."""
START_GROWTH: Final = 2.0
"""A surging tenant's provisional rate is multiplied by this each tick the delay stays at or below the target (TCP's
slow start): a lone burst or a new steady producer is back to its own pace within a second; a flood meets the delay
at a few MiB/s a broker, and the control law takes over from there, not from what it forced in before."""
START_BLIND_TICKS: Final = 3
"""With no signal (nobody on the broker sends requests that measure it: a consumer beside the surge, say), a starting
tenant's rate still doubles, once every this many ticks: a start with nothing to protect it from ends in a second
or two."""

# ------------------------------------------------------------------------------------------ what is sampled
SAMPLED_APIS: Final = {0: 0, 2: 2, 3: 3, 8: 4, 9: 4, 10: 4, 12: 4, 18: 4}
"""API key -> sample family: Produce (acks=1; acks=all is family 1), ListOffsets, Metadata, and the quick group
and coordinator calls (OffsetCommit/Fetch, FindCoordinator, Heartbeat) with ApiVersions. Not Fetch (its answer
waits for data up to ``max_wait_ms``), JoinGroup/SyncGroup (rebalances) nor the admin APIs (controller waits and
``timeout_ms``): their round trips hold waits the client asked for, not the broker's load."""
SIZE_CLASSES: Final = 7
"""Request sizes per family: below 1 KiB, 4, 16, 64, 256 KiB, 1 MiB, and larger (log4)."""
CLASSES: Final = 5 * SIZE_CLASSES
_FAMILY: Final[list[int]] = [SAMPLED_APIS.get(key, -1) for key in range(max(SAMPLED_APIS) + 1)]
""":data:`SAMPLED_APIS` as a list by api key: every forwarded request reads it (compiled, a list slot is native
where a dict lookup boxes the key)."""


def sample_class(api_key: int, acks: int, size: int) -> int:
    """The baseline class of a request (-1: its round trip is not a sample). ``acks``: a Produce's acks (-1
    all, 0 none: no answer, never a sample), any value for other APIs."""
    if api_key == 0:
        if acks == 0:
            return -1
        family = 1 if acks == -1 else 0
    elif 0 < api_key < len(_FAMILY):
        family = _FAMILY[api_key]
        if family < 0:
            return -1
    else:
        return -1
    if size < 1024:
        return family * SIZE_CLASSES
    # One class more each fourfold from 1 KiB (1-4 KiB: 1, 4-16 KiB: 2, ...), the last open-ended: from the size's
    # bit length, not a loop of shifts (compiled, each step of the loop was a handful of checked int operations).
    k = (size.bit_length() - 9) >> 1
    return family * SIZE_CLASSES + (k if k < SIZE_CLASSES - 1 else SIZE_CLASSES - 1)


class FairShareSettings(NamedTuple):
    """What an operator may set (``quotas.fair_share``); the loop's own constants are the module's."""

    enabled: bool = True
    target_delay_ms: float = 1.0
    """The queueing delay the loop holds a limited broker at (``d``, at least; half the baseline when that is
    larger). Measured here: a victim's median delay was 0.7 ms alone, 1.1 ms beside a flood of 2 MiB/s a broker,
    1.6 at 4, 3.3 at 8 and 13.6 at 16 (docs/fair-share.md)."""
    min_limit: float = 1.0 * MIB
    """The least work per second a limited broker is allowed, whatever the delay: the loop's last defence against
    a delay it cannot lower (a slow disk, another process on the host)."""
    burst_seconds: float = 0.1
    """A held tenant's bucket, in seconds of its share: the largest burst it gets (as smooth pacing's)."""
    tenant: str = "user_client"
    """What a tenant is: ``user_client`` (the quota entity: user and client id), ``user``, or ``address``."""
    slow_start: bool = True
    """Pace a surging tenant before any signal (:meth:`BrokerLoad.start`); off, a surge goes in unpaced until the
    delay shows."""


class Baseline:
    """One class's windowed minimum service time: the minimum of the current epoch and of the previous one. Time in
    monotonic seconds: the answer path has them, and an int of ms would be one conversion more an answer."""

    __slots__ = ("cur", "prev", "epoch_s", "count")

    def __init__(self, now_s: float) -> None:
        self.cur = math.inf
        self.prev = math.inf
        self.epoch_s = now_s
        self.count = 0

    def add(self, service_ms: float, now_s: float) -> float:
        """Record a sample; the baseline after it (``inf`` until :data:`MIN_BASELINE_SAMPLES`)."""
        if now_s - self.epoch_s >= _EPOCH_S:
            self.prev = self.cur if now_s - self.epoch_s < 2 * _EPOCH_S else math.inf
            self.cur = math.inf
            self.epoch_s = now_s
        if service_ms < self.cur:
            self.cur = service_ms
        self.count += 1
        if self.count < MIN_BASELINE_SAMPLES:
            return math.inf
        return self.cur if self.cur < self.prev else self.prev


class Tenant:
    """One tenant's work on one broker: its demand, and the bucket that paces it while the broker is limited."""

    __slots__ = (
        "key",
        "broker",
        "weight",
        "arrived",
        "demand",
        "last_ms",
        "bucket",
        "paced",
        "held_ms",
        "held_tick",
        "held_ms_total",
        "held_total",
        "work_total",
        "sparse",
        "born_ms",
        "allow",
        "starting",
    )

    def __init__(self, key: str, broker: BrokerLoad, weight: float, now_ms: int) -> None:
        self.key = key
        self.broker = broker
        self.weight = weight
        self.arrived = 0.0
        """Work that arrived in the current tick."""
        self.demand = 0.0
        """Work per second, averaged over :data:`DEMAND_TAU_MS` (updated each tick)."""
        self.last_ms = now_ms
        self.bucket: TokenBucket | None = None
        """Its pacing bucket (rate: the water level × weight), made the first time the broker is limited and kept:
        a held request's mark is a point on this bucket's refill total (:meth:`TokenBucket.refilled`)."""
        self.paced = False
        """The broker is limited: its work is charged to :attr:`bucket`."""
        self.held_ms = -HELD_MS
        """When it was last held back (a request charged into debt, or one still waiting asked again)."""
        self.held_tick = False
        """It was held back in the current tick."""
        self.held_ms_total = 0
        self.held_total = 0
        self.work_total = 0.0
        self.sparse = True
        """Sparse (:data:`SPARSE_SHARE`): protected from the heavy tenants' level while it stays light."""
        self.born_ms = now_ms
        self.allow = broker.room
        """Work it may bring in the current tick, unpaced, before it is surging (:data:`SURGE_FACTOR`); ``inf`` where
        a surge would harm nobody (it is alone on the broker, or the broker is limited and divides already)."""
        self.starting = False
        """In slow start (:meth:`BrokerLoad.start`): paced at a part of the broker's start rate."""

    def rate(self) -> float:
        """Its pacing rate now (work bytes/s), or 0 when it is not paced."""
        b = self.bucket
        return b.rate if b is not None and self.paced else 0.0

    def pace(self, rate: float, burst_s: float, now_ms: int) -> None:
        """Pace it at ``rate`` from now (its bucket made, or its rate moved: a held request's wait follows)."""
        b = self.bucket
        if b is None:
            self.bucket = TokenBucket(rate, 1, burst_s, now_ms)
        elif not self.paced or b.rate != rate:
            b.set_rate(rate, now_ms)
        self.paced = True


class BrokerLoad:
    """One broker: its classes' baselines, the tick's delay samples, the limit and the tenants on it."""

    __slots__ = (
        "key",
        "settings",
        "baselines",
        "delays",
        "tick_base",
        "tick_trusted",
        "trusted_base",
        "carried",
        "limit",
        "level",
        "changed_ms",
        "changed_s",
        "held_ms",
        "paused",
        "tenants",
        "arrived",
        "admitted_rate",
        "q",
        "q_avg",
        "base",
        "target",
        "cuts",
        "grows",
        "cut_from",
        "peak",
        "next_cut_ms",
        "remote_light",
        "light_sum",
        "members",
        "samples_total",
        "state",
        "epoch",
        "room",
        "starting",
        "start_rate",
        "start_blind",
        "starts",
    )

    def __init__(self, key: str, settings: FairShareSettings, now_ms: int) -> None:
        self.key = key
        self.settings = settings
        self.baselines: list[Baseline | None] = [None] * CLASSES
        self.delays: list[float] = []
        self.tick_base = math.inf
        """The smallest baseline among the tick's samples: it sets a target that scales with a slow broker's quickest
        requests (not their median: a flood's megabyte requests have baselines of tens of milliseconds)."""
        self.tick_trusted = math.inf
        """The smallest of the tick's baselines that have lived a whole epoch (:data:`BASELINE_EPOCH_MS`; their
        ``prev`` is set): only these raise the target, as one learnt in a proxy's first seconds may be a flood's
        queue (a fresh proxy, or one restarted mid-incident, sees no unloaded request first). One in a flood learnt
        8-87 ms baselines, and a target of half that (4-43 ms) held the flood at 5-35 MiB/s a broker for seconds
        (issue 48's isolation bench, 2026-12-07)."""
        self.carried = 0
        self.limit = 0.0
        """Work bytes/s admitted at most; 0: unlimited (not saturated, or nobody to protect)."""
        self.level = 0.0
        """The water level: every tenant on the broker is paced at ``level × weight`` while limited."""
        self.changed_ms = now_ms
        """When the limit last changed: samples of requests sent before it are ignored."""
        self.changed_s = now_ms / 1000
        """:attr:`changed_ms` in seconds, the clock a request's ``sent_at`` is in (one compare a sample)."""
        self.held_ms = now_ms
        """When a tenant was last held back (for :data:`RELEASE_MS`)."""
        self.paused = False
        """A tenant held back here lately sends nothing here now but is busy on another broker: it paused, it has
        not left (:meth:`FairShare._across_brokers`)."""
        self.tenants: dict[str, Tenant] = {}
        self.arrived = 0.0
        self.admitted_rate = 0.0
        self.q = 0.0
        """The last tick's delay (ms), for the metrics."""
        self.q_avg = 0.0
        """The delay averaged over :data:`Q_TAU_MS` (growth and release read it)."""
        self.base = 0.0
        """The last tick's smallest baseline (ms), trusted or not: what the metrics show."""
        self.trusted_base = math.inf
        """The last tick's smallest trusted baseline (ms; ``inf``: none yet): the target is at least half of it."""
        self.target = settings.target_delay_ms
        self.cuts = 0
        self.grows = 0
        self.cut_from = 0.0
        """The limit the last cut started from (CUBIC's W_max): growth returns to it fast, and probes past it slowly."""
        self.peak = 0.0
        """The highest limit since the broker was last open: what it was taking when this episode began. A tenant is
        sparse against it (:meth:`_classify`), not against a limit cut to its floor, where a light tenant is a large
        part of a small limit, and, reclassified heavy, would leave nobody to protect: the limit would flap open."""
        self.next_cut_ms = now_ms
        """No cut before this: at most one cut a round trip (a request's delay and baseline), so a standing queue
        that is draining is not cut for again while the requests behind it still wait in it."""
        self.samples_total = 0
        self.state = "open"
        """``open`` (unlimited), ``cut``, ``grow`` or ``hold``: what the last tick did."""
        self.epoch = 0
        """Moves when a tenant is dropped (or the broker itself): a connection's kept tenant may be stale."""
        self.remote_light: dict[str, tuple[int, float, float]] = {}
        """A fleet's other members' light tenants on this broker: member -> (until when it counts, their demand, the
        member's smallest baseline here in ms, 0 when it had none: the target is half the smallest baseline any
        member measures, as one proxy seeing every tenant's requests would have it).
        Each member sees only its own clients, so a member whose only tenant here is a flooder would find nobody to
        protect, while the victim it harms is on another member (docs/fair-share.md, "In a fleet")."""
        self.light_sum = 0.0
        """This member's light tenants' demand here at the last tick, with, in a fleet, its tenants too small to compare
        (:data:`FLEET_LIGHT`): what it tells the fleet."""
        self.members = 1
        """Members of the fleet sharing this broker's floor (:attr:`FairShareSettings.min_limit` is the fleet's)."""
        self.room = math.inf
        """Work a tenant may bring in a tick beyond :data:`SURGE_FACTOR` times its demand before it is surging
        (:attr:`Tenant.allow`): :data:`START_ROOM` a second (or this member's part of ``min_limit``, if more) while
        the broker is open and somebody is active on it (here or, in a fleet, on another member); ``inf`` otherwise."""
        self.starting: list[Tenant] = []
        """The tenants in slow start (:meth:`start`): they share :attr:`start_rate`."""
        self.start_rate = 0.0
        """What the starting tenants are paced at together (work bytes/s), doubled each quiet tick."""
        self.start_blind = 0
        """Ticks of the current start with no signal since its rate last doubled (:data:`START_BLIND_TICKS`)."""
        self.starts = 0
        """Slow starts so far (a metric's count)."""

    # -------------------------------------------------------------------------------------------- samples
    def sample(self, cls: int, service_ms: float, sent_s: float, now_s: float) -> None:
        """One request of baseline class ``cls`` (:func:`sample_class`) took the broker ``service_ms``; it was
        sent at ``sent_s``, answered at ``now_s`` (monotonic seconds)."""
        if cls < 0 or cls >= CLASSES:
            return
        b = self.baselines[cls]
        if b is None:
            b = self.baselines[cls] = Baseline(now_s)
        base = b.add(service_ms, now_s)
        self.samples_total += 1
        if base == math.inf or sent_s < self.changed_s:
            return
        delays = self.delays
        if len(delays) < MAX_TICK_SAMPLES:  # the tick's first ones: its median needs no more
            delays.append(service_ms - base)
            if base < self.tick_base:
                self.tick_base = base
            if base < self.tick_trusted and b.prev != math.inf:  # lived a whole epoch (tick_trusted)
                self.tick_trusted = base

    # -------------------------------------------------------------------------------------------- tenants
    def tenant(self, key: str, weight: float, now_ms: int) -> Tenant:
        t = self.tenants.get(key)
        if t is None:
            if len(self.tenants) >= MAX_TENANTS:
                key = OTHER
                t = self.tenants.get(key)
            if t is None:
                t = self.tenants[key] = Tenant(key, self, weight, now_ms)
                if self.level > 0:
                    t.pace(self.level * weight, self.settings.burst_seconds, now_ms)
                elif self.room == math.inf and len(self.tenants) > 1 and self.settings.slow_start:
                    self._arm(t, now_ms)
        return t

    def charge(self, t: Tenant, work: float, now_ms: int) -> float:
        """``work`` arrived from ``t``: counted as its demand and, while the broker is limited, charged to its
        bucket. Returns where the bucket's refill total must reach for the request to go (a pacing mark, as
        ``TokenBucket.refilled`` counts), or -1 when it may go now."""
        t.arrived += work
        t.work_total += work
        t.last_ms = now_ms
        self.arrived += work
        bucket = t.bucket
        if bucket is None or not t.paced:
            if t.arrived <= t.allow:
                return -1.0
            bucket = self.start(t, now_ms)
        bucket.record(work, now_ms)
        tokens = bucket.tokens(now_ms)
        if tokens >= 0:
            return -1.0
        t.held_tick = True
        t.held_ms = now_ms
        return bucket.refilled(now_ms) - tokens

    def wait_ms(self, t: Tenant, mark: float, now_ms: int) -> int:
        """How long, at the tenant's rate now, until its bucket has refilled to ``mark`` (0: it may go; also once
        the broker is released)."""
        bucket = t.bucket
        if bucket is None or mark < 0 or not t.paced:
            return 0
        owed = mark - bucket.refilled(now_ms)
        if owed <= 0:
            return 0
        t.held_tick = True
        t.held_ms = now_ms
        return int(owed / bucket.rate * 1000.0 + 0.5)

    def throttle_ms(self, t: Tenant, now_ms: int) -> int:
        """For work charged after the fact (a Fetch answer): the time until the tenant's bucket is out of debt."""
        bucket = t.bucket
        if bucket is None or not t.paced:
            return 0
        tokens = bucket.tokens(now_ms)
        if tokens >= 0:
            return 0
        t.held_tick = True
        t.held_ms = now_ms
        return int(-tokens / bucket.rate * 1000.0 + 0.5)

    def tokens(self, t: Tenant, now_ms: int) -> float:
        """What the tenant's bucket holds now (a Fetch asks for no more); ``inf`` when it is not paced."""
        bucket = t.bucket
        return math.inf if bucket is None or not t.paced else bucket.tokens(now_ms)

    # -------------------------------------------------------------------------------------------- slow start
    def start(self, t: Tenant, now_ms: int) -> TokenBucket:
        """``t`` surges on this open broker (:data:`SURGE_FACTOR`): pace it from now at a part of the start rate,
        :data:`START_ROOM` (or this member's part of ``min_limit``, or twice its demand, if more) shared by every
        tenant starting here, which doubles each
        tick the delay stays low (:meth:`_ramp`). Tenants that start together share it: a flood spread over twenty
        client ids starts as one. Returns its bucket (the surging request is charged to it)."""
        rate = self._start_floor()
        # Twice its demand, if more, once that is known (a tenant's demand climbs to its rate over DEMAND_TAU_MS:
        # a flood a few ticks old is no steady producer bursting)
        own = SURGE_FACTOR * t.demand if now_ms - t.born_ms >= DEMAND_TAU_MS else 0.0
        if own > rate:
            rate = own
        if rate > self.start_rate:
            self.start_rate = rate
        t.starting = True
        t.allow = math.inf
        self.starting.append(t)
        self.starts += 1
        self._pace_starting(now_ms)
        self.changed_ms = now_ms  # samples of requests sent before it do not say what the paced surge costs
        self.changed_s = now_ms / 1000
        bucket = t.bucket
        assert bucket is not None  # paced just now
        return bucket

    def _start_floor(self) -> float:
        """:data:`START_ROOM`, or this member's part of ``min_work_rate`` when that is more (work bytes/s)."""
        part = self.settings.min_limit / self.members
        return part if part > START_ROOM else START_ROOM

    def _pace_starting(self, now_ms: int) -> None:
        weights = 0.0
        for t in self.starting:
            weights += t.weight
        burst = self.settings.burst_seconds
        for t in self.starting:
            t.pace(self.start_rate * t.weight / weights, burst, now_ms)

    def _ramp(self, q: float, now_ms: int) -> None:
        """A tick of slow start with the delay at or below the target (``q``; -1: no signal): the start ends once no
        starting tenant is held back (its work fits), else the rate doubles (:data:`START_GROWTH`; without a signal,
        every :data:`START_BLIND_TICKS`)."""
        held = False
        for t in self.starting:
            if t.held_tick:
                held = True
                break
        if not held:
            self._end_start(True)
            return
        if q < 0:
            self.start_blind += 1
            if self.start_blind < START_BLIND_TICKS:
                return
        self.start_blind = 0
        self.start_rate *= START_GROWTH
        self._pace_starting(now_ms)
        self.changed_ms = now_ms
        self.changed_s = now_ms / 1000

    def _end_start(self, unpace: bool) -> None:
        """Slow start ends: the starting tenants unpaced (their work fits, or nobody is there to protect), or handed
        to the division (``unpace`` false: the broker is limited now)."""
        for t in self.starting:
            t.starting = False
            if unpace:
                t.paced = False  # a request still held asks again, finds it unpaced, and goes (wait_ms)
        self.starting = []
        self.start_rate = 0.0
        self.start_blind = 0

    def _arm(self, new: Tenant, now_ms: int) -> None:
        """``new`` arrives on an open broker where the tick found at most one tenant active: if one is, it may surge
        into the newcomer from now, not from the next tick (a victim and a flood that start together: the flood's
        first tick, unpaced, is megabytes)."""
        for t in self.tenants.values():
            if t is not new and now_ms - t.last_ms < ACTIVE_MS:
                break
        else:
            return
        self._allow(self._start_floor() * (TICK_MS / 1000), None, now_ms)

    def _room(self, active: list[Tenant], now_ms: int) -> None:
        """Each tenant's :attr:`Tenant.allow` for the next tick: finite only while the broker is open and somebody
        else is active on it (here or, in a fleet, a light tenant of another member's): a lone tenant is never
        slowed, and on a limited broker the division paces newcomers. Not only a *settled* somebody: a victim and a
        flood that start together (the isolation bench's phases) would then never meet, and the flood's first second
        would go in unpaced."""
        n = len(active)
        sole = active[0] if n == 1 else None
        if self.remote_light:
            n += 1
            sole = None
        room = math.inf
        if self.limit <= 0 and n > 0 and self.settings.slow_start:
            room = self._start_floor() * (TICK_MS / 1000)
        self._allow(room, sole, now_ms)

    def _allow(self, room: float, sole: Tenant | None, now_ms: int) -> None:
        """:attr:`room` (per tick; ``inf``: nobody may surge) and each tenant's :attr:`Tenant.allow` from it: the room,
        twice its demand's share of a tick, and for a tenant known a second, a batch after a pause
        (:data:`START_BURST`); ``inf`` for the ``sole`` tenant active and the ones already starting."""
        self.room = room
        per_tick = SURGE_FACTOR * TICK_MS / 1000
        for t in self.tenants.values():
            if room == math.inf or t is sole or t.starting:
                t.allow = math.inf
            else:
                t.allow = room + per_tick * t.demand + (START_BURST if now_ms - t.born_ms >= DEMAND_TAU_MS else 0.0)

    # -------------------------------------------------------------------------------------------- the tick
    def tick(self, now_ms: int, tick_ms: int = TICK_MS) -> str:
        """One control step: demand, signal, law, division. Returns the state (``open``, ``start``, ``cut``,
        ``grow``, ``hold``)."""
        alpha = _alpha(tick_ms, DEMAND_TAU_MS)
        per_s = 1000.0 / tick_ms
        active: list[Tenant] = []
        held = False
        dead: list[str] = []
        for key, t in self.tenants.items():
            t.demand += alpha * (t.arrived * per_s - t.demand)
            t.arrived = 0.0
            if t.held_tick or now_ms - t.held_ms < HELD_MS:
                t.held_tick = True  # read by _floor and _divide below, cleared by _divide
                held = True
            if now_ms - t.last_ms < ACTIVE_MS or t.held_tick:
                # held counts as active: a flooder's 1-MB request paced at a low share waits longer than ACTIVE_MS,
                # and counted idle, it would leave the victim alone on the broker, which would be released into it
                active.append(t)
            elif now_ms - t.last_ms >= IDLE_MS and now_ms - t.held_ms >= IDLE_MS:
                dead.append(key)
        for key in dead:
            del self.tenants[key]
        if dead:
            self.epoch += 1
        self.admitted_rate += alpha * (self.arrived * per_s - self.admitted_rate)
        used = self.arrived * per_s
        self.arrived = 0.0
        if held:
            self.held_ms = now_ms

        delays = self.delays
        if len(delays) < MIN_SAMPLES:
            self.carried += 1
            if self.carried >= MAX_CARRY_TICKS:
                delays.clear()
                self.tick_base = self.tick_trusted = math.inf
                self.carried = 0
            q = -1.0
        else:
            q = _median(delays)
            self.base = self.tick_base
            self.trusted_base = self.tick_trusted
            self.q = q
            self.q_avg += _alpha(tick_ms, Q_TAU_MS) * (q - self.q_avg)
            delays.clear()
            self.tick_base = self.tick_trusted = math.inf
            self.carried = 0
        s = self.settings
        d = s.target_delay_ms
        base = self.trusted_base
        if self.remote_light:
            # In a fleet, the smallest baseline any member measures here: a member whose only tenant sends 1-MB
            # batches knows only their long one, and would hold the broker at many times the delay the victim's
            # member aims at (its cuts the later for it).
            for until, _demand, other in self.remote_light.values():
                if 0.0 < other < base and until > now_ms:
                    base = other
        if 0.5 * base > d and base != math.inf:
            d = 0.5 * base
        self.target = d

        was_open = self.limit <= 0
        if self.starting and len(active) < 2 and not self.remote_light:
            self._end_start(True)  # the surge is alone here: nobody to protect from it
        if was_open and self.starting and (q < 0 or q <= d):
            self._ramp(q, now_ms)
        if was_open and (q < 0 or q <= d) and self.members == 1:
            # The usual tick of a healthy broker: nothing to cut, no fleet to tell; no floor to find.
            for t in self.tenants.values():
                t.held_tick = False
            self.light_sum = 0.0
            self.state = "start" if self.starting else "open"
            self._room(active, now_ms)
            return self.state
        start_base = 0.0
        if self.starting:
            # Cut from what the start admits, not from what the surge brought before it was paced (the arrivals)
            start_base = self.start_rate
            for t in active:
                if not t.starting:
                    start_base += t.demand
        floor = self._floor(active, now_ms)
        self.state = self._law(q, d, floor, used, now_ms, start_base)
        self._divide(active, now_ms, was_open)
        if self.starting:
            if self.limit > 0:
                self._end_start(False)  # the division paces them now
            elif q > d and floor <= 0:
                self._end_start(True)  # the delay is up, but nobody here is light: nobody to protect
            else:
                self.state = "start"
        self._room(active, now_ms)
        return self.state

    def _law(self, q: float, d: float, floor: float, used: float, now_ms: int, start_base: float = 0.0) -> str:
        """The control law on :attr:`limit` (``q``: the tick's delay, -1 without enough samples; ``d``: the
        target; ``floor``: :meth:`_floor`; ``used``: work admitted in the tick, per second; ``start_base``: in slow
        start, what it admits per second)."""
        limit = self.limit
        quiet = q >= 0 and q < d and self.q_avg < GROW_BELOW * d
        if limit > 0 and (floor <= 0 or (quiet and now_ms - self.held_ms >= RELEASE_MS)):
            # Nobody left to protect (one tenant, or all alike), or nobody held back for a while at a low delay.
            self.limit = 0.0
            self.changed_ms = now_ms
            self.changed_s = now_ms / 1000
            return "open"
        if 0 < limit < floor:  # the light tenants use more than they did: the floor rises under them
            self.limit = limit = floor
        if q < 0:
            return "hold" if limit > 0 else "open"
        if q > d and floor > 0:
            if now_ms < self.next_cut_ms:
                return "hold" if limit > 0 else "open"
            took = limit
            if limit <= 0:  # saturated from open: start from what the broker was taking
                limit = took = self.admitted_rate if self.admitted_rate > used else used
                if 0 < start_base < limit:
                    limit = start_base  # what a slow start admits: the surge's arrivals were never let in
            cut = 1.0 - DECREASE * (q - d) / d
            new = limit * (cut if cut > MAX_CUT else MAX_CUT)
            if new < floor:
                new = floor
            if new < limit or self.limit <= 0:
                if self.limit <= 0:
                    # what the broker was asked to take (a light tenant is sparse against it, not against a start)
                    self.peak = took
                self.cut_from = limit
                self.limit = new
                self.changed_ms = now_ms
                self.changed_s = now_ms / 1000
                wait = q + self.base
                self.next_cut_ms = now_ms + (int(wait) if wait > TICK_MS else TICK_MS)
                self.cuts += 1
                return "cut"
            return "hold"
        if limit > 0 and quiet and used >= USED_FRACTION * limit:
            if limit < RECOVER_UNTIL * self.cut_from:
                step = RECOVER_FRACTION * (self.cut_from - limit)
            else:
                step = GROW_FRACTION * limit
            self.limit = limit + (step if step > GROW_MIN else GROW_MIN)
            if self.limit > self.peak:
                self.peak = self.limit
            self.changed_ms = now_ms
            self.changed_s = now_ms / 1000
            self.grows += 1
            return "grow"
        return "hold" if limit > 0 else "open"

    def _floor(self, active: list[Tenant], now_ms: int) -> float:
        """The least limit worth having: what the light tenants use, plus :attr:`FairShareSettings.min_limit` for
        all the others together; 0 when nobody is light, where a cut would hold everybody and protect nobody (one
        tenant alone, or tenants that all use about the same). Light, while the broker is open: using less than
        half the equal split of what its active tenants use; while it is limited: sparse (:meth:`_classify`). Not
        "that much again for each of the others": a tenant that splits itself over many client ids would raise such
        a floor with each. In a fleet, another member's light tenants here count as somebody to protect, but only
        while this member has a tenant to limit: not when its own are all too small to compare (:data:`FLEET_LIGHT`),
        or two members whose lone tenants are both small would each limit theirs, where one proxy holding both
        would see tenants alike and limit neither."""
        remote = 0.0
        if self.remote_light:
            for member, (until, demand, _base) in list(self.remote_light.items()):
                if until <= now_ms:
                    del self.remote_light[member]
                else:
                    remote += demand if demand > 0 else REQUEST_WORK
        # In a fleet, tenants too small to compare count in what this member tells the others (FLEET_LIGHT).
        small = FLEET_LIGHT * self.settings.min_limit / self.members if self.members > 1 else 0.0
        told = 0.0
        if len(active) < (1 if remote > 0 else 2):
            if (
                self.paused
                and self.limit > 0
                and remote <= 0
                and active
                and active[0].sparse
                and not active[0].held_tick
            ):
                # Only a light tenant is active, and one held back here lately is busy on another broker: it paused
                # (a producer whose queue is full of another broker's batches sends nothing here for seconds), it
                # has not left. Released, the broker would meet its return unlimited; the limit holds instead. A
                # tenant that merely went quiet is not a pause: on a broker of its own (or a fresh cluster's first
                # slow seconds, where a client creating topics was held), the lone light tenant is released.
                self.light_sum = active[0].demand
                return self.limit
            for t in active:
                if not t.held_tick and t.demand < small:
                    told += t.demand
            self.light_sum = told
            return 0.0
        light_sum = 0.0
        light = 0
        heavy = 0
        limited = self.limit > 0
        split = 0.0  # open: light is below half the equal split of what the active tenants use
        if limited:
            self._classify(active, self.limit, now_ms)  # limited: light is sparse
        else:
            for t in active:
                split += t.demand
            split /= len(active)
        for t in active:
            if t.sparse if limited else (not t.held_tick and t.demand < 0.5 * split):
                light += 1
                light_sum += t.demand
            elif not t.held_tick and t.demand < small:
                told += t.demand
            else:
                heavy += 1
        self.light_sum = light_sum + told
        if light == 0 and (remote <= 0 or heavy == 0):
            return 0.0
        floor = light_sum + self.settings.min_limit / self.members
        # and never so low that the light tenants overflow the sparse room (SPARSE_TOTAL of the limit): cut below
        # that, they would be classed heavy, nobody would be left to protect, and the broker would flap open.
        return floor if floor * SPARSE_TOTAL >= light_sum else light_sum / SPARSE_TOTAL

    def _classify(self, active: list[Tenant], limit: float, now_ms: int) -> None:
        """Which active tenants are sparse on a broker limited to ``limit`` (:data:`SPARSE_SHARE`): held back, or
        using a sparse share or more, makes a tenant heavy; not held for :data:`SPARSE_AFTER_MS` and light again
        makes it sparse; past :data:`SPARSE_TOTAL` of the limit, the heaviest sparse ones are heavy."""
        scale = limit if limit > self.peak else self.peak
        share = SPARSE_SHARE * (scale if scale > self.settings.min_limit else self.settings.min_limit)
        for t in active:
            if t.sparse:
                if (t.held_tick and now_ms - t.born_ms >= GRACE_MS) or t.demand >= share:
                    t.sparse = False
            elif now_ms - t.held_ms >= SPARSE_AFTER_MS and t.demand < 0.5 * share:
                t.sparse = True
        # A new tenant counts at its grace (what _divide gives it), not at a demand not yet known: twenty client ids
        # that start at once are not twenty graces on top of the limit, and those past the room are heavy.
        grace = GRACE_SHARE * limit
        counted = sorted(
            (grace if now_ms - t.born_ms < GRACE_MS and grace > t.demand else t.demand, i)
            for i, t in enumerate(active)
            if t.sparse
        )
        room = SPARSE_TOTAL * limit
        for k, (amount, i) in enumerate(counted):
            room -= amount
            if room < 0 and k > 0:  # the lightest stays: somebody is left to protect (no flap open)
                active[i].sparse = False

    def _divide(self, active: list[Tenant], now_ms: int, was_open: bool = False) -> None:
        """Max-min division of the limit (:func:`water_level`) among the heavy tenants, after the sparse ones'
        demand: a heavy tenant's bucket at the level, a sparse one's at no less than :data:`LIGHT_HEADROOM` times its
        own demand (and, new, half the sparse share: :data:`GRACE_MS`), so that a tenant below its share is not held
        even when many heavy ones push the level below what it uses."""
        limit = self.limit
        for t in self.tenants.values():
            t.held_tick = False
        if limit <= 0:
            self.level = 0.0
            if not was_open:
                for t in self.tenants.values():
                    t.paced = False  # a request still held asks again, finds it unpaced, and goes (wait_ms)
            return
        demands = [(t.demand if t.sparse else math.inf) for t in active]
        level = water_level(demands, [t.weight for t in active], limit)
        self.level = level
        burst = self.settings.burst_seconds
        grace = GRACE_SHARE * limit
        for t in self.tenants.values():
            rate = level * t.weight
            if t.sparse:
                if LIGHT_HEADROOM * t.demand > rate:
                    rate = LIGHT_HEADROOM * t.demand
                age = now_ms - t.born_ms
                if age < GRACE_MS:
                    if grace > rate:
                        rate = grace
                    # Its demand, an average started at zero, reads a new tenant's rate low (a tenth after a tick):
                    # its mean since it came is the better guess (a victim that starts beside a flood's slow start
                    # meets a limit cut within a second, and was held at twice its first ticks' average)
                    mean = LIGHT_HEADROOM * t.work_total * 1000.0 / (age if age > TICK_MS else TICK_MS)
                    if mean > rate:
                        rate = mean
            t.pace(rate, burst, now_ms)


def water_level(demands: list[float], weights: list[float], capacity: float) -> float:
    """Max-min fair share (Doorman's FAIR_SHARE, weighted): the level ``L`` such that giving each tenant
    ``min(demand, L × weight)`` uses ``capacity``. When every demand fits, the level is the largest demand per
    weight plus what is left over (room to grow). ``inf`` demands are tenants that want more than they get."""
    order = sorted(range(len(demands)), key=lambda i: demands[i] / weights[i])
    remaining = capacity
    weight_left = 0.0
    for w in weights:
        weight_left += w
    top = 0.0
    for i in order:
        level = remaining / weight_left if weight_left > 0 else remaining
        need = demands[i] / weights[i]
        if need > level:
            return level
        remaining -= demands[i]
        weight_left -= weights[i]
        top = need
    return top + (remaining if remaining > 0 else 0.0)


def _alpha(dt_ms: int, tau_ms: int) -> float:
    """The weight of a new value in an exponential average of time constant ``tau_ms``, ``dt_ms`` after the last.
    (Not remembered in a dict by (dt, tau): compiled, that lookup, a tuple and a boxed float, cost ten times the
    ``exp``.)"""
    return 1.0 - math.exp(-dt_ms / tau_ms)


def _median(values: list[float]) -> float:
    """The median of ``values``, sorted in place (the tick clears them after: no copy)."""
    s = values
    s.sort()
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


class FairShare:
    """Every broker's load, keyed by the proxy's name for the broker (its listener label)."""

    __slots__ = ("settings", "brokers", "weights", "last_tick_ms", "changes", "trace", "members")

    def __init__(self, settings: FairShareSettings, weights: dict[str, float] | None = None) -> None:
        self.settings = settings
        self.brokers: dict[str, BrokerLoad] = {}
        self.weights: dict[str, float] = dict(weights or {})
        """Tenant key -> weight (1 when absent)."""
        self.last_tick_ms = -1
        self.changes: list[tuple[BrokerLoad, str]] = []
        """Brokers whose state changed from open to limited or back since :meth:`take_changes` (for the log)."""
        self.trace: list[tuple[int, str, float, float, float, float, str, int]] | None = None
        """Diagnosis (the proxy's timeline): every broker's loop at every tick, when set (drained by its owner)."""
        self.members = 1
        """The fleet's live members (1: a proxy on its own), given to every broker (:meth:`set_members`)."""

    def configure(self, settings: FairShareSettings, weights: dict[str, float] | None = None) -> None:
        """New settings (a reload): the brokers keep their baselines and limits; weights apply from the next
        request of each tenant."""
        self.settings = settings
        self.weights = dict(weights or {})
        for b in self.brokers.values():
            b.settings = settings
            b.epoch += 1
            if not settings.slow_start:  # turned off: a start in course ends, and nobody can surge into one
                b._end_start(True)
                b.room = math.inf
            for t in b.tenants.values():
                t.weight = self.weights.get(t.key, 1.0)
                if not settings.slow_start:
                    t.allow = math.inf

    def light(self) -> dict[str, float]:
        """Per broker, this member's light tenants' demand now (work bytes/s), with, in a fleet, its tenants too small
        to compare (:data:`FLEET_LIGHT`): what a fleet member tells the others (only brokers where it has some)."""
        return {key: b.light_sum for key, b in self.brokers.items() if b.light_sum > 0}

    def baselines(self) -> dict[str, float]:
        """Per broker of :meth:`light`, the smallest baseline this member measured there in its last tick with
        enough samples that has lived a whole epoch (ms; absent when none yet: ``tick_trusted``): what a fleet
        member tells the others with its light tenants."""
        return {
            key: b.trusted_base for key, b in self.brokers.items() if b.light_sum > 0 and 0 < b.trusted_base < math.inf
        }

    def note_remote(
        self, member: str, light: dict[str, float], members: int, until_ms: int, base: dict[str, float] | None = None
    ) -> None:
        """Another member's report (:meth:`light`, :meth:`baselines`): its light tenants count on these brokers
        until ``until_ms``, and its baseline in their target; ``members``: the fleet's live members now (each takes
        its part of the floor)."""
        bases = base or {}
        for key, demand in list(light.items())[:4096]:  # the report is bounded by its writer; this is too
            b = self.brokers.get(key)
            if b is not None:
                if len(b.remote_light) >= 1024 and member not in b.remote_light:
                    continue  # members are bounded by the fleet's own records; this bounds a forged flood of them
                b.remote_light[member] = (until_ms, demand, bases.get(key, 0.0))
        self.set_members(members)

    def set_members(self, members: int) -> None:
        """The fleet's live members now (a fleet member says so every sync, whether or not anybody reports): each
        takes its part of the floor, and above one, tells the others of its tenants too small to compare
        (:data:`FLEET_LIGHT`)."""
        self.members = members if members > 0 else 1
        for b in self.brokers.values():
            b.members = self.members

    def broker(self, key: str, now_ms: int) -> BrokerLoad:
        b = self.brokers.get(key)
        if b is None:
            if len(self.brokers) >= 4096:  # bootstrap connections name brokers by address: bounded
                for old in self.brokers.values():
                    old.epoch += 1  # connections bound to it bind again, to a broker in the table
                self.brokers.clear()
            b = self.brokers[key] = BrokerLoad(key, self.settings, now_ms)
            b.members = self.members
        return b

    def tenant(self, broker: BrokerLoad, key: str, now_ms: int) -> Tenant:
        return broker.tenant(key, self.weights.get(key, 1.0), now_ms)

    def charge_mutation(self, t: Tenant, work: float, spread: float, now_ms: int) -> tuple[Tenant, float]:
        """A topic mutation request from ``t``: ``work`` (the request, its mutations' work included) charged on its
        own broker, and ``spread`` (its mutations' :data:`MUTATION_WORK`) on every other broker where the same tenant
        is active. Returns the tenant (``t``, or the same tenant on another broker) and pacing mark whose wait is the
        longest (mark -1: it may go now): the request waits for the broker whose share it overdraws most.

        Why every broker: the controller's records reach them all, and a topic's partitions land on several, so a
        churn costs each broker, not only the one the admin client asked. Charged on that one alone, the churn was
        held only while that broker was limited: in issue 48's bench the flood's admin client asked a broker whose
        limit stayed at 58 MiB/s, and its create/delete loop ran at 49-63 mutations a second (4-15 where its broker
        held it) while the other brokers' loops cut the flood's Produce for the stalls the churn caused there."""
        own = t.broker
        worst, mark = t, own.charge(t, work, now_ms)
        longest = own.wait_ms(t, mark, now_ms) if mark >= 0 else 0
        if spread <= 0:
            return worst, mark
        n = 0
        for b in self.brokers.values():
            if b is own:
                continue
            n += 1
            if n > SPREAD_BROKERS:
                break
            other = b.tenants.get(t.key)
            if other is None or (
                now_ms - other.last_ms >= ACTIVE_MS and not other.held_tick and now_ms - other.held_ms >= HELD_MS
            ):
                continue  # not active there (held counts: a paced producer's next request may be seconds away)
            m = b.charge(other, spread, now_ms)
            if m >= 0:
                w = b.wait_ms(other, m, now_ms)
                if w > longest:
                    worst, mark, longest = other, m, w
        return worst, mark

    def tick(self, now_ms: int) -> None:
        """Run every broker's control step, once per :data:`TICK_MS` (called more often, it returns at once: the
        proxy calls it from each request, so a busy proxy ticks on time and an idle one costs no timer)."""
        if self.last_tick_ms >= 0 and now_ms - self.last_tick_ms < TICK_MS:
            return
        elapsed = TICK_MS if self.last_tick_ms < 0 else min(now_ms - self.last_tick_ms, 10 * TICK_MS)
        self.last_tick_ms = now_ms
        self._across_brokers(now_ms)
        for b in self.brokers.values():
            was_open = b.limit <= 0
            b.tick(now_ms, elapsed)
            if was_open != (b.limit <= 0) and len(self.changes) < 4096:
                self.changes.append((b, b.state))
            if self.trace is not None and len(self.trace) < 100_000:
                self.trace.append((now_ms, b.key, b.limit, b.level, b.q, b.base, b.state, len(b.tenants)))

    def _across_brokers(self, now_ms: int) -> None:
        """What one broker learns from the others about a producer held back, for each limited broker. Why: a
        producer held on one broker stops sending to the others (librdkafka's one queue fills with the held broker's
        batches), so there it looks paused or light, not held; released, the broker met its return unlimited, a surge
        the next cut had to undo (the real floods logged "released 3-12x" a 40-s flood).

        - A tenant that sent here within :data:`RELEASE_MS` and is held on another broker now counts as held here
          (:attr:`BrokerLoad.held_ms`): it trickles here below its share.
        - A tenant held here within :data:`RELEASE_MS` that sends nothing here now but is active on another broker
          has paused here (:attr:`BrokerLoad.paused`), not left.

        Only limited brokers are looked at: an open one has nothing to release."""
        limited: list[BrokerLoad] = []
        for b in self.brokers.values():
            b.paused = False
            if b.limit > 0:
                limited.append(b)
        if not limited:  # the usual tick: the sets below (tuples and hashes a tenant) are for limited brokers
            return
        held: set[str] = set()
        busy: set[tuple[str, str]] = set()  # (tenant, broker) active within ACTIVE_MS
        for b in self.brokers.values():
            for t in b.tenants.values():
                if t.held_tick or now_ms - t.held_ms < HELD_MS:
                    held.add(t.key)
                if now_ms - t.last_ms < ACTIVE_MS:
                    busy.add((t.key, b.key))
        busy_keys = {key for key, _b in busy}
        for b in limited:
            for t in b.tenants.values():
                if b.held_ms < now_ms and t.key in held and now_ms - t.last_ms < RELEASE_MS:
                    b.held_ms = now_ms
                if (
                    not b.paused
                    and now_ms - t.held_ms < RELEASE_MS
                    and t.key in busy_keys
                    and (t.key, b.key) not in busy
                ):
                    b.paused = True

    def take_changes(self) -> list[tuple[BrokerLoad, str]]:
        changes, self.changes = self.changes, []
        return changes
