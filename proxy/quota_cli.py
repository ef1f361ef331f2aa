"""``kafka-throttle-proxy quotas describe|alter``: manage the proxy's quotas without hunting for Kafka's tools.

It speaks DescribeClientQuotas / AlterClientQuotas to the proxy's bootstrap listener, as ``kafka-configs.sh
--bootstrap-server`` does, with Kafka's entity types (``user``, ``client-id``, ``ip``) and quota keys; the output
reads like kafka-configs'. Without SASL the caller is the principal ``ANONYMOUS``, which must be among
``quotas.admins`` (alter) or ``quotas.describers`` (describe). Plain connections only: for a SASL or TLS listener,
use ``kafka-configs.sh --command-config``.
"""

from __future__ import annotations

import argparse
import asyncio

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from proxy.discovery import ask_once

_VERSION = 1
_MATCH_EXACT, _MATCH_DEFAULT = 0, 1
_TYPES = (("user", "user"), ("client_id", "client-id"), ("ip", "ip"))
_MAX_FRAME = 16 * 1024 * 1024


def add_parser(sub) -> None:
    q = sub.add_parser("quotas", help="describe or alter quotas through a running proxy (like kafka-configs)")
    q.add_argument("--bootstrap-server", required=True, help="the proxy's bootstrap listener, host:port")
    actions = q.add_subparsers(dest="action", required=True)
    for name, help_ in (("describe", "show quotas (all when no entity is named)"),
                        ("alter", "set (--add) or remove (--delete) quotas of one entity")):
        a = actions.add_parser(name, help=help_)
        for attr, flag in _TYPES:
            a.add_argument(f"--{flag}", dest=attr, metavar="NAME",
                           help=f"the {flag} entity; '<default>' for the default {flag}")
        if name == "alter":
            a.add_argument("--add", default="", help="k=v[,k=v...], e.g. producer_byte_rate=1048576")
            a.add_argument("--delete", default="", help="k[,k...]")


def _entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    out = []
    for attr, etype in _TYPES:
        name = getattr(args, attr)
        if name is not None:
            out.append((etype, None if name == "<default>" else name))
    return out


def _shown(entity) -> str:
    parts = []
    for e in entity:
        kind = "user-principal" if e.entity_type == "user" else e.entity_type
        parts.append(f"the default {kind}" if e.entity_name is None else f"{kind} '{e.entity_name}'")
    return ", ".join(parts)


async def _describe(host: str, port: int, args: argparse.Namespace) -> int:
    C = DescribeClientQuotasRequest.ComponentData
    named = _entity(args)
    # No entity named: no filter component and not strict, which matches every user/client-id entity.
    components = [C(entity_type=t, match_type=_MATCH_DEFAULT if n is None else _MATCH_EXACT, match=n)
                  for t, n in named]
    req = DescribeClientQuotasRequest(components=components, strict=bool(named))
    resp = await ask_once(host, port, req, DescribeClientQuotasResponse, _VERSION, _MAX_FRAME)
    if resp.error_code:
        print(f"error {resp.error_code}: {resp.error_message}")
        return 1
    for entry in resp.entries or ():
        values = ", ".join(f"{v.key}={v.value}" for v in entry.values)
        print(f"Quota configs for {_shown(entry.entity)} are {values}")
    return 0


async def _alter(host: str, port: int, args: argparse.Namespace) -> int:
    entity = _entity(args)
    if not entity:
        raise SystemExit("quotas alter: name the entity (--user, --client-id and/or --ip)")
    E = AlterClientQuotasRequest.EntryData
    ops = []
    for item in filter(None, (p.strip() for p in args.add.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"quotas alter --add: {item!r} is not key=value")
        try:
            ops.append(E.OpData(key=key.strip(), value=float(value), remove=False))
        except ValueError:
            raise SystemExit(f"quotas alter --add: {key.strip()}: {value!r} is not a number") from None
    ops += [E.OpData(key=k.strip(), value=0.0, remove=True) for k in args.delete.split(",") if k.strip()]
    if not ops:
        raise SystemExit("quotas alter: nothing to do (--add and/or --delete)")
    req = AlterClientQuotasRequest(entries=[E(entity=[E.EntityData(entity_type=t, entity_name=n)
                                                      for t, n in entity], ops=ops)], validate_only=False)
    resp = await ask_once(host, port, req, AlterClientQuotasResponse, _VERSION, _MAX_FRAME)
    failed = 0
    for entry in resp.entries:
        if entry.error_code:
            failed += 1
            print(f"error {entry.error_code} for {_shown(entry.entity)}: {entry.error_message}")
        else:
            print(f"Completed updating config for {_shown(entry.entity)}.")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    host, _, port = args.bootstrap_server.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"--bootstrap-server {args.bootstrap_server!r}: expected host:port")
    action = _describe if args.action == "describe" else _alter
    try:
        return asyncio.run(action(host, int(port), args))
    except (OSError, asyncio.IncompleteReadError) as exc:
        raise SystemExit(f"--bootstrap-server {args.bootstrap_server}: {exc}") from None
