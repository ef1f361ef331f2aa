"""kafka-throttle-proxy run|check-config|quotas|calibrate: a Kafka proxy that holds every client to its quotas."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import Any

from config.load import ConfigError, load_config
from config.model import ProxyConfig
from proxy import build_info
from proxy.cli import calibrate, quota_admin, supervisor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-throttle-proxy", description=__doc__)
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and build, then exit")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("run", "run the proxy"), ("check-config", "validate the configuration and exit")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("-c", "--config", help="YAML configuration file")
        s.add_argument(
            "--bootstrap-server",
            "--bootstrap-servers",
            dest="bootstrap_servers",
            help="upstream cluster, host:port[,host:port…] (either spelling: Kafka's tools say --bootstrap-server)",
        )
        s.add_argument("--listen-host", help="interface the listeners bind to")
        s.add_argument("--bootstrap-port", type=int, help="port clients bootstrap from")
        s.add_argument("--broker-ports", help="FIRST-LAST port range (one per broker) or 'ephemeral'")
        s.add_argument("--advertised-host", help="host written into rewritten broker addresses")
        s.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
        s.add_argument("--workers", type=int, help="proxy processes sharing the listener ports (SO_REUSEPORT)")
    quota_admin.add_parser(sub)
    calibrate.add_parser(sub)
    return p


def version_line() -> str:
    """``kafka-throttle-proxy X.Y.Z (Python 3.n; per-request modules: compiled by mypyc …)``: what an operator
    asks of an installed copy (the wheel's metadata; a checkout not installed says so)."""
    try:
        version = importlib.metadata.version("kafka-throttle-proxy")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    py = ".".join(map(str, sys.version_info[:3]))
    return f"kafka-throttle-proxy {version} (Python {py}; {build_info.describe()})"


class _Version(argparse.Action):
    """``--version``: one unwrapped line (argparse's own action wraps it to the terminal), worked out only when
    asked (it imports the compiled modules to tell whether they are)."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(version_line())
        parser.exit()


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    return load_config(
        args.config,
        {
            "upstream.bootstrap_servers": args.bootstrap_servers,
            "listen.host": args.listen_host,
            "listen.bootstrap_port": args.bootstrap_port,
            "listen.broker_ports": args.broker_ports,
            "listen.advertised_host": args.advertised_host,
            "log_level": args.log_level,
            "workers": args.workers,
        },
    )


log = logging.getLogger("proxy.cli")


class Reloader:
    """Re-reads the configuration on SIGHUP and when the file changes (polled: works on every filesystem and
    in containers with a bind-mounted file). A bad file is refused by field; the running config stays.

    ``load`` builds the whole configuration (the file and whatever overrides it: ``run``'s flags, or
    ``scripts/run-embedded``'s broker and ports), so a reload keeps what the file does not say."""

    def __init__(self, proxy: Any, path: str | None, load: Callable[[], ProxyConfig], interval_s: float = 1.0) -> None:
        self.proxy = proxy
        self.path = path
        self.load = load
        self.interval_s = interval_s
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        path = self.path
        if not path:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, why: str) -> bool:
        try:
            self.proxy.reload(self.load())
        except ConfigError as exc:
            log.error("configuration reload (%s) refused, keeping the running configuration: %s", why, exc)
            return False
        log.info("configuration reloaded (%s)", why)
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            stamp = self._file_stamp()
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                self.reload("file changed")


async def serve(config: ProxyConfig, args: argparse.Namespace | None = None) -> None:
    from proxy.server import Proxy

    worker = supervisor.worker_index()
    if not worker:  # one line per host, not per worker
        log.info("%s", build_info.describe())
        stale = build_info.stale_modules()
        if stale:
            log.warning(
                "compiled modules older than their source, running the old code: %s (run scripts/setup)",
                ", ".join(stale),
            )
    proxy = Proxy(config, worker=worker)
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args is not None:
        reloader = Reloader(proxy, args.config, lambda: config_from_args(args))
        loop.add_signal_handler(signal.SIGHUP, reloader.reload, "SIGHUP")
        watcher = loop.create_task(reloader.watch())
    who = "" if worker is None else f" (worker {worker} of {config.workers}, pid {os.getpid()})"
    print(f"kafka-throttle-proxy: point clients at bootstrap.servers={proxy.bootstrap_address}{who}", flush=True)
    await stop.wait()
    if args is not None:
        watcher.cancel()
    await proxy.shutdown()


def _raise_fd_limit() -> None:
    """Every client connection that speaks costs two file descriptors (client and broker socket): take the whole
    hard limit the operator allows, not the small default soft limit a shell hands down."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger(__name__).warning("cannot raise the open-file limit from %d to %s: %s", soft, hard, exc)
            return
        soft = hard
    logging.getLogger(__name__).info("open-file limit: %s (a client connection holds one, two once it speaks)", soft)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.command == "quotas":
        return quota_admin.run(args)
    if args.command == "calibrate":
        return calibrate.run(args)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"kafka-throttle-proxy: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        print("configuration is valid")
        costs = config.quotas.request_costs
        # Which request-cost table request_percentage charges by: a calibrated one, or the built-in guess (issue 50).
        print(f"request costs: {'built-in table' if costs is None else f'quotas.request_costs ({costs.source})'}")
        return 0
    worker = supervisor.worker_index()
    tag = "" if worker is None else f"[w{worker}] "
    logging.basicConfig(
        level=config.log_level, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s", stream=sys.stderr
    )
    if config.workers > 1 and worker is None:
        return supervisor.supervise(
            argv, config.workers, (config.shutdown_unready_ms + config.shutdown_grace_ms) / 1000
        )
    _raise_fd_limit()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back rather than refuse to run
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(config, args))
    except ConfigError as exc:  # found only when starting: an unusable state file or decision-log directory
        print(f"kafka-throttle-proxy: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
