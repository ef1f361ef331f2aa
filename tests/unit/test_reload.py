"""A reload puts every reloadable setting in force at once, and keeps every restart-only one as it runs.

One test per reloadable setting: the proxy is built on a base configuration, reloaded with that one setting
changed, and the live object that setting drives (the policy, the quota manager, the connection limits, the
root logger) is asked, not the configuration. One test per restart-only setting: the reload names it in one
warning line, and the configuration in force (and what it drives) keeps the running value. The tests that
need the cluster (the decision log's topic, scope ``fleet``) are in tests/integration/test_reload.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from config.load import ConfigError
from config.model import ProxyConfig
from config.reload import RELOADABLE, RESTART_ONLY, is_reloadable, plan_reload, with_setting
from config.reload import setting as get_setting
from proxy.rules.fair_seat import FairSeat
from proxy.server import Proxy

SECRET = "s" * 32
BASE: dict[str, Any] = {
    "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
    "quotas": {"enforcement": "smooth"},  # so smooth_burst_seconds is live, and "enforcement" can turn it off
}


def _config(**settings: Any) -> ProxyConfig:
    doc: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for dotted, value in settings.items():
        node = doc
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return ProxyConfig.model_validate(doc)


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every setting's dotted name; an optional section (``upstream.tls``) and a list of entries
    (``quotas.entities``) are one setting each: they are reloaded, or not, whole."""
    out = []
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out += _leaves(sub, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


# setting -> (new value, what the live proxy says, what it must say then)
Probe = Callable[[Proxy], Any]
RELOADS: dict[str, tuple[Any, Probe, Any]] = {
    "shutdown_grace_ms": (1234, lambda p: p.config.shutdown_grace_ms, 1234),  # what shutdown() waits
    "shutdown_unready_ms": (500, lambda p: p.config.shutdown_unready_ms, 500),  # likewise
    "log_level": ("DEBUG", lambda p: logging.getLogger().level, logging.DEBUG),
    "metrics.max_entity_series": (7, lambda p: p.policy.config.metrics.max_entity_series, 7),
    "limits.max_connections": (5, lambda p: p.connection_quotas.max_connections, 5),
    "limits.max_connections_per_ip": (3, lambda p: p.connection_quotas.max_per_ip, 3),
    "limits.max_connections_per_ip_overrides": (
        {"10.0.0.1": 2},
        lambda p: p.connection_quotas.per_ip_overrides,
        {"10.0.0.1": 2},
    ),
    "limits.max_connection_creation_rate": (10.0, lambda p: p.connection_quotas.max_creation_rate, 10.0),
    "limits.ip_connection_creation_rate": ({"10.0.0.1": 1.5}, lambda p: p.connection_quotas.ip_rate("10.0.0.1"), 1.5),
    "limits.shed_when_full": (False, lambda p: p.connection_quotas.shed, False),
    "limits.shed_idle_ms": (1000, lambda p: _idle_after(p, 2.0), True),  # a connection quiet for 2 s may be shed
    "quotas.enforce": (False, lambda p: p.policy.enforce, False),
    "quotas.enforcement": ("kafka", lambda p: p.policy.quotas.pace_s, None),
    "quotas.smooth_burst_seconds": (0.5, lambda p: p.policy.quotas.pace_s, 0.5),
    "quotas.scope": ("cluster", lambda p: p.policy.cluster_scope, True),
    "quotas.window_num": (5, lambda p: p.policy.quotas.windows.rate.samples, 5),
    "quotas.window_size_seconds": (2.0, lambda p: p.policy.quotas.windows.rate.size_ms, 2000),
    "quotas.controller_window_num": (4, lambda p: p.policy.quotas.windows.controller.samples, 4),
    "quotas.controller_window_size_seconds": (3.0, lambda p: p.policy.quotas.windows.controller.size_ms, 3000),
    "quotas.producer_id_window_num": (5, lambda p: p.policy.producer_ids.config.window_num, 5),
    "quotas.producer_id_window_size_seconds": (60.0, lambda p: p.policy.producer_ids.config.window_size_s, 60),
    "quotas.producer_id_cleanup_interval_ms": (50, lambda p: p.policy.producer_ids.config.cleanup_interval_ms, 50),
    "quotas.producer_id_hold_max_ms": (500, lambda p: p.policy.pid_hold_max_ms, 500),
    "quotas.charge_validate_only": (True, lambda p: p.policy.charge_validate_only, True),
    "quotas.admins": (["alice"], lambda p: p.policy.admins, {"alice"}),
    "quotas.describers": (["bob"], lambda p: p.policy.describers, {"bob"}),
    "quotas.max_tracked_buckets": (100, lambda p: p.policy.quotas.max_trackers, 100),
    "quotas.entity_idle_seconds": (60.0, lambda p: p.policy.quotas.idle_ms, 60_000),
    "quotas.entities": (
        [{"entity": {"client-id": "tenant"}, "quotas": {"producer_byte_rate": 1024}}],
        lambda p: {str(e): q for e, q in p.policy.store.entities().items()},
        {"<client-id 'tenant'>": {"producer_byte_rate": 1024}},
    ),
    # Fair share: each setting read where the loop or the seat reads it.
    "quotas.fair_share.enabled": (False, lambda p: p.policy.fair is None, True),
    "quotas.fair_share.enforce": (False, lambda p: p.policy.fair_enforce, False),
    "quotas.fair_share.target_delay_ms": (5.0, lambda p: _fair(p).state.settings.target_delay_ms, 5.0),
    "quotas.fair_share.min_work_rate": (4096, lambda p: _fair(p).state.settings.min_limit, 4096.0),
    "quotas.fair_share.burst_seconds": (0.5, lambda p: _fair(p).state.settings.burst_seconds, 0.5),
    "quotas.fair_share.tenant": ("user", lambda p: _fair(p).kind, "user"),
    "quotas.fair_share.slow_start": (False, lambda p: _fair(p).state.settings.slow_start, False),
    "quotas.fair_share.weights": (
        [{"client-id": "batch", "weight": 0.5}],
        lambda p: _fair(p).state.weights,
        {"\x1fbatch": 0.5},
    ),
    "quotas.request_costs": (
        {"source": "lab", "apis": {"Produce": {"base_ms": 0.5}}},
        lambda p: (p.policy.costs.source, p.policy.costs.thread_ms(0, 0, 0)),
        ("lab", 0.5),
    ),
}


def _fair(proxy: Proxy) -> FairSeat:
    assert proxy.policy.fair is not None
    return proxy.policy.fair


def _idle_after(proxy: Proxy, quiet_s: float) -> bool:
    """Whether the limits would shed a connection that spoke and then stayed quiet ``quiet_s``."""

    class _Transport:
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return ("127.0.0.1", 50000) if name == "peername" else default

        def close(self) -> None: ...

        def abort(self) -> None: ...

        def is_closing(self) -> bool:
            return False

        def pause_reading(self) -> None: ...

        def resume_reading(self) -> None: ...

    async def ask() -> bool:
        client = proxy._accept(None)
        client.connection_made(_Transport())  # type: ignore[arg-type]
        (conn,) = proxy.connections
        now_ms = round((conn.last_active + quiet_s) * 1000)
        idle = proxy.connection_quotas.is_idle(conn, now_ms)
        conn.abort()
        return idle

    return asyncio.run(ask())


@pytest.fixture(autouse=True)
def _root_level():
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


def test_every_setting_is_either_reloadable_or_restart_only():
    restart = [s for s in _leaves(ProxyConfig) if any(s == p or s.startswith(p + ".") for p in RESTART_ONLY)]
    reload = [s for s in _leaves(ProxyConfig) if is_reloadable(s)]
    assert not set(restart) & set(reload), "a setting named both reloadable and restart-only"
    assert sorted(restart + reload) == sorted(_leaves(ProxyConfig)), "a setting named neither"
    for dotted in RESTART_ONLY + RELOADABLE:  # no stale names in the tables
        get_setting(_config(), dotted)


def test_every_reloadable_setting_has_a_probe():
    reloadable = {s for s in _leaves(ProxyConfig) if is_reloadable(s)}
    assert reloadable == set(RELOADS)


@pytest.mark.parametrize("setting", sorted(RELOADS))
def test_a_reloadable_setting_takes_effect_at_once(setting, caplog):
    value, probe, expected = RELOADS[setting]
    proxy = Proxy(_config())
    before = probe(proxy)
    assert before != expected, f"{setting}: the base configuration already has what the test sets"
    with caplog.at_level("WARNING", logger="proxy.server"):
        proxy.reload(_config(**{setting: value}))
    assert probe(proxy) == expected
    assert not [r for r in caplog.records if "restart" in r.getMessage()]


# restart-only setting -> a different value (set without validation: only the kept running value is validated)
RESTARTS: dict[str, Any] = {
    "upstream": {"bootstrap_servers": ["127.0.0.1:10"]},
    "listen": {"host": "0.0.0.0"},
    "max_frame_bytes": 1 << 20,
    "queued_max_request_bytes": 1 << 24,
    "request_pool_min_bytes": 1 << 16,
    "request_read_timeout_ms": 1000,
    "connections_max_idle_ms": 1000,
    "upstream_timeout_margin_ms": 1000,
    "workers": 2,
    "sasl": {"oauthbearer_principal_claim": "email"},
    "metrics.port": 9999,
    "metrics.host": "0.0.0.0",
    "decision_log": {"topic": "new-decisions"},
    "fleet": {"name": "another", "secret_env": "KTP_RELOAD_TEST_SECRET"},
    "quotas.state_file": "/tmp/elsewhere.json",
    "quotas.import_interval_seconds": 5.0,
}


def test_every_restart_only_setting_has_a_case():
    assert set(RESTARTS) == set(RESTART_ONLY)


@pytest.mark.parametrize("setting", sorted(RESTARTS))
def test_a_restart_only_setting_keeps_its_running_value_with_one_warning(setting, caplog, monkeypatch):
    monkeypatch.setenv("KTP_RELOAD_TEST_SECRET", SECRET)
    running = _config()
    value = RESTARTS[setting]
    if isinstance(value, dict):  # a section: its running fields, these changed
        value = get_setting(running, setting).model_copy(update=value) if get_setting(running, setting) else value
    new = with_setting(_config(**{"quotas.enforce": False}), setting, value)
    proxy = Proxy(running)
    with caplog.at_level("WARNING", logger="proxy.server"):
        proxy.reload(new)
    lines = [r.getMessage() for r in caplog.records if "takes effect only after a restart" in r.getMessage()]
    assert lines == [f"config reload: {setting} changed; it takes effect only after a restart"]
    assert get_setting(proxy.config, setting) == get_setting(running, setting)
    assert get_setting(proxy.policy.config, setting) == get_setting(running, setting)
    assert proxy.policy.enforce is False  # the reloadable change beside it did take effect


def test_the_decision_logs_topic_stays_protected_across_a_reload_that_changes_it():
    proxy = Proxy(_config(**{"decision_log.topic": "t1"}))
    guard = proxy.policy.guard
    assert guard is not None and guard.protects("t1")
    proxy.reload(_config(**{"decision_log.topic": "t2"}))
    assert proxy.policy.guard is guard and guard.protects("t1") and not guard.protects("t2")


def test_scope_reloads_between_broker_and_cluster_but_not_into_or_out_of_fleet(caplog, monkeypatch):
    monkeypatch.setenv("KTP_RELOAD_TEST_SECRET", SECRET)
    fleet = {"fleet.name": "f", "fleet.secret_env": "KTP_RELOAD_TEST_SECRET"}
    proxy = Proxy(_config(**fleet))
    with caplog.at_level("WARNING", logger="proxy.server"):
        proxy.reload(_config(**fleet, **{"quotas.scope": "fleet"}))
    assert [r.getMessage() for r in caplog.records if "restart" in r.getMessage()] == [
        "config reload: quotas.scope (broker → fleet) changed; it takes effect only after a restart"
    ]
    assert proxy.config.quotas.scope == "broker" and proxy.policy.quotas.ledger is None
    assert not proxy.policy.cluster_scope

    caplog.clear()
    member = Proxy(_config(**fleet, **{"quotas.scope": "fleet"}))
    ledger = member.policy.quotas.ledger
    assert ledger is not None
    with caplog.at_level("WARNING", logger="proxy.server"):
        member.reload(_config(**fleet, **{"quotas.scope": "cluster"}))
    (line,) = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    assert "quotas.scope (fleet → cluster)" in line
    assert member.config.quotas.scope == "fleet" and member.policy.quotas.ledger is ledger


def test_a_reload_whose_settings_do_not_fit_the_kept_ones_is_refused_whole(monkeypatch):
    # workers > 1 with admins needs a state file; the new file brings both, but the workers count is kept at 2
    # while the state file (restart-only too) stays unset: the admins cannot be put in force without it.
    running = _config(**{"workers": 2, "listen.bootstrap_port": 19092, "listen.broker_ports": [19093, 19100]})
    new = _config(
        **{
            "workers": 2,
            "listen.bootstrap_port": 19092,
            "listen.broker_ports": [19093, 19100],
            "quotas.admins": ["alice"],
            "quotas.state_file": "/tmp/state.json",
        }
    )
    with pytest.raises(ConfigError, match=r"needs quotas\.state_file"):
        plan_reload(running, new)
    proxy = Proxy(running)
    with pytest.raises(ConfigError):
        proxy.reload(new)
    assert proxy.policy.admins == frozenset()


def test_fair_share_turned_off_then_on_again_counts_a_live_connection_on_the_new_broker_loop(caplog):
    """A connection bound to a broker's loop before fair share was turned off must, once it is on again, be counted
    on the new loop (ticked, divided, in the metrics), not on the old one nobody ticks any more: held by the old
    loop's last limit for ever, and invisible in ``ktp_fair_share_*`` (found by the fair-share demo)."""
    from types import SimpleNamespace

    from protocol.apis import Api
    from protocol.headers import RequestHeader
    from protocol.request import Request
    from proxy.rules.decisions import ConnState

    conn = SimpleNamespace(label="broker 1", peer="127.0.0.1", upstream_addr=("127.0.0.1", 9))
    st = ConnState(SimpleNamespace(principal="ANONYMOUS"))
    header = RequestHeader(Api.PRODUCE, 9, 1, "flooder", 0)
    proxy = Proxy(_config())
    t, _ = _fair(proxy).request(conn, st, Request(header, b"\0" * 1024, True), 0)  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="proxy.server"):
        proxy.reload(_config(**{"quotas.fair_share.enabled": False}))
        proxy.reload(_config(**{"quotas.fair_share.enabled": True}))
    seat = _fair(proxy)
    t2, _ = seat.request(conn, st, Request(header, b"\0" * 1024, True), 200)  # type: ignore[arg-type]
    assert t2 is not t and t2.broker is seat.state.brokers["broker 1"]
    assert [b[0] for b in seat.snapshot(10)[0]] == ["broker 1"]  # what the metrics show
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fair share turned")]
    assert [m.split(" (")[0] for m in said] == ["fair share turned off", "fair share turned on"]


def test_fair_share_in_shadow_mode_lets_a_request_go_and_records_the_wait_it_would_have_had():
    """``quotas.fair_share.enforce: false``: a request over its tenant's share of a limited broker is not held; its
    decision carries the wait it would have had, recorded as shadow (the decision log's ``fair_share`` action)."""
    from types import SimpleNamespace

    from protocol.apis import Api
    from protocol.headers import RequestHeader
    from protocol.request import Request
    from proxy.rules.decisions import ConnState, Decision
    from proxy.rules.verdicts import Defer

    conn = SimpleNamespace(label="broker 1", peer="127.0.0.1", upstream_addr=("127.0.0.1", 9))
    header = RequestHeader(Api.PRODUCE, 9, 1, "flooder", 0)

    def gate(enforce: bool) -> object:
        proxy = Proxy(_config(**{"quotas.fair_share.enforce": enforce}))
        st = ConnState(SimpleNamespace(principal="ANONYMOUS"))
        t, _ = _fair(proxy).request(conn, st, Request(header, b"\0" * 64, True), 0)  # type: ignore[arg-type]
        assert t is not None
        t.broker.limit = 64 * 1024.0  # the broker limited, this tenant paced at 64 KiB/s
        t.pace(64 * 1024.0, 0.1, 0)
        request = Request(header, b"\0" * (256 * 1024), True)  # (a Produce's acks: 1, as read)
        return proxy.policy._gate(conn, request, 0.0, st)  # type: ignore[arg-type]

    assert isinstance(gate(True), Defer)  # enforced: it waits
    shadow = gate(False)
    assert isinstance(shadow, Decision) and shadow.fair_shadow
    assert 3_000 < shadow.fair_ms < 5_000  # ~(256 KiB - its burst) at 64 KiB/s
