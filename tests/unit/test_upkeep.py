"""The proxy's once-a-second upkeep (timeouts, expiry, summaries) must outlive a failure in any of its parts:
if it stopped, no hung broker or idle connection would ever be closed again."""

from __future__ import annotations

import asyncio

from config.model import ProxyConfig
from proxy.server import Proxy


class _Conn:
    peer, label = "127.0.0.1:1", "broker 1"

    def __init__(self, fail: bool) -> None:
        self.fail, self.checks = fail, 0
        self.closed_with: str | None = None
        self.closed_kind = ""

    def check_timeouts(self, now: float) -> None:
        self.checks += 1
        if self.fail:
            raise RuntimeError("a bug in one connection")

    def close(self, reason: str = "", kind: str = "") -> None:
        self.closed_with = reason
        self.closed_kind = kind


def test_upkeep_survives_a_failing_part_and_a_failing_connection(caplog):
    async def main():
        proxy = Proxy(ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]}}))
        calls = {"n": 0}

        class FlakyPolicy:  # a wrapper, not a patched method: the policy may be compiled (mypyc), read-only
            def __init__(self, policy) -> None:
                self._policy = policy

            def __getattr__(self, name: str):
                return getattr(self._policy, name)

            def upkeep(self) -> None:
                calls["n"] += 1
                if calls["n"] == 1:
                    raise RuntimeError("a bug in quota expiry")
                self._policy.upkeep()

        proxy.policy = FlakyPolicy(proxy.policy)
        bad, good = _Conn(fail=True), _Conn(fail=False)
        proxy.connections = {bad, good}
        task = asyncio.get_running_loop().create_task(proxy._upkeep())
        await asyncio.sleep(3.5)
        task.cancel()
        return calls["n"], bad, good

    n, bad, good = asyncio.run(main())
    assert n >= 3  # the first failure did not end the loop
    assert good.checks >= 2  # checked every second since, despite its failing neighbour
    assert bad.closed_with and bad.closed_kind == "internal"
    assert "upkeep failed" in caplog.text
