"""Per-entity quota state: which tracker a request is charged to, and what throttle that yields.

Pure policy: time comes in as milliseconds from the caller. One tracker per (quota key, scope, bucket), where
the bucket is Kafka's sharing rule (:class:`quotas.entities.BucketKey`) and the scope is the broker the
connection talks to (Kafka's per-broker enforcement) or ``""`` when quotas span the whole cluster. Callers pass
the connection's scope for every key; :func:`bucket_scope` decides which keys really are per broker.

Kafka behaviours kept:
- nothing is recorded for a quota key until some entity has it (``resolve`` returns None: no tracker exists);
- a changed limit for the same bucket keeps the recorded history (Kafka updates the sensor's quota in place);
- idle trackers are dropped after ``idle_ms`` (Kafka's one-hour sensor expiry), which also bounds the metrics'
  label cardinality.

One addition, because client ids are chosen by clients: at most ``max_trackers`` trackers are kept; past that the
least recently used tenth is dropped (a dropped bucket starts afresh if it comes back, exactly as one that
idled out). A client rotating through new client ids under a ``<default>`` quota gets a new bucket per id
anyway, as in Kafka, so the cap costs enforcement nothing while the cap exceeds the entities actually active.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from quotas.entities import BucketKey, QuotaStore, Resolved
from quotas.fleet_reports import FleetLedger, Usage
from quotas.kinds import BY_KEY, CLUSTER_WIDE_KEYS, CONTROLLER_MUTATION_RATE
from quotas.rate import SampledRate, byte_rate_throttle_ms, request_throttle_ms
from quotas.throttle import java_round
from quotas.token_bucket import TokenBucket, admit

GROUPS = {key: kind.group for key, kind in BY_KEY.items()}
"""Kafka's metric groups, by quota key (from the catalogue)."""

PACED_FORMULAS = frozenset({"bytes", "request"})
"""The throttle formulas smooth enforcement replaces with pacing: byte rates and the request quota (KIP-599 is a
token bucket already; KIP-936 counts ids per window, not a flow to pace)."""

OTHER = "__other__"
"""User and client-id label of the bucket that stands for every bucket not named in a capped scrape."""


def bucket_scope(key: str, scope: str) -> str:
    """The scope a charge to ``key`` is kept under, for a connection whose scope is ``scope``."""
    return "" if key in CLUSTER_WIDE_KEYS else scope


class Window(NamedTuple):
    """One window family: how many samples, each how long (Kafka's ``*.window.num`` / ``*.window.size``).

    Tuples, not frozen dataclasses: the Spark job pickles them to its executors, and a frozen dataclass compiled
    by mypyc cannot be unpickled."""

    samples: int
    size_ms: int


_SETTING_PREFIX = {"rate": "", "controller": "controller_", "pids": "producer_id_"}
"""Window family (``QuotaKind.window``) -> prefix of its ``window_num`` / ``window_size_seconds`` settings."""


class Windows(NamedTuple):
    """The window of each family a quota kind samples with (``QuotaKind.window`` names the field)."""

    rate: Window = Window(11, 1000)
    controller: Window = Window(11, 1000)
    pids: Window = Window(11, 3_600_000)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Windows:
        """From ``window_num``, ``window_size_seconds``, ``controller_window_*``, ``producer_id_window_*`` (the
        proxy's ``quotas:`` section and the Spark job's quota files name them alike); absent ones default."""
        defaults = cls()
        families = {}
        for family, prefix in _SETTING_PREFIX.items():
            d = getattr(defaults, family)
            families[family] = Window(
                int(settings.get(prefix + "window_num", d.samples)),
                round(float(settings.get(prefix + "window_size_seconds", d.size_ms / 1000)) * 1000),
            )
        return cls(**families)


DEFAULT_WINDOWS = Windows()


class Charge(NamedTuple):
    """The outcome of recording one amount against one quota (a tuple: made on every charge, so cheap)."""

    key: str
    bucket: BucketKey
    limit: float
    value: float
    """The amount recorded."""
    observed: float
    """The rate after recording (tokens, for the controller-mutation bucket)."""
    throttle_ms: int


@dataclass(frozen=True, slots=True)
class MutationCharge:
    """The outcome of one KIP-599 request against its bucket."""

    admitted: list[bool]
    """Per topic, in request order."""
    mutations: int
    """Partitions admitted and recorded."""
    limit: float
    throttle_ms: int

    @property
    def rejected(self) -> list[int]:
        return [i for i, ok in enumerate(self.admitted) if not ok]


class Tracker:
    __slots__ = (
        "stat",
        "limit",
        "last_used_ms",
        "throttle_ms_total",
        "last_throttle_ms",
        "mutations",
        "recorded_total",
        "remote_total",
        "pace",
        "tag_user",
    )

    def __init__(
        self,
        stat: Any,
        limit: float,
        now_ms: int,
        mutations: SampledRate | None = None,
        pace: TokenBucket | None = None,
        tag_user: str = "",
    ) -> None:
        self.stat = stat
        """A :class:`TokenBucket` (the controller-mutation quota) or a :class:`SampledRate` (the rest). Typed Any,
        not the union: each reader takes it as the one type its path knows (``stat: SampledRate = t.stat``, a
        checked assignment when compiled), where the union would need a ``cast()``, a call per request when not."""
        self.pace = pace
        """With smooth enforcement, for byte rates and the request quota: the bucket that paces the client (its
        throttle is the time until the bucket is back to zero); ``stat`` still measures the rate."""
        self.mutations = mutations
        """For the controller-mutation bucket: the rate of mutations recorded (Kafka's ``mutation-rate``)."""
        self.limit = limit
        """The limit enforced: the quota, or a fleet member's lease (its share of the quota, which the store
        resolves to in a fleet). Updated when a request binds or charges the bucket."""
        self.tag_user = tag_user
        """The raw user name behind the bucket's user tag (``""`` when it has none): the bucket key holds it
        sanitized, and the store is keyed by raw names (:meth:`QuotaStore.quota_limit`, at scrape time)."""
        self.last_used_ms = now_ms
        self.throttle_ms_total = 0
        self.recorded_total = 0.0
        """Everything ever recorded (bytes, percent-seconds, partitions, new producer ids): exact, for tests and
        for checking an offline analysis against the proxy's own counts."""
        self.last_throttle_ms = 0
        self.remote_total = 0.0
        """What other fleet members reported for this bucket (quota scope ``fleet``)."""

    def note_throttle(self, throttle_ms: int) -> None:
        self.last_throttle_ms = throttle_ms
        self.throttle_ms_total += max(throttle_ms, 0)

    def set_limit(self, limit: float, now_ms: int) -> None:
        """A quota altered, or a fleet member's share moved: the buckets keep their debt and credit
        (:meth:`TokenBucket.set_rate`)."""
        self.limit = limit
        if isinstance(self.stat, TokenBucket):
            self.stat.set_rate(limit, now_ms)
        if self.pace is not None:
            self.pace.set_rate(limit, now_ms)


class Bound:
    """One quota key resolved for one (user, client id, scope) to its tracker: a handle the caller may keep and
    charge through :meth:`QuotaManager.charge` while :meth:`QuotaManager.stamp` is unchanged.

    Why: resolving the entity and finding the tracker cost more than the charge itself, and they give the same
    answer request after request on one connection. A connection keeps its handles; any change that could make
    one wrong (quotas altered, a tracker dropped, new windows) changes the stamp, and it binds again.
    """

    __slots__ = ("bucket", "client_id", "formula", "key", "limit", "tracker", "user")

    def __init__(self, key: str, r: Resolved, user: str, client_id: str, tracker: Tracker) -> None:
        self.key = key
        self.bucket = r.bucket
        self.limit = r.limit
        self.user = user
        self.client_id = client_id
        self.tracker = tracker
        self.formula = BY_KEY[key].throttle


class QuotaManager:
    def __init__(
        self,
        store: QuotaStore,
        windows: Windows = DEFAULT_WINDOWS,
        idle_ms: int = 3_600_000,
        max_trackers: int = 20_000,
        ledger: FleetLedger | None = None,
    ) -> None:
        self.store = store
        self._epoch = 0
        """Bumped whenever the store's quotas change, a tracker is dropped or the windows change: a kept
        :class:`Bound` may be stale."""
        store.on_change(self._store_changed)
        self.windows = windows
        self.idle_ms = idle_ms
        self.max_trackers = max_trackers
        self.evicted = 0
        """Trackers dropped because the cap was reached (not idle expiry)."""
        self._trackers: dict[tuple[str, str, BucketKey], Tracker] = {}
        self.ledger = ledger
        """Quota scope ``fleet``: every local charge is also noted here, for the other members."""
        self.pace_s: float | None = None
        """Smooth enforcement: byte rates and the request quota are paced by a bucket of this many seconds of
        quota (None: Kafka's windowed throttles)."""

    def configure(
        self, windows: Windows, idle_ms: int, max_trackers: int | None = None, pace_s: float | None = None
    ) -> None:
        """New window or pacing settings drop all state (Kafka needs a restart for these; the proxy starts
        afresh)."""
        if windows != self.windows or pace_s != self.pace_s:
            self._trackers.clear()
        self.pace_s = pace_s
        self._epoch += 1  # also for a reload that keeps them: it may change how callers scope their charges
        self.windows = windows
        self.idle_ms = idle_ms
        if max_trackers is not None:
            self.max_trackers = max_trackers

    def __len__(self) -> int:
        return len(self._trackers)

    def stamp(self) -> int:
        """Changes whenever a :class:`Bound` made before may be stale: quotas altered, a tracker dropped or the
        windows changed."""
        return self._epoch

    def _store_changed(self) -> None:
        self._epoch += 1

    # ------------------------------------------------------------------------------------------ trackers

    def _tracker(self, r: Resolved, scope: str, now_ms: int, user: str) -> Tracker:
        """``user``: the raw name ``r`` was resolved for (kept by a new tracker, for the scrape's quota)."""
        key = r.key
        tk = (key, "" if key in CLUSTER_WIDE_KEYS else scope, r.bucket)  # bucket_scope, inlined: every charge
        t = self._trackers.get(tk)
        w = self.windows
        if t is None:
            mutations = None
            pace = None
            stat: TokenBucket | SampledRate
            window: Window = getattr(w, BY_KEY[r.key].window)
            formula = BY_KEY[r.key].throttle
            if formula == "bucket":
                stat = TokenBucket(r.limit, window.samples, window.size_ms / 1000, now_ms)
                mutations = SampledRate(window.samples, window.size_ms)
            else:
                stat = SampledRate(window.samples, window.size_ms)
                if self.pace_s is not None and formula in PACED_FORMULAS:
                    pace = TokenBucket(r.limit, 1, self.pace_s, now_ms)
            if len(self._trackers) >= self.max_trackers:
                self._evict()
            tag_user = user if r.bucket.user else ""
            t = self._trackers[tk] = Tracker(stat, r.limit, now_ms, mutations, pace, tag_user)
        elif t.limit != r.limit:
            t.set_limit(r.limit, now_ms)
        t.last_used_ms = now_ms
        return t

    # ------------------------------------------------------------------------------------------ rates

    def bind(self, key: str, user: str, client_id: str, scope: str, now_ms: int) -> Bound | None:
        """The handle to charge rate quota ``key`` for this client through, or None when no quota applies."""
        r = self.store.resolve(user, client_id, key)
        if r is None:
            return None
        return Bound(key, r, user, client_id, self._tracker(r, scope, now_ms, user))

    def charge_rate(self, key: str, user: str, client_id: str, scope: str, amount: float, now_ms: int) -> Charge | None:
        """Record ``amount`` against the rate quota ``key`` (bytes, percent-seconds, new producer ids), then
        check (Kafka records first: a violating request is already counted). None when no quota applies."""
        b = self.bind(key, user, client_id, scope, now_ms)
        if b is None:
            return None
        observed, throttle = self._charge(b, amount, now_ms)
        return Charge(key, b.bucket, b.limit, amount, observed, throttle)

    def charge(self, b: Bound, amount: float, now_ms: int) -> int:
        """:meth:`charge_rate` through a kept handle (valid while :meth:`stamp` is unchanged): the throttle."""
        return self._charge(b, amount, now_ms)[1]

    def _charge(self, b: Bound, amount: float, now_ms: int) -> tuple[float, int]:
        """Record, then check: (the observed rate, in the limit's unit; the throttle in ms)."""
        t = b.tracker
        t.last_used_ms = now_ms
        stat: SampledRate = t.stat
        observed, window = stat.record_and_measure(amount, now_ms)
        t.recorded_total += amount
        if self.ledger is not None:
            self.ledger.add((b.key, b.bucket), b.key, b.user, b.client_id, amount)
        limit = b.limit
        formula = b.formula
        pace = t.pace
        if pace is not None:  # smooth enforcement: the wait until the pacing bucket is back to zero
            pace.record(amount, now_ms)
            throttle = pace.throttle_ms(now_ms)
        elif formula == "per_window":
            # KIP-936: producer_ids_rate is "the number of active PIDs per quota window", so the limit per
            # second is that over the window size; the throttle is capped at one window, by when the oldest
            # bloom filter has turned over and the user's ids count as new again anyway.
            per_window_s = self.windows.pids.size_ms / 1000
            limit /= per_window_s
            throttle = (
                0
                if observed <= limit
                else min(byte_rate_throttle_ms(observed, limit, window), self.windows.pids.size_ms)
            )
            observed *= per_window_s
        elif observed <= limit:  # within quota, the common case: every formula gives 0
            throttle = 0
        elif formula == "request":
            throttle = request_throttle_ms(observed, limit, window, self.windows.rate.size_ms)
        else:
            throttle = byte_rate_throttle_ms(observed, limit, window)
        t.last_throttle_ms = throttle  # Tracker.note_throttle, inlined: every charge
        if throttle > 0:
            t.throttle_ms_total += throttle
        return observed, throttle

    def pace_tokens(self, b: Bound, now_ms: int) -> float | None:
        """What the pacing bucket behind ``b`` holds now (smooth enforcement; None without one): a Fetch asks
        the broker for no more."""
        pace = b.tracker.pace
        return None if pace is None else pace.tokens(now_ms)

    def pace_mark(self, b: Bound, now_ms: int) -> float | None:
        """Where the pacing bucket behind ``b`` stands on its refill total (:meth:`TokenBucket.refilled`) once the
        debt it holds now is paid: the request just charged may go when :meth:`pace_wait_ms` of it is 0. None
        without a pacing bucket or without a debt."""
        pace = b.tracker.pace
        if pace is None:
            return None
        tokens = pace.tokens(now_ms)
        return None if tokens >= 0 else pace.refilled(now_ms) - tokens

    def pace_wait_ms(self, b: Bound, mark: float, now_ms: int) -> int:
        """How long, at the rate in force now, until the pacing bucket behind ``b`` has refilled up to ``mark``
        (:meth:`pace_mark`). The rate is read from the store again first: a fleet member's share may have changed
        since ``b`` was bound, and nothing else rebinds a connection that reads no request while it waits."""
        t = b.tracker
        pace = t.pace
        if pace is None:
            return 0
        r = self.store.resolve(b.user, b.client_id, b.key)
        if r is not None and r.bucket == b.bucket and r.limit != t.limit:
            t.set_limit(r.limit, now_ms)
        owed = mark - pace.refilled(now_ms)
        return 0 if owed <= 0 else java_round(owed / pace.rate * 1000.0)

    # ------------------------------------------------------------------------------------------ mutations

    def mutation_tracker(self, user: str, client_id: str, scope: str, now_ms: int) -> Tracker | None:
        """The controller-mutation token bucket for this client, or None when no quota applies."""
        r = self.store.resolve(user, client_id, CONTROLLER_MUTATION_RATE)
        if r is None:
            return None
        return self._tracker(r, scope, now_ms, user)

    def charge_mutations(
        self, user: str, client_id: str, scope: str, counts: list[int], now_ms: int, strict: bool
    ) -> MutationCharge | None:
        """KIP-599, the one sequence the proxy and the offline replay both run: admit the topics of one request
        against the bucket (:func:`quotas.token_bucket.admit`: strict requests report a throttle only when a
        topic was rejected; a fully admitted one that drives tokens negative gets 0, its successor is
        rejected), note the throttle, record what was admitted. None when no quota applies."""
        tracker = self.mutation_tracker(user, client_id, scope, now_ms)
        if tracker is None:
            return None
        admission = admit(tracker.stat, counts, now_ms, strict=strict)
        tracker.note_throttle(admission.throttle_ms)
        admitted = sum(c for c, ok in zip(counts, admission.admitted, strict=True) if ok)
        assert tracker.mutations is not None  # a bucket tracker has its mutation rate
        tracker.mutations.record(admitted, now_ms)
        tracker.recorded_total += admitted
        if self.ledger is not None and admitted:
            self.ledger.add(
                (CONTROLLER_MUTATION_RATE, user, client_id), CONTROLLER_MUTATION_RATE, user, client_id, admitted
            )
        return MutationCharge(admission.admitted, admitted, tracker.limit, admission.throttle_ms)

    # ------------------------------------------------------------------------------------------ fleet

    def apply_remote(self, usage: Usage, now_ms: int) -> bool:
        """Fold another fleet member's usage into the bucket it resolves to here: recorded like a local charge
        (so the next local request sees the fleet's rate or tokens), but no throttle is computed and nothing goes
        back into the ledger. False when no quota applies here to that (user, client id, key)."""
        r = self.store.resolve(usage.user, usage.client_id, usage.key)
        if r is None:
            return False
        t = self._tracker(r, "", now_ms, usage.user)
        t.stat.record(usage.amount, now_ms)
        if t.pace is not None:
            t.pace.record(usage.amount, now_ms)
        if t.mutations is not None:
            t.mutations.record(usage.amount, now_ms)
        t.remote_total += usage.amount
        return True

    def apply_bound(self, b: Bound, amount: float, now_ms: int) -> None:
        """:meth:`apply_remote` through a kept handle (:meth:`bind` with scope ``""``; valid while :meth:`stamp`
        is unchanged). Why: a fleet member folds the same buckets every interval, and resolving each again cost
        four times the recording (10,000 buckets x 4 folds a second: ~100 ms of CPU a second against ~25)."""
        t = b.tracker
        t.last_used_ms = now_ms
        t.stat.record(amount, now_ms)
        if t.pace is not None:
            t.pace.record(amount, now_ms)
        if t.mutations is not None:
            t.mutations.record(amount, now_ms)
        t.remote_total += amount

    # ------------------------------------------------------------------------------------------ upkeep

    def expire(self, now_ms: int) -> int:
        """Drop trackers idle for ``idle_ms`` and those whose bucket no longer applies; returns how many."""
        dead = [k for k, t in self._trackers.items() if now_ms - t.last_used_ms >= self.idle_ms]
        for k in dead:
            del self._trackers[k]
        if dead:
            self._epoch += 1
        return len(dead)

    def _evict(self) -> None:
        """Drop the least recently used tenth of the trackers (amortised: one scan per that many new ones)."""
        n = max(1, self.max_trackers // 10)
        for k, _t in heapq.nsmallest(n, self._trackers.items(), key=lambda kv: kv[1].last_used_ms):
            del self._trackers[k]
        self.evicted += n
        self._epoch += 1

    def samples(self, now_ms: int, top: int | None = None) -> Iterator[tuple[str, str, str, str, str, float]]:
        """Kafka-named metric samples: (group, name, user, client id, scope, value).

        With ``top``, only the ``top`` buckets of each quota key that matter most (throttled now, then the most
        recorded) are named; the rest are folded into one ``__other__`` bucket per key and scope: their
        throttle-time is the largest, their totals the sums, and no rate (measuring thousands of rates is what
        made a scrape slow). The label set then stays bounded whatever clients do.

        Two limits per named bucket, neither a Kafka metric (Kafka keeps quotas in its configs): ``quota-limit``,
        the quota configured now (the store's :meth:`~QuotaStore.quota_limit`: what the file, kafka-configs or
        AlterClientQuotas set; absent while none applies, e.g. after its removal, until the bucket idles out), and,
        only in a fleet (the store is ``leased``), ``lease-limit``: the limit this member enforces, its share of
        the quota (as the bucket's last request bound it). Why two series and not the enforced limit alone: in a
        fleet that is an allocation moving every interval, and shown as the quota it hid the quota (issue 48);
        why only in a fleet: elsewhere it is the quota, and a series that appeared whenever the two differed
        would come and go in a fleet whose share is now and then the whole quota."""
        store = self.store
        leased = store.leased
        items = list(self._trackers.items())
        if top is not None and len(items) > top:
            by_key: dict[str, list[tuple[tuple[str, str, BucketKey], Tracker]]] = {}
            for item in items:
                by_key.setdefault(item[0][0], []).append(item)
            items = []
            for key, group_items in by_key.items():
                if len(group_items) <= top:
                    items.extend(group_items)
                    continue
                ranked = heapq.nlargest(
                    top, group_items, key=lambda kv: (kv[1].last_throttle_ms > 0, kv[1].recorded_total)
                )
                items.extend(ranked)
                named = {id(kv[1]) for kv in ranked}
                folded: dict[str, list[float]] = {}
                for (_k, scope, _b), t in group_items:
                    if id(t) in named:
                        continue
                    f = folded.setdefault(scope, [0.0, 0.0, 0.0])
                    f[0] = max(f[0], t.last_throttle_ms)
                    f[1] += t.throttle_ms_total
                    f[2] += t.recorded_total
                for scope, (last, total, recorded) in folded.items():
                    yield GROUPS[key], "throttle-time", OTHER, OTHER, scope, float(last)
                    yield GROUPS[key], "throttle-time-total", OTHER, OTHER, scope, total
                    yield GROUPS[key], "recorded-total", OTHER, OTHER, scope, recorded
        for (key, scope, bucket), t in items:
            kind = BY_KEY[key]
            group = kind.group
            if kind.throttle == "bucket":
                bucket_stat: TokenBucket = t.stat
                yield group, "tokens", bucket.user, bucket.client_id, scope, bucket_stat.tokens(now_ms)
                assert t.mutations is not None
                yield group, "mutation-rate", bucket.user, bucket.client_id, scope, t.mutations.measure(now_ms)
            else:
                name = kind.metric
                value = t.stat.measure(now_ms)
                if kind.window == "pids":
                    value *= self.windows.pids.size_ms / 1000  # per window, the unit of producer_ids_rate
                yield group, name, bucket.user, bucket.client_id, scope, value
            quota = store.quota_limit(key, t.tag_user, bucket.client_id)
            if quota is not None:
                yield group, "quota-limit", bucket.user, bucket.client_id, scope, float(quota)
            if leased:
                yield group, "lease-limit", bucket.user, bucket.client_id, scope, float(t.limit)
            yield group, "throttle-time", bucket.user, bucket.client_id, scope, float(t.last_throttle_ms)
            yield group, "throttle-time-total", bucket.user, bucket.client_id, scope, float(t.throttle_ms_total)
            yield group, "recorded-total", bucket.user, bucket.client_id, scope, t.recorded_total
