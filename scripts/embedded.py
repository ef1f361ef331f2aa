"""The proxy in front of a local single-node Kafka: the quickest way to see it work.

The broker comes from the test harness (Apache Kafka's jars from Maven Central, cached); the
proxy listens on 127.0.0.1:19092 (brokers on 19093+) unless told otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys

import uvloop

from config.load import ConfigError, load_config
from proxy.server import Proxy
from tests.harness import KafkaCluster


def _config(path: str | None, bootstrap: str, port: int):
    """The file's settings (quotas, metrics...) with the embedded broker as upstream and --port's listeners."""
    return load_config(path, {"upstream.bootstrap_servers": bootstrap, "listen.bootstrap_port": port,
                              "listen.broker_ports": f"{port + 1}-{port + 100}"})


async def _serve(path: str | None, bootstrap: str, port: int) -> None:
    proxy = Proxy(_config(path, bootstrap, port))
    await proxy.start()
    print(f"\nKafka is at {bootstrap} (do not use it directly).\n"
          f"Point clients at the proxy:  bootstrap.servers={proxy.bootstrap_address}\n"
          f"  e.g. kcat -b {proxy.bootstrap_address} -L\n"
          "Ctrl-C stops the proxy and the broker.\n", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=19092, help="proxy bootstrap port (brokers get the next 100)")
    ap.add_argument("-c", "--config", help="a proxy config (e.g. examples/byte-rates.yaml); its upstream and "
                                           "listen ports are replaced by the embedded broker's and --port's")
    args = ap.parse_args()
    try:  # a bad file is one line, before minutes spent starting Kafka
        _config(args.config, "127.0.0.1:9", args.port)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # the ports first: a busy one is one line, before minutes spent starting Kafka
        for port in (args.port, args.port + 1):
            with socket.create_server(("127.0.0.1", port)):
                pass
    except OSError as exc:
        print(f"--port {args.port}: 127.0.0.1:{port} cannot be used ({exc.strerror or exc}); pick another "
              "with --port", file=sys.stderr)
        return 2
    print("starting a single-node Apache Kafka (the first run downloads its jars)...", flush=True)
    with KafkaCluster(1) as cluster:
        try:
            uvloop.run(_serve(args.config, cluster.bootstrap, args.port))
        except ConfigError as exc:
            print(f"configuration error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
