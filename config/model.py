"""The proxy's configuration, validated with pydantic so a bad field is refused by name."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from protocol.apis import API_NAMES, REQUESTS, api_name
from protocol.principal import PrincipalMapper
from quotas.entities import DEFAULT, EntityName, QuotaEntity, QuotaEntityError, QuotaValueError, validate_quota
from quotas.kinds import BUILTIN_COSTS, RequestCosts


class _Strict(BaseModel):
    # Attribute docstrings become the fields' descriptions: config/reference.py writes the configuration page
    # from them, so the page and the model cannot drift apart.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} is not host:port")
    host = host.strip("[]")
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"{value!r} has a non-numeric port") from None
    if not 0 < p < 65536:
        raise ValueError(f"{value!r} has port {p} outside 1-65535")
    return host, p


def _existing_file(value: str | None) -> str | None:
    if value is not None and not Path(value).is_file():
        raise ValueError(f"{value!r} is not a readable file")
    return value


class UpstreamTlsConfig(_Strict):
    """TLS towards the cluster (its SSL or SASL_SSL listener); present = on."""

    ca_file: str | None = None
    """PEM CA certificates the cluster's certificates are verified against; unset = the system's trust store."""
    cert_file: str | None = None
    """PEM certificate (chain) of the proxy, for a cluster listener with ``ssl.client.auth=required``."""
    key_file: str | None = None
    """PEM private key of ``cert_file`` (unencrypted); set with it or not at all."""
    check_hostname: bool = True
    """Like ``ssl.endpoint.identification.algorithm=https``: the broker's certificate must name its host."""

    _files = field_validator("ca_file", "cert_file", "key_file")(_existing_file)

    @model_validator(mode="after")
    def _pair(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class ListenTlsConfig(_Strict):
    """TLS termination on every listener (bootstrap and per broker); present = on."""

    cert_file: str
    """PEM certificate (chain) the proxy presents to clients."""
    key_file: str
    """PEM private key of ``cert_file`` (unencrypted)."""
    ca_file: str | None = None
    """PEM CA certificates client certificates are verified against; required unless client_auth is none."""
    client_auth: Literal["none", "requested", "required"] = "none"
    """Kafka's ``ssl.client.auth``."""
    principal_mapping_rules: str = "DEFAULT"
    """Kafka's ``ssl.principal.mapping.rules``, applied to the client certificate's RFC 2253 subject."""

    _files = field_validator("cert_file", "key_file", "ca_file")(_existing_file)

    @field_validator("principal_mapping_rules")
    @classmethod
    def _rules(cls, v: str) -> str:
        PrincipalMapper(v)  # MappingRuleError is a ValueError: reported under this field
        return v

    @model_validator(mode="after")
    def _ca(self) -> Self:
        if self.client_auth != "none" and self.ca_file is None:
            raise ValueError(f"client_auth {self.client_auth} needs ca_file to verify client certificates")
        return self


class UpstreamConfig(_Strict):
    bootstrap_servers: list[str] = Field(min_length=1)
    """The cluster's listener the proxy connects to (PLAINTEXT or SASL_PLAINTEXT; SSL or SASL_SSL with tls)."""
    connect_timeout_ms: int = Field(default=10_000, gt=0)
    tls: UpstreamTlsConfig | None = None

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [s.strip() for s in v.split(",") if s.strip()]
        return v

    @field_validator("bootstrap_servers")
    @classmethod
    def _check(cls, v: list[str]) -> list[str]:
        for item in v:
            _parse_host_port(item)
        return v

    def addresses(self) -> list[tuple[str, int]]:
        return [_parse_host_port(s) for s in self.bootstrap_servers]


class ListenConfig(_Strict):
    host: str = "127.0.0.1"
    """Interface the listeners bind to."""
    advertised_host: str | None = None
    """Host written into rewritten broker addresses; defaults to ``host`` (or 127.0.0.1 for 0.0.0.0)."""
    bootstrap_port: int = Field(default=19092, ge=0, lt=65536)
    """Port clients bootstrap from; 0 picks a free one (tests)."""
    broker_ports: tuple[int, int] | Literal["ephemeral"] = (19093, 19192)
    """Range of ports, one per broker: broker N gets first + N when that fits, else the first free one."""
    tls: ListenTlsConfig | None = None

    @field_validator("broker_ports", mode="before")
    @classmethod
    def _range(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "ephemeral":
            first, sep, last = v.partition("-")
            if not sep:
                raise ValueError("broker_ports must be 'FIRST-LAST' or 'ephemeral'")
            v = (first, last)
        return v

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.broker_ports != "ephemeral":
            first, last = self.broker_ports
            if not 0 < first <= last < 65536:
                raise ValueError(f"broker_ports {first}-{last} is not a range within 1-65535")
            if first <= self.bootstrap_port <= last:
                raise ValueError(f"bootstrap_port {self.bootstrap_port} lies inside broker_ports")
        return self

    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host


def _entity_name(value: str | None) -> EntityName:
    if value is None:
        return None
    return DEFAULT if value == "<default>" else value


class QuotaEntry(_Strict):
    """One quota entity as an operator writes it: ``{entity: {user: alice}, quotas: {producer_byte_rate: 1e6}}``.

    Entity names are spelled as ``kafka-configs`` prints them: a name, or ``<default>`` for the default entity.
    """

    entity: dict[Literal["user", "client-id"], str]
    quotas: dict[str, float] = Field(min_length=1)

    def quota_entity(self) -> QuotaEntity:
        return QuotaEntity(_entity_name(self.entity.get("user")), _entity_name(self.entity.get("client-id")))

    @model_validator(mode="after")
    def _check(self) -> Self:
        try:
            entity = self.quota_entity()
        except QuotaEntityError as exc:
            raise ValueError(f"entity {self.entity}: {exc}") from None
        for key, value in self.quotas.items():
            try:
                validate_quota(entity, key, value)
            except QuotaValueError as exc:
                raise ValueError(str(exc)) from None
        return self


class FairShareWeight(_Strict):
    """One tenant's weight in the fair division: ``{user: ANONYMOUS, client-id: batch, weight: 0.5}``. The tenant
    is named as ``fair_share.tenant`` keys them: ``user`` and ``client-id`` (``user_client``: both, an
    unauthenticated client's user is ``ANONYMOUS``), ``user`` alone, or ``address``."""

    user: str | None = None
    client_id: str | None = Field(default=None, alias="client-id")
    address: str | None = None
    weight: float = Field(gt=0, le=1000)
    """How many equal tenants' shares this one gets (1 by default for every tenant not listed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True)


class FairShareConfig(_Strict):
    """Capacity-aware fair share (docs/fair-share.md): with no quota anywhere, a broker whose answers slow down is
    shared max-min among the tenants on it, so one tenant's flood cannot take the others' latency. A tenant below
    its share is never delayed; a lone tenant, or tenants that all use about the same, are never limited."""

    enabled: bool = True
    """False turns it off (reloadable: every held request goes at once)."""
    enforce: bool = True
    """False is shadow mode for fair share alone: limits and shares are computed, counted and logged, nobody is
    held (``quotas.enforce: false`` makes it shadow too)."""
    target_delay_ms: float = Field(default=1.0, gt=0, le=60_000)
    """The queueing delay (a request's service time over its class's baseline) a limited broker is held at; half
    the baseline when that is larger. Lower protects latency-sensitive tenants more and lets floods less through."""
    min_work_rate: int = Field(default=1024 * 1024, gt=0)
    """Bytes of work per second a limited broker always admits, whatever the delay (its floor)."""
    burst_seconds: float = Field(default=0.1, gt=0, le=60)
    """A held tenant's bucket, in seconds of its share: the largest burst it is let through at once."""
    slow_start: bool = True
    """A tenant surging beside another on an open broker is paced from its first large request at 2 MiB/s, doubled
    each tick the delay stays low, before any round trip has shown the broker saturating. False lets a surge in
    unpaced until the delay shows (a flood's first second: tens of MiB)."""
    tenant: Literal["user_client", "user", "address"] = "user_client"
    """What one tenant is: ``user_client``, the quota entity (user and client id, as Kafka's quotas key them);
    ``user``, the principal alone (an authenticated tenant cannot multiply its share by inventing client ids);
    ``address``, the client's IP address."""
    weights: list[FairShareWeight] = []

    @model_validator(mode="after")
    def _weights_name_tenants(self) -> Self:
        for i, w in enumerate(self.weights):
            named = {k for k in ("user", "client_id", "address") if getattr(w, k) is not None}
            allowed = {"user_client": {"user", "client_id"}, "user": {"user"}, "address": {"address"}}[self.tenant]
            if not named or named - allowed:
                raise ValueError(
                    f"weights[{i}] names {sorted(named) or 'no tenant'}; with tenant: {self.tenant} a weight names "
                    + " and/or ".join(sorted(allowed))
                )
        return self

    def weight_keys(self) -> dict[str, float]:
        """Tenant key (``proxy.rules.fair_seat.tenant_key``) -> weight."""
        out = {}
        for w in self.weights:
            if self.tenant == "address":
                key = w.address or ""
            elif self.tenant == "user":
                key = w.user or ""
            else:
                key = f"{w.user or ''}\x1f{w.client_id or ''}"
            out[key] = w.weight
        return out


class ApiCost(_Strict):
    """One API's row of the request-cost table: the broker thread time a request of it costs."""

    base_ms: float = Field(ge=0, le=1000)
    """Per request, in milliseconds of a broker thread."""
    request_ms_per_kib: float = Field(default=0.0, ge=0, le=1000)
    """Per KiB of the request."""
    response_ms_per_kib: float = Field(default=0.0, ge=0, le=1000)
    """Per KiB of the response (charged at the connection's next request of that API)."""
    alone_base_ms: float | None = Field(default=None, ge=0, le=1000)
    """Per request sent alone (nothing else of its connection awaiting an answer: a consumer's Fetch, a
    request/response loop), in place of :attr:`base_ms`; unset: :attr:`base_ms` either way. The brokers charge a
    request sent alone about twice one of a pipelining client (``quotas.kinds.RequestCosts.alone``)."""

    def row(self) -> tuple[float, float, float]:
        return (self.base_ms, self.request_ms_per_kib, self.response_ms_per_kib)


class RequestCostsConfig(_Strict):
    """What each request costs the brokers' threads, for ``request_percentage`` (KIP-124): the cluster's own figures,
    as ``kafka-throttle-proxy calibrate`` prints them (docs/quotas.md, "The cluster's own costs"). APIs it does not
    name keep the built-in row, times :attr:`other_apis_scale`. Reloadable: connections charge by the new figures
    from their next request."""

    source: str = Field(default="configured", max_length=200)
    """Where the figures come from (when, against which cluster): ``check-config`` prints it."""
    apis: dict[str, ApiCost] = {}
    """API name as Kafka spells it (``Produce``, ``Fetch``, ``ListOffsets``, ``Metadata``, ...) -> its row."""
    other_apis_scale: float = Field(default=1.0, gt=0, le=1000)
    """The built-in rows of the APIs :attr:`apis` does not name, times this (the calibration's median ratio of
    measured to built-in: a cluster whose brokers charge half charges half for the APIs it did not probe too)."""
    produce_replicated_ms: float | None = Field(default=None, ge=0, le=1000)
    """Added to a Produce whose acks wait for the followers (acks=-1); unset: the built-in figure, scaled."""
    fetch_head_ms_per_kib: float | None = Field(default=None, ge=0, le=1000)
    """Fetch's steep first KiB of response; unset: the built-in figure, scaled."""

    @field_validator("apis")
    @classmethod
    def _known_apis(cls, apis: dict[str, ApiCost]) -> dict[str, ApiCost]:
        known = api_keys_by_name()
        for name in apis:
            if name not in known:
                raise ValueError(f"{name!r} is not an API name (one of {', '.join(sorted(known))})")
        return apis

    def costs(self) -> RequestCosts:
        known = api_keys_by_name()
        return BUILTIN_COSTS.scaled(
            self.other_apis_scale,
            {known[name]: cost.row() for name, cost in self.apis.items()},
            self.produce_replicated_ms,
            self.fetch_head_ms_per_kib,
            self.source,
            {known[name]: cost.alone_base_ms for name, cost in self.apis.items() if cost.alone_base_ms is not None},
        )


def api_keys_by_name() -> dict[str, int]:
    """Kafka's API names (``Produce``, ``ListOffsets``) -> key: what ``quotas.request_costs.apis`` is keyed by."""
    return {api_name(key): key for key in sorted(set(API_NAMES) | set(REQUESTS))}


class QuotaConfig(_Strict):
    """How quotas are enforced, and the quotas the operator writes in this file."""

    fair_share: FairShareConfig = FairShareConfig()
    request_costs: RequestCostsConfig | None = None
    """The cluster's own request costs for ``request_percentage``; unset: the built-in table (``check-config`` says
    which is in force)."""

    enforce: bool = True
    """False is shadow mode: every decision is made, logged and counted, nothing is throttled or rejected."""
    enforcement: Literal["kafka", "smooth"] = "smooth"
    """``kafka``: Kafka's own semantics, byte for byte: windowed rates (a tenant may take about quota × window at
    once, then waits most of a window), the request forwarded and the connection muted afterwards. ``smooth``:
    byte rates and the request quota are paced by a token bucket holding ``smooth_burst_seconds`` of quota; a
    Produce that would overdraw it waits, unread and with nothing behind it read, until it is affordable (then
    goes through with no throttle left to serve), and a Fetch asks the broker for at most what the bucket holds.
    The same long-run rate, without the bursts and the long silences (docs/quotas.md, Enforcement modes)."""
    smooth_burst_seconds: float = Field(default=0.1, gt=0, le=60)
    """With ``enforcement: smooth``: the bucket's size, in seconds of quota (the largest burst a tenant gets)."""
    scope: Literal["broker", "cluster", "fleet"] = "broker"
    """``broker``: one bucket per entity per broker, as Kafka enforces (a quota set for Kafka means the same
    here). ``cluster``: one bucket per entity across every broker its connections reach. ``fleet``: as
    ``cluster``, summed over every proxy of the fleet (``fleet.name``), synchronised through a topic."""
    window_num: int = Field(default=11, ge=2)
    window_size_seconds: float = Field(default=1.0, gt=0)
    controller_window_num: int = Field(default=11, ge=1)
    controller_window_size_seconds: float = Field(default=1.0, gt=0)
    producer_id_window_num: int = Field(default=11, ge=2)
    producer_id_window_size_seconds: float = Field(default=3600.0, gt=0)
    producer_id_cleanup_interval_ms: int = Field(default=10, gt=0)
    producer_id_hold_max_ms: int = Field(default=20_000, ge=0)
    """Longest a user over producer_ids_rate has new Produce/InitProducerId requests held, on any connection."""
    charge_validate_only: bool = False
    """KIP-599 makes validate-only requests free; KRaft brokers charge them. Free by default, as the KIP says."""
    admins: list[str] = []
    """Principals allowed to AlterClientQuotas through the proxy (others get CLUSTER_AUTHORIZATION_FAILED)."""
    describers: list[str] | None = None
    """Principals allowed to DescribeClientQuotas through the proxy (Kafka asks DESCRIBE_CONFIGS on the cluster);
    unset means the admins. Others get CLUSTER_AUTHORIZATION_FAILED and no entries."""
    state_file: str | None = None
    """Where quotas altered through AlterClientQuotas are kept, so they survive a restart."""
    import_interval_seconds: float | None = Field(default=None, gt=0)
    """When set, the cluster's own client quotas are read (DescribeClientQuotas) this often and enforced."""
    max_tracked_buckets: int = Field(default=20_000, gt=0)
    """Quota buckets (rate trackers) kept at most; past it the least recently used tenth is dropped and starts
    afresh if it returns. Bounds the memory clients can make the proxy spend by choosing new client ids."""
    entity_idle_seconds: float = Field(default=3600.0, gt=0)
    """Per-entity rate state (and its metrics) is dropped after this long without traffic, as Kafka does."""
    entities: list[QuotaEntry] = []

    @model_validator(mode="after")
    def _unique(self) -> Self:
        seen: set[QuotaEntity] = set()
        for i, entry in enumerate(self.entities):
            entity = entry.quota_entity()
            if entity in seen:
                raise ValueError(f"entities[{i}]: {entity} is listed twice")
            seen.add(entity)
        return self


class MetricsConfig(_Strict):
    port: int | None = Field(default=None, ge=0, lt=65536)
    """Prometheus endpoint port; unset = no endpoint, 0 = a free port (logged)."""
    host: str = "127.0.0.1"
    max_entity_series: int = Field(default=500, gt=0)
    """Per quota key, the buckets named in quota metrics (throttled first, then the busiest); the rest are
    folded into user/client_id ``__other__``, so a scrape stays small whatever client ids clients choose."""


class DecisionLogConfig(_Strict):
    """Where every quota decision is written for offline analysis (spark_analysis); off unless ``directory`` or
    ``topic`` is set."""

    directory: str | None = None
    format: Literal["parquet", "jsonl"] = "parquet"
    max_queue: int = Field(default=100_000, gt=0)
    """Events waiting for the writer; beyond this they are dropped and counted, never waited for."""
    rotate_seconds: float = Field(default=60.0, gt=0)
    rotate_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    summary_seconds: float = Field(default=10.0, gt=0)
    """How often each connection's traffic that met no quota decision is summarised in one event."""
    instance: str | None = None
    """This proxy's name in the log (default: the fleet member id, else host name and process id)."""
    topic: str | None = None
    """Also (or, without ``directory``, only) write the events to this Kafka topic, one JSON object per record
    keyed by the member: one place for a fleet's logs (``python -m spark_analysis kafka://HOST:PORT/TOPIC``)."""
    bootstrap_servers: list[str] | None = None
    """Where ``topic`` lives; unset = upstream.bootstrap_servers."""
    client: dict[str, str | int | bool] = {}
    """Extra kafka-python producer settings for ``topic`` (security_protocol, sasl_mechanism, ...)."""


MIN_FLEET_SECRET_BYTES = 16
"""128 bits: shorter secrets could be guessed offline from one record and its MAC."""


class FleetConfig(_Strict):
    """Proxies that enforce quotas together (quota scope ``fleet``): each publishes its usage deltas to a topic
    on the cluster it fronts and folds in everyone else's."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,100}$")
    """The fleet: members with the same name share usage (topic ``__ktp_fleet_<name>``). Unset = no fleet."""
    member: str | None = Field(default=None, max_length=200)
    """This member's id in reports and logs; unset = host-pid."""
    sync_interval_ms: int = Field(default=250, ge=20, le=10_000)
    """How often usage is published; the enforcement error grows with it (docs/fleet.md, the enforcement error)."""
    bootstrap_servers: list[str] | None = None
    """Where the fleet topic lives; unset = upstream.bootstrap_servers (the cluster the proxy fronts)."""
    client: dict[str, str | int | bool] = {}
    """Extra settings for the fleet's Kafka client (aiokafka's names: security_protocol, sasl_mechanism,
    sasl_plain_username, sasl_plain_password, ...), for a cluster that needs credentials."""
    secret_file: str | None = None
    """A file holding the fleet's shared secret (at least 16 bytes; surrounding whitespace is ignored). Every
    record a member writes to the fleet's topics carries an HMAC-SHA256 under it, and a member takes in only
    records whose MAC checks out: anyone else who can write the topics (a client reaching the cluster some other
    way) cannot change a quota or forge usage. Required with ``quotas.scope: fleet`` (this or ``secret_env``)."""
    secret_env: str | None = None
    """Or the name of an environment variable holding the secret (never the secret itself)."""
    _secret: bytes | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_secret(self) -> Self:
        if self.secret_file is not None and self.secret_env is not None:
            raise ValueError("fleet: give the secret in secret_file or secret_env, not both")
        raw: bytes | None = None
        if self.secret_file is not None:
            try:
                raw = Path(self.secret_file).read_bytes()
            except OSError as exc:
                raise ValueError(f"fleet.secret_file {self.secret_file}: cannot read it ({exc.strerror})") from None
            where = f"fleet.secret_file {self.secret_file}"
        elif self.secret_env is not None:
            value = os.environ.get(self.secret_env)
            if value is None:
                raise ValueError(f"fleet.secret_env: the environment variable {self.secret_env} is not set")
            raw = value.encode()
            where = f"fleet.secret_env {self.secret_env}"
        if raw is not None:
            raw = raw.strip()
            if len(raw) < MIN_FLEET_SECRET_BYTES:
                raise ValueError(f"{where}: the secret is {len(raw)} bytes, fewer than {MIN_FLEET_SECRET_BYTES}")
            self._secret = raw
        return self

    def secret(self) -> bytes | None:
        """The shared secret, read when the configuration was loaded (None when none is configured)."""
        return self._secret

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, v: list[str] | None) -> list[str] | None:
        for item in v or ():
            _parse_host_port(item)
        return v


class SaslConfig(_Strict):
    oauthbearer_principal_claim: str = Field(default="sub", min_length=1)
    """Must match the broker's ``sasl.oauthbearer.sub.claim.name``."""


class LimitsConfig(_Strict):
    """Kafka's connection limits (``SocketServer.ConnectionQuotas``, KIP-612), at the proxy; unset = unlimited,
    except by the file descriptors the proxy's open-file limit leaves (always counted, shared by shedding)."""

    max_connections: int | None = Field(default=None, gt=0)
    """Kafka's max.connections: client connections open at once, proxy-wide."""
    max_connections_per_ip: int | None = Field(default=None, gt=0)
    """Kafka's max.connections.per.ip."""
    max_connections_per_ip_overrides: dict[str, int] = {}
    """Kafka's max.connections.per.ip.overrides: ip -> limit (0 refuses that ip)."""
    max_connection_creation_rate: float | None = Field(default=None, gt=0)
    """Kafka's max.connection.creation.rate: new connections per second, proxy-wide."""
    ip_connection_creation_rate: dict[str, float] = {}
    """KIP-612's connection_creation_rate quota on entity type ips: ip (or ``<default>``) -> new connections per
    second; also set through AlterClientQuotas (kafka-configs.sh --entity-type ips)."""
    shed_when_full: bool = True
    """When a new connection does not fit (under max_connections, or the file descriptors the open-file limit
    leaves), close one of the address holding the most connections, if it holds at least two more than the
    newcomer's: one that never spoke (oldest first), else one idle for shed_idle_ms. So one address holding
    thousands of silent or idle connections cannot lock out the others. False: refuse the newcomer (Kafka's
    behaviour)."""
    shed_idle_ms: int = Field(default=30_000, gt=0)
    """A connection that has spoken may be shed (shed_when_full) once it has had nothing in flight and no traffic
    for this long; one that never spoke may be shed at any time (a Kafka client speaks first, at once)."""

    @field_validator("max_connections_per_ip_overrides")
    @classmethod
    def _non_negative(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [ip for ip, n in v.items() if n < 0]
        if bad:
            raise ValueError(f"a connection limit must be 0 or more, not {v[bad[0]]} for {bad[0]}")
        return v

    @field_validator("ip_connection_creation_rate")
    @classmethod
    def _positive_rates(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [ip for ip, r in v.items() if not r > 0]
        if bad:
            raise ValueError(f"connection_creation_rate must be greater than 0, not {v[bad[0]]} for {bad[0]}")
        for ip in v:
            if ip != "<default>":
                try:
                    ipaddress.ip_address(ip)
                except ValueError:
                    raise ValueError(f"{ip!r} is not an IP address (or <default>)") from None
        return v


class ProxyConfig(_Strict):
    upstream: UpstreamConfig
    listen: ListenConfig = ListenConfig()
    max_frame_bytes: int = Field(default=100 * 1024 * 1024, gt=0)
    """Largest request or response frame accepted, like the broker's socket.request.max.bytes."""
    queued_max_request_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """Kafka's queued.max.request.bytes (KIP-72): request bytes of large frames held in memory at once, proxy-wide;
    when spent, clients with a large frame to send are not read until earlier ones have been forwarded."""
    request_pool_min_bytes: int = Field(default=1024 * 1024, gt=0)
    """Frames up to this size never wait for queued_max_request_bytes (a normal client's requests are never
    queued behind a hostile client's huge ones); larger ones reserve their whole size before their body is read."""
    request_read_timeout_ms: int = Field(default=60_000, gt=0)
    """A request frame that does not arrive whole within this time (counted while the proxy reads the client)
    closes its connection: slow-dribbling clients cannot hold memory or connections indefinitely."""
    connections_max_idle_ms: int = Field(default=600_000, gt=0)
    """Kafka's connections.max.idle.ms: a client connection with no traffic and nothing in flight this long is
    closed."""
    upstream_timeout_margin_ms: int = Field(default=30_000, gt=0)
    """A broker that has not answered a request within the wait the request itself asked for (Fetch max wait,
    Produce timeout, JoinGroup rebalance timeout, ...) plus this margin is taken as hung: the client connection
    and its broker connection are closed with one log line, so the client reconnects."""
    shutdown_grace_ms: int = Field(default=10_000, ge=0)
    """On SIGTERM, how long in-flight requests get to finish before connections are closed."""
    shutdown_unready_ms: int = Field(default=0, ge=0, le=300_000)
    """On SIGTERM, how long the proxy answers ``/readyz`` with 503 while still serving, before it stops taking
    connections and drains: the time a load balancer or Kubernetes needs to stop sending it new clients (a few
    seconds there; 0 where nothing probes it)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    quotas: QuotaConfig = QuotaConfig()
    metrics: MetricsConfig = MetricsConfig()
    decision_log: DecisionLogConfig = DecisionLogConfig()
    sasl: SaslConfig = SaslConfig()
    limits: LimitsConfig = LimitsConfig()
    fleet: FleetConfig = FleetConfig()
    workers: int = Field(default=1, ge=1, le=64)
    """Proxy processes on this host sharing every listener port (SO_REUSEPORT), each accepting its share of new
    connections: one process is one core. Needs fixed ports (a client told broker 2 is at port P must find it at
    P whichever process answers). Each process enforces quotas on the connections it holds (docs/fleet.md)."""

    @model_validator(mode="after")
    def _fleet_named(self) -> Self:
        if self.quotas.scope == "fleet" and not self.fleet.name:
            raise ValueError("quotas.scope fleet needs fleet.name (the members that share usage)")
        if self.quotas.scope == "fleet" and self.fleet.secret() is None:
            raise ValueError(
                "quotas.scope fleet needs fleet.secret_file or fleet.secret_env: the members "
                "authenticate each other's records with it (docs/fleet.md)"
            )
        return self

    @model_validator(mode="after")
    def _fixed_ports_for_workers(self) -> Self:
        if self.workers > 1:
            if self.listen.bootstrap_port == 0:
                raise ValueError(
                    f"workers: {self.workers} needs a fixed listen.bootstrap_port, not 0 (every "
                    "process listens on the same port)"
                )
            if self.listen.broker_ports == "ephemeral":
                raise ValueError(
                    f"workers: {self.workers} needs a listen.broker_ports range, not ephemeral (a "
                    "broker's port must be the same in every process)"
                )
            if self.metrics.port == 0:
                raise ValueError(
                    f"workers: {self.workers} needs a fixed metrics.port, not 0 (worker i serves "
                    "its metrics on metrics.port + i)"
                )
            if self.quotas.admins and not self.quotas.state_file:
                raise ValueError(
                    f"workers: {self.workers} with quotas.admins needs quotas.state_file (a quota "
                    "altered through one worker reaches the others through it)"
                )
        return self
