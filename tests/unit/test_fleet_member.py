"""proxy.fleet_member.FleetSync's member id: the workers of one host are members of their own."""

from __future__ import annotations

import asyncio

import pytest

from config.model import ProxyConfig
from proxy.fleet_member import FleetSync
from quotas.entities import QuotaStore
from quotas.manager import QuotaManager


@pytest.mark.parametrize("worker, member", [(None, "me"), (0, "me-w0"), (3, "me-w3")])
def test_each_worker_of_a_host_is_a_member_of_its_own(monkeypatch, worker, member):
    monkeypatch.setenv("KTP_TEST_SECRET", "s" * 32)
    config = ProxyConfig.model_validate(
        {
            "upstream": {"bootstrap_servers": ["127.0.0.1:9"]},
            "fleet": {"name": "prod", "secret_env": "KTP_TEST_SECRET", "member": "me"},
            "quotas": {"scope": "fleet"},
        }
    )

    async def build() -> FleetSync:  # (it makes an asyncio queue: inside a loop)
        return FleetSync(config, QuotaManager(QuotaStore()), lambda: 0, worker=worker)

    assert asyncio.run(build()).member == member
