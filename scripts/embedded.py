"""The proxy in front of a local single-node Kafka: the quickest way to see it work.

The broker comes from the test harness (Apache Kafka's jars from Maven Central, cached); the
proxy listens on 127.0.0.1:19092 (brokers on 19093+) unless told otherwise, and re-reads its
configuration file on SIGHUP and when it changes, as ``kafka-throttle-proxy run`` does. ``--demo``
adds a 1 MiB/s produce quota (examples/demo.yaml) and a producer that runs into it, so the first
thing a new user sees is a quota biting, enforced the default way. ``--demo fair-share`` runs no
quota at all: a light producer beside a flooder, with the command that turns fair share off and
on while it runs (scripts/demo_fair_share.py). A cold start is minutes of downloads and JVM start:
a line every ten seconds says what it is waiting for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import uvloop

from config.load import ConfigError, load_config
from config.model import ProxyConfig
from proxy import build_info
from proxy.cli.main import Reloader
from proxy.server import Proxy
from tests.harness import KafkaCluster
from tests.harness.kafka_dist import DEFAULT_KAFKA_VERSION, cache_root, ensure_kafka

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "examples" / "demo.yaml"
DEMO_CLIENT_ID = "demo-producer"
DEMOS = ("quota", "fair-share")
FAIR_DEMO_CONFIG = """\
# The fair-share demo's proxy (scripts/run-embedded --demo fair-share): no quota anywhere, every setting at its
# default. Fair share is on by default; it is written out so that one edit turns it off: the proxy re-reads this
# file when it changes (within a second), or at once on SIGHUP.
upstream:
  bootstrap_servers: [127.0.0.1:9092]   # replaced by the embedded broker
listen:
  host: 127.0.0.1
  bootstrap_port: 19092                 # replaced by --port
  broker_ports: 19093-19192
quotas:
  fair_share:
    enabled: true
metrics: {port: 0, host: 127.0.0.1}     # 0: a free port; the demo reads fair share's series from it
"""
FAIR_OFF = ("enabled: true", "enabled: false")
"""The edit that turns fair share off in FAIR_DEMO_CONFIG (reversed: on again)."""


def _du_mb(path: Path) -> float:
    """Megabytes under ``path`` (the Maven repository filling up while Kafka's jars download)."""
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):  # a file mvn renamed meanwhile
            total += p.stat().st_size if p.is_file() else 0
    return total / 1e6


@contextmanager
def _progress(what: str, detail: Callable[[], str] = lambda: "") -> Iterator[None]:
    """Print ``what`` now, and every 10 s until the block ends, how long it has taken (a cold start is silent
    for minutes otherwise)."""
    t0 = time.monotonic()
    print(what + "...", flush=True)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(10.0):
            extra = detail()
            print(f"  ... {time.monotonic() - t0:.0f} s{', ' + extra if extra else ''}", flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        print(f"  done in {time.monotonic() - t0:.0f} s", flush=True)


def _config(path: str | None, bootstrap: str, port: int) -> ProxyConfig:
    """The file's settings (quotas, metrics...) with the embedded broker as upstream and --port's listeners."""
    return load_config(
        path,
        {
            "upstream.bootstrap_servers": bootstrap,
            "listen.bootstrap_port": port,
            "listen.broker_ports": f"{port + 1}-{port + 100}",
        },
    )


def _try_it(bootstrap: str) -> str:
    """A first command to run against the proxy, with a tool this machine has (kcat is not installed by setup)."""
    if shutil.which("kcat"):
        return f"kcat -b {bootstrap} -L"
    return f"scripts/kafka-tool topics --bootstrap-server {bootstrap} --list   (Kafka's own tools, fetched once)"


def _demo_quota(config) -> float:
    """The producer_byte_rate the demo's client id is held to (from the config the demo runs with)."""
    for rule in config.quotas.entities:
        if rule.entity.get("client-id") == DEMO_CLIENT_ID and rule.quotas.get("producer_byte_rate"):
            return float(rule.quotas["producer_byte_rate"])
    raise ConfigError(f"the demo needs a producer_byte_rate for client-id {DEMO_CLIENT_ID!r} (see {DEMO_CONFIG})")


async def _child(module: str, *args: str) -> int:
    """Run ``python -m module args`` (its own process: an ordinary client) until it ends; on cancellation (Ctrl-C)
    SIGINT it and let it end with its summary before the proxy goes."""
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", module, *args, cwd=REPO)
    try:
        return await child.wait()
    except asyncio.CancelledError:
        if child.returncode is None:
            child.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(child.wait(), 30)
            except TimeoutError:
                child.kill()
                await child.wait()
        raise


def _metrics_url(proxy: Proxy) -> str | None:
    return f"http://127.0.0.1:{proxy.metrics_port}/metrics" if proxy.metrics_port else None


async def _demo(proxy: Proxy, quota: float, seconds: float) -> int:
    """Run the demo producer through the proxy; say what to look at and how to change the quota first, so both
    can be tried while it runs."""
    metrics = _metrics_url(proxy)
    qc = proxy.config.quotas
    if qc.enforcement == "smooth":
        shape = (
            "  - the rate below: the quota from the first line on (enforcement: smooth, the default: each Produce\n"
            f"    waits at the proxy until {qc.smooth_burst_seconds:g} s of quota pays for it: paced, never told to "
            "stop);\n"
            "  - throttle_time_ms: what the proxy told the client to wait (KIP-219); a paced producer owes nothing, "
            "so 0;"
        )
    else:
        shape = (
            "  - the rate below: a burst first (Kafka's windowed rate lets about quota x 10 s through), then the "
            "quota (enforcement: kafka);\n"
            "  - throttle_time_ms: what the proxy told the client to wait, as a Kafka broker would (KIP-219);"
        )
    print(
        f"\nDEMO: a producer sends as fast as it can; the proxy holds client id {DEMO_CLIENT_ID!r} to "
        f"{quota / (1 << 20):.2f} MiB/s.\nWhat to look at:\n{shape}",
        flush=True,
    )
    if metrics:
        print(f"  - the proxy's metrics: curl -s {metrics} | grep -E 'ktp_produce|ktp_quota_decisions'", flush=True)
    print(
        f"  - change the quota live, in another terminal (the producer's lines follow it):\n"
        f"      .venv/bin/kafka-throttle-proxy quotas --bootstrap-server {proxy.bootstrap_address} alter "
        f"--client-id {DEMO_CLIENT_ID} --add-config producer_byte_rate=4194304\n",
        flush=True,
    )
    return await _child(
        "scripts.demo_producer",
        *("--bootstrap-server", proxy.bootstrap_address, "--quota", str(quota), "--seconds", str(seconds)),
        *("--client-id", DEMO_CLIENT_ID, "--enforcement", qc.enforcement),
        *("--burst-seconds", str(qc.smooth_burst_seconds)),
    )


def fair_switch_commands(path: Path) -> tuple[str, str]:
    """The shell commands that turn fair share off, then on again, in the running demo's config file."""
    off, on = (f"sed -i 's/{a}/{b}/' {shlex.quote(str(path))}" for a, b in (FAIR_OFF, FAIR_OFF[::-1]))
    return off, on


async def _fair_demo(proxy: Proxy, path: Path, seconds: float) -> int:
    """Run the fair-share demo through the proxy (scripts/demo_fair_share.py), after saying what to look at and
    the commands that turn fair share off and on while it runs."""
    metrics = _metrics_url(proxy)
    assert metrics is not None  # FAIR_DEMO_CONFIG serves metrics: the demo's lines read fair share from them
    off, on = fair_switch_commands(path)
    print(
        "\nDEMO: no quota anywhere. A light producer (200 records/s of 1 KiB) shares the broker with a flooder "
        "(full speed, ~1 MB batches).\n"
        "With fair share on (the default), when the broker's answers slow down the proxy holds the flooder to a "
        "share,\nso the light producer's latency stays low. What to look at, every 2 s:\n"
        "  - light p50/p99: its records' latency (send to acknowledgement) over the last 2 s;\n"
        "  - flooder MiB/s: what the flooder got acknowledged;\n"
        "  - fair share: off, on (not limiting), or limiting, with the flooder's share, from the proxy's metrics:\n"
        f"      curl -s {metrics} | grep ktp_fair_share\n"
        "  - turn fair share off live, in another terminal (the proxy re-reads its file within a second, and says\n"
        f'    "fair share turned off"), and watch the light producer\'s p99:\n'
        f"      {off}\n"
        "    and on again:\n"
        f"      {on}\n",
        flush=True,
    )
    args = ["--bootstrap-server", proxy.bootstrap_address, "--metrics", metrics, "--seconds", str(seconds)]
    return await _child("scripts.demo_fair_share", *args)


async def _serve(path: str | None, bootstrap: str, port: int, demo: str | None, demo_seconds: float, once: bool) -> int:
    def load() -> ProxyConfig:
        return _config(path, bootstrap, port)

    config = load()
    quota = _demo_quota(config) if demo == "quota" else 0.0
    logging.getLogger(__name__).info("%s", build_info.describe())  # which build runs, as `run` says it
    proxy = Proxy(config)
    await proxy.start()
    print(
        f"\nKafka is at {bootstrap} (do not use it directly).\n"
        f"Point clients at the proxy:  bootstrap.servers={proxy.bootstrap_address}\n"
        f"  e.g. {_try_it(proxy.bootstrap_address)}\n"
        "Ctrl-C stops the proxy and the broker.\n",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloader = Reloader(proxy, path, load)  # what `run` does: a file edited while it runs is put in force
    loop.add_signal_handler(signal.SIGHUP, reloader.reload, "SIGHUP")
    watcher = loop.create_task(reloader.watch())
    code = 0
    if demo is not None:
        running = asyncio.ensure_future(
            _demo(proxy, quota, demo_seconds) if demo == "quota" else _fair_demo(proxy, Path(path or ""), demo_seconds)
        )
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            code = running.result()
            if not once:
                print("\nThe proxy keeps running for your own clients; Ctrl-C stops it.", flush=True)
        else:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        stopped.cancel()
    if not once:
        await stop.wait()
    watcher.cancel()
    await proxy.shutdown()
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=19092, help="proxy bootstrap port (brokers get the next 100)")
    ap.add_argument(
        "-c",
        "--config",
        help="a proxy config (e.g. examples/byte-rates.yaml); its upstream and "
        "listen ports are replaced by the embedded broker's and --port's; re-read when it changes, or on SIGHUP",
    )
    ap.add_argument(
        "--demo",
        nargs="?",
        const="quota",
        choices=DEMOS,
        help=f"quota (the default): run a producer into a quota ({DEMO_CONFIG.relative_to(REPO)} unless -c is "
        "given) and show what it gets; fair-share: a light producer beside a flooder, no quota anywhere, with the "
        "commands that turn fair share off and on live",
    )
    ap.add_argument(
        "--demo-seconds",
        type=float,
        default=0.0,
        help="how long the demo's producers run (0, the default: until Ctrl-C)",
    )
    ap.add_argument("--once", action="store_true", help="with --demo: stop everything when the demo ends")
    args = ap.parse_args()
    if args.demo == "fair-share" and args.config:
        print("--demo fair-share writes its own config (no quota, fair share on); drop -c", file=sys.stderr)
        return 2
    if args.demo == "quota" and not args.config:
        args.config = str(DEMO_CONFIG)
    with contextlib.ExitStack() as cleanup:
        if args.demo == "fair-share":
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="ktp-fair-share-demo-")))
            args.config = str(workdir / "proxy.yaml")
            Path(args.config).write_text(FAIR_DEMO_CONFIG)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:  # a bad file is one line, before minutes spent starting Kafka
        checked = _config(args.config, "127.0.0.1:9", args.port)
        if args.demo == "quota":
            _demo_quota(checked)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # the ports first: a busy one is one line, before minutes spent starting Kafka
        for port in (args.port, args.port + 1):
            with socket.create_server(("127.0.0.1", port)):
                pass
    except OSError as exc:
        print(
            f"--port {args.port}: 127.0.0.1:{port} cannot be used ({exc.strerror or exc}); pick another with --port",
            file=sys.stderr,
        )
        return 2
    m2 = Path.home() / ".m2" / "repository"
    before = _du_mb(m2) if m2.exists() else 0.0
    with _progress(
        f"fetching Apache Kafka {DEFAULT_KAFKA_VERSION}'s jars (Maven Central, cached in "
        f"{cache_root()}; the first run downloads about 150 MB)",
        lambda: f"{max(0.0, _du_mb(m2) - before):.0f} MB downloaded" if m2.exists() else "",
    ):
        dist = ensure_kafka()
    cluster = KafkaCluster(1, dist=dist)
    with _progress("starting a single-node Kafka broker (KRaft)"):
        cluster.start()
    try:
        return uvloop.run(_serve(args.config, cluster.bootstrap, args.port, args.demo, args.demo_seconds, args.once))
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
