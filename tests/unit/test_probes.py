"""The metrics port's probes: /healthz asks the event loop, /readyz asks the proxy on the loop, other paths 404."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from config.model import ProxyConfig
from proxy import metrics
from proxy.server import Proxy
from proxy.stats import Stats
from tests.support import http_get


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _serve(loop, readiness) -> int:
    registry = metrics.make_registry(Stats(), lambda: 0, list)
    return metrics.serve(registry, "127.0.0.1", 0, loop, readiness)


def test_probes_answer_from_the_loop_and_say_what_is_wrong(loop):
    why: list[str | None] = [None]
    port = _serve(loop, lambda: why[0])
    assert http_get(port, "/healthz") == (200, "ok\n")
    assert http_get(port, "/readyz") == (200, "ok\n")
    why[0] = "draining: shutting down"
    assert http_get(port, "/readyz") == (503, "draining: shutting down\n")
    assert http_get(port, "/healthz")[0] == 200  # draining is not dead
    status, text = http_get(port, "/metrics")
    assert status == 200 and "ktp_connections" in text
    assert http_get(port, "/")[0] == 404 and http_get(port, "/metrics/../readyz")[0] == 404


def test_a_stuck_loop_fails_both_probes_but_not_the_scrape(loop):
    port = _serve(loop, lambda: None)
    loop.call_soon_threadsafe(time.sleep, 3 * metrics.PROBE_TIMEOUT_S)  # one callback that holds the loop
    time.sleep(0.1)
    status, text = http_get(port, "/healthz")
    assert status == 503 and "did not answer" in text
    assert http_get(port, "/readyz")[0] == 503
    assert http_get(port, "/metrics")[0] == 200


def test_a_proxy_is_unready_until_its_listeners_are_bound_and_once_it_drains():
    async def main() -> list[str | None]:
        proxy = Proxy(ProxyConfig.model_validate({"upstream": {"bootstrap_servers": ["127.0.0.1:9"]}}))
        seen = [proxy.readiness()]
        proxy._servers[None] = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        seen.append(proxy.readiness())  # bound, but no broker has answered
        proxy.directory.upstream[1] = ("127.0.0.1", 9092)
        seen.append(proxy.readiness())  # a broker with no listener yet
        proxy.directory.ports[1] = 19093
        seen.append(proxy.readiness())
        await proxy.shutdown()
        seen.append(proxy.readiness())
        return seen

    assert asyncio.run(main()) == [
        "the bootstrap listener is not bound yet",
        "no broker has answered yet",
        "no listener yet for broker(s) 1",
        None,
        "draining: shutting down",
    ]
