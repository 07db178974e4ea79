"""`kvstore tenant add|token|revoke|list`: tenants and their tokens (the admin's commands).

    kvstore tenant add NAME [--quota-dram 8GiB] [--quota-ssd 64GiB] [--reserve-dram 1GiB]
                            [--refuse-over-quota] [--trust-shm] [--admin] [--update]
    kvstore tenant token NAME [--ttl 30d]   prints a new bearer token (shown once; kept hashed)
    kvstore tenant revoke NAME [--id TOKEN_ID]
    kvstore tenant list [--json]

They run as the caller's token ($KVSTORE_TOKEN, --token, or the token file), which must be the
admin's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from typing import Any

from kvstore.cli.exits import Exit, Parser, formatter
from kvstore.config import DEFAULT_META_PORT, META_ENV, ClientConfig, parse_size
from kvstore.config.flags import ConfigFlags
from kvstore.results import TenantInfo
from kvstore.types import Tier
from kvstore.wire.calls import TenantAdd, TenantList, TenantRevoke, TenantToken

DEFAULT_META = f"127.0.0.1:{DEFAULT_META_PORT}"


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: seconds, or a number with s, m, h or d"
        ) from None


def add_command(name: str, sp: argparse.ArgumentParser) -> None:
    sub = sp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=Parser)
    add = sub.add_parser("add", help="make a tenant (or change one, with --update)", formatter_class=formatter)
    add.add_argument("name", help="1-63 characters of a-z, 0-9, '.', '_', '-'")
    for tier in Tier:
        t = tier.value
        add.add_argument(f"--quota-{t}", type=_size, metavar="SIZE", help=f"most bytes it may hold in {t}")
        add.add_argument(f"--reserve-{t}", type=_size, metavar="SIZE", help=f"{t} bytes others cannot evict")
    over = "a put over quota fails (QuotaExceeded) instead of evicting its own oldest blocks"
    add.add_argument("--refuse-over-quota", action="store_true", help=over)
    shm = "offer it shm and mooncake, which check no grant per byte range (for same-user processes)"
    add.add_argument("--trust-shm", action="store_true", help=shm)
    add.add_argument("--admin", action="store_true", help="its tokens may manage tenants and daemons too")
    add.add_argument("--update", action="store_true", help="change a tenant that exists (its settings are replaced)")
    token = sub.add_parser("token", help="print a new token of a tenant", formatter_class=formatter)
    token.add_argument("name")
    ttl = "the token stops working after this long: 3600, 90m, 12h, 30d (default: never)"
    token.add_argument("--ttl", type=_duration, default=0.0, metavar="DURATION", help=ttl)
    revoke = sub.add_parser("revoke", help="revoke a tenant's tokens (all, or one)", formatter_class=formatter)
    revoke.add_argument("name")
    revoke.add_argument("--id", dest="token_id", default="", metavar="ID", help="only the token of this id")
    listing = sub.add_parser("list", help="tenants, their quotas, usage and token ids", formatter_class=formatter)
    listing.add_argument("--json", action="store_true")
    for p in (add, token, revoke, listing):
        p.add_argument("--meta", help=f"metadata service address (default: {DEFAULT_META}; env {META_ENV})")
        p.add_argument("--config", metavar="FILE", help="TOML file with a [client] table")
        flags = ConfigFlags()
        flags.add(p, ClientConfig)
        p.set_defaults(flags=flags)
    sp.set_defaults(run=cmd_tenant)


def cmd_tenant(args: argparse.Namespace) -> int:
    from kvstore.metaclient.client import MetaClient
    from kvstore.metaclient.sharded import client_for
    from kvstore.tls import TlsFiles

    cfg: ClientConfig = args.flags.load(ClientConfig, args)
    tls = TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, cfg.tls_server_name)
    address = args.meta or os.environ.get(META_ENV) or DEFAULT_META
    with client_for(MetaClient(address, cfg.timeout_s, cfg.fast_lane, cfg.token or None, tls)) as meta:
        if args.action == "add":
            info = meta.call(TenantAdd(_spec(args), args.update))
            print(f"tenant {info.name} (id {info.id}) {'updated' if args.update else 'added'}: {_settings(info)}")
        elif args.action == "token":
            token_id, token = meta.call(TenantToken(args.name, args.ttl))
            print(token)
            print(f"(token id {token_id}; shown once, kept only as a hash: give it as $KVSTORE_TOKEN)", flush=True)
        elif args.action == "revoke":
            print(f"revoked {meta.call(TenantRevoke(args.name, args.token_id))} token(s) of {args.name}")
        else:
            _show(meta.call(TenantList()), args.json)
    return Exit.OK


def _spec(args: argparse.Namespace) -> TenantInfo:
    quotas = {t: n for t in Tier if (n := getattr(args, f"quota_{t.value}")) is not None}
    reserved = {t: n for t in Tier if (n := getattr(args, f"reserve_{t.value}")) is not None}
    return TenantInfo(args.name, 0, quotas, reserved, not args.refuse_over_quota, args.trust_shm, args.admin)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} B"


def _settings(t: TenantInfo) -> str:
    parts = [f"quota {tier.value} {_mib(n)}" for tier, n in t.quotas.items()] or ["no quota"]
    parts += [f"reserved {tier.value} {_mib(n)}" for tier, n in t.reserved.items()]
    parts.append("evicts its own blocks over quota" if t.evict_own else "refused over quota")
    parts += ["trusted with shm"] * t.trust_shm + ["admin"] * t.admin
    return ", ".join(parts)


def _show(tenants: list[TenantInfo], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_jsonable(asdict(t)) for t in tenants], indent=2))
        return
    for t in tenants:
        used = ", ".join(f"{tier.value} {_mib(n)}" for tier, n in t.used.items()) or "nothing"
        print(f"{t.name} (id {t.id}): {t.keys} keys, holds {used}; {_settings(t)}")
        for token_id, made, until in t.tokens:
            expiry = f", expires {_when(until)}" if until else ""
            print(f"  token {token_id} made {_when(made)}{expiry}")


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {getattr(k, "value", k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return getattr(value, "value", value)
