"""The proxy's configuration, validated with pydantic so a bad field is refused by name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class UpstreamConfig(_Strict):
    bootstrap_servers: list[str] = Field(min_length=1)
    """The cluster's listener the proxy connects to (PLAINTEXT or SASL_PLAINTEXT)."""
    connect_timeout_ms: int = Field(default=10_000, gt=0)

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split(cls, v):
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

    @field_validator("broker_ports", mode="before")
    @classmethod
    def _range(cls, v):
        if isinstance(v, str) and v != "ephemeral":
            first, sep, last = v.partition("-")
            if not sep:
                raise ValueError("broker_ports must be 'FIRST-LAST' or 'ephemeral'")
            v = (first, last)
        return v

    @model_validator(mode="after")
    def _check(self):
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


class ProxyConfig(_Strict):
    upstream: UpstreamConfig
    listen: ListenConfig = ListenConfig()
    max_frame_bytes: int = Field(default=100 * 1024 * 1024, gt=0)
    """Largest request or response frame accepted, like the broker's socket.request.max.bytes."""
    shutdown_grace_ms: int = Field(default=10_000, ge=0)
    """On SIGTERM, how long in-flight requests get to finish before connections are closed."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
