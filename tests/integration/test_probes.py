"""/healthz and /readyz of a real proxy: ready in front of the real cluster, not ready while no broker answers,
and on SIGTERM unready first (while it still takes connections), then drained and gone."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from tests.harness import free_port
from tests.support import http_get, wait_until

pytestmark = pytest.mark.cluster


def test_ready_in_front_of_the_cluster_then_unready_before_it_stops_taking_connections(cluster, fresh_proxy):
    port = free_port()
    proxy = fresh_proxy(**{"metrics.port": port, "shutdown_unready_ms": 3000})
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, 20, what="the proxy to be ready")
    assert http_get(port, "/healthz") == (200, "ok\n")
    host, bootstrap_port = proxy.bootstrap.rsplit(":", 1)

    proxy.process.send_signal(signal.SIGTERM)
    wait_until(lambda: http_get(port, "/readyz")[0] == 503, 2, interval=0.05, what="unready after SIGTERM")
    assert "draining" in http_get(port, "/readyz")[1]
    with socket.create_connection((host, int(bootstrap_port)), timeout=5):  # still served: balancers catch up
        pass
    assert proxy.process.wait(30) == 0
    assert "unready now" in proxy.log()


def test_not_ready_while_no_broker_answers(tmp_path):
    from tests.support import ProxyProcess

    port = free_port()
    dead = free_port()  # nothing listens there
    proxy = ProxyProcess(tmp_path, f"127.0.0.1:{dead}", {"metrics.port": port}, name="lonely").start()
    try:
        time.sleep(1)
        status, text = http_get(port, "/readyz")
        assert (status, text) == (503, "no broker has answered yet\n")
        assert http_get(port, "/healthz")[0] == 200
    finally:
        proxy.terminate()
