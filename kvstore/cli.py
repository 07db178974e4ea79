"""The `kvstore` command line: run the servers, poke at the store, benchmark it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import asdict
from typing import Sequence

from kvstore.config import ClientConfig, DaemonConfig, MetaConfig, load_config, random_secret, resolve_secret
from kvstore.errors import KVStoreError

DEFAULT_META = os.environ.get("KVSTORE_META", "127.0.0.1:50051")
DEFAULT_SSD_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvstore", "ssd")
log = logging.getLogger("kvstore")


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def _start_meta(cfg: MetaConfig):
    from kvstore.grant import GrantSigner
    from kvstore.meta.service import MetaServer
    from kvstore.meta.store import MetaStore

    secret, insecure = resolve_secret(cfg.secret)
    if insecure:
        log.warning("no secret configured: grants are signed with the insecure development secret "
                    "(set KVSTORE_SECRET or --secret on the service and every daemon)")
    return MetaServer(cfg, MetaStore(cfg, GrantSigner(secret))).start()


def _start_daemon(cfg: DaemonConfig):
    from kvstore.daemon import StorageDaemon

    return StorageDaemon(cfg).start()


def _daemon_summary(daemon) -> str:
    eps = daemon.endpoints()
    return ", ".join(f"{name} {addr.split('|')[-1]}" for name, addr in sorted(eps.items()))


def cmd_serve(args: argparse.Namespace) -> int:
    secret = args.secret or os.environ.get("KVSTORE_SECRET") or random_secret()
    meta_cfg = load_config(MetaConfig, args.config, host=args.host, port=args.port, secret=secret)
    meta = _start_meta(meta_cfg)
    daemon_cfg = load_config(DaemonConfig, args.config, meta_address=meta.address, host=args.host,
                             secret=secret, dram_size=args.dram, segment_size=args.segment_size,
                             transports=args.transports, ssd_dir=args.ssd_dir, ssd_size=args.ssd,
                             gpu_size=args.gpu)
    try:
        daemon = _start_daemon(daemon_cfg)
    except BaseException:
        meta.stop()
        raise
    print(f"kvstore meta listening on {meta.address}", flush=True)
    ssd = f" + {daemon_cfg.ssd_size >> 20} MiB SSD in {daemon_cfg.ssd_dir}" if daemon_cfg.ssd_dir else ""
    print(f"kvstore daemon {daemon.daemon_id}: {daemon_cfg.dram_size >> 20} MiB DRAM{ssd} via "
          f"{_daemon_summary(daemon)}", flush=True)
    print(f"kvstore ready: meta={meta.address} (Ctrl-C to stop)", flush=True)
    _wait_for_signal()
    daemon.stop()
    meta.stop()
    print("kvstore stopped", flush=True)
    return 0


def cmd_meta(args: argparse.Namespace) -> int:
    cfg = load_config(MetaConfig, args.config, host=args.host, port=args.port, secret=args.secret)
    meta = _start_meta(cfg)
    print(f"kvstore ready: meta={meta.address}", flush=True)
    _wait_for_signal()
    meta.stop()
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    cfg = load_config(DaemonConfig, args.config, meta_address=args.meta, host=args.host,
                      tcp_port=args.tcp_port, secret=args.secret, dram_size=args.dram,
                      segment_size=args.segment_size, transports=args.transports, daemon_id=args.daemon_id,
                      ssd_dir=args.ssd_dir, ssd_size=args.ssd, gpu_size=args.gpu)
    daemon = _start_daemon(cfg)
    print(f"kvstore ready: daemon={daemon.daemon_id} {_daemon_summary(daemon)}", flush=True)
    _wait_for_signal()
    daemon.stop()
    return 0


def _client(args: argparse.Namespace):
    from kvstore.client import KVClient

    cfg = load_config(ClientConfig, getattr(args, "config", None), transports=getattr(args, "transports", None))
    return KVClient(args.meta, cfg)


def cmd_put(args: argparse.Namespace) -> int:
    if args.file:
        with open(args.file, "rb") as fh:
            value = fh.read()
    elif args.value is not None:
        value = args.value.encode()
    else:
        value = sys.stdin.buffer.read()
    with _client(args) as client:
        written = client.put(args.key, value)
    print(f"{'stored' if written else 'already stored (kept)'}: {args.key} ({len(value)} bytes)")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _client(args) as client:
        value = client.get(args.key)
    if args.out:
        with open(args.out, "wb") as fh:
            fh.write(value)
        print(f"{args.key}: {len(value)} bytes -> {args.out}")
    else:
        sys.stdout.buffer.write(value)
        if sys.stdout.isatty():
            sys.stdout.write("\n")
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    with _client(args) as client:
        stats = client.stats()
        if args.key:
            found = client.exists_many(args.key)
    if args.json:
        print(json.dumps(asdict(stats), default=str, indent=2))
        return 0
    pct = 100 * stats.used / stats.capacity if stats.capacity else 0.0
    print(f"keys {stats.keys} (+{stats.pending} being written), used {stats.used >> 20} of "
          f"{stats.capacity >> 20} MiB ({pct:.1f}%), evictions {stats.evictions}, "
          f"revoked puts {stats.revoked_puts}, leased {stats.leased}")
    for t in stats.tiers:
        print(f"  tier {t.tier.value}: {t.used >> 20}/{t.capacity >> 20} MiB, blocks {t.blocks}, hits {t.hits}, "
              f"evictions {t.evictions}, demotions {t.demotions}, promotions {t.promotions}")
    for d in stats.daemons:
        transports = sorted({e.transport for s in d.segments for e in s.endpoints})
        print(f"  daemon {d.daemon_id}: {len(d.segments)} segments, "
              f"{sum(s.capacity for s in d.segments) >> 20} MiB, transports {', '.join(transports)}")
    if args.key:
        for key, ok in zip(args.key, found):
            print(f"  {key}: {'stored' if ok else 'absent'}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from kvstore.bench import runner

    return runner.main(args)


# Engine-side commands live in kvstore.engines; each module declares its own flags. They are
# imported only when their command runs (the reference engine pulls in torch).
_ENGINE_COMMANDS = {
    "engine": ("kvstore.engines.reference.cli", "a reference-engine instance: prefill, decode or colocated"),
    "route": ("kvstore.engines.router.cli", "the PD router: OpenAI-compatible front end over engine instances"),
    "demo": ("kvstore.engines.demo", "store + router + prefill/decode/colocated instances, a workload, TTFT/TPOT"),
    "plan": ("kvstore.engines.plan", "capacity planner: KV bytes per token/request, instances needed"),
}


def cmd_engine_module(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(_ENGINE_COMMANDS[args.command][0])
    parser = argparse.ArgumentParser(prog=f"kvstore {args.command}",
                                     description=_ENGINE_COMMANDS[args.command][1])
    module.add_arguments(parser)
    return module.run(parser.parse_args(args.rest))


def _size(text: str) -> int:
    from kvstore.config import parse_size

    return parse_size(text)


def _transports(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstore", description=__doc__)
    p.add_argument("--log-level", default=os.environ.get("KVSTORE_LOG_LEVEL", "WARNING"))
    sub = p.add_subparsers(dest="command", required=True)

    def server_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="TOML file with [meta] / [daemon] / [client] tables")
        sp.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
        sp.add_argument("--secret", default=None, help="grant key shared by meta and daemons "
                        "(default $KVSTORE_SECRET)")

    def daemon_opts(sp: argparse.ArgumentParser, ssd_dir: str | None) -> None:
        sp.add_argument("--dram", type=_size, default=None, help="DRAM to offer, e.g. 1GiB")
        sp.add_argument("--segment-size", type=_size, default=None, help="size of each DRAM segment")
        sp.add_argument("--transports", type=_transports, default=None, help="e.g. shm,tcp")
        sp.add_argument("--ssd-dir", default=ssd_dir, help="directory for the SSD tier ('' = none)"
                        + (f"; default {ssd_dir}" if ssd_dir else ""))
        sp.add_argument("--ssd", type=_size, default=None, help="disk to offer in --ssd-dir, e.g. 16GiB")
        sp.add_argument("--gpu", type=_size, default=None, help="GPU memory to offer (needs CUDA), e.g. 8GiB")

    sp = sub.add_parser("serve", help="metadata service + one storage daemon on this machine")
    server_opts(sp)
    daemon_opts(sp, DEFAULT_SSD_DIR)
    sp.add_argument("--port", type=int, default=None, help="metadata port (default 50051; 0 = any)")
    sp.set_defaults(fn=cmd_serve)

    sp = sub.add_parser("meta", help="the metadata service alone")
    server_opts(sp)
    sp.add_argument("--port", type=int, default=None)
    sp.set_defaults(fn=cmd_meta)

    sp = sub.add_parser("daemon", help="a storage daemon")
    server_opts(sp)
    daemon_opts(sp, None)
    sp.add_argument("--meta", default=DEFAULT_META, help="metadata service address")
    sp.add_argument("--tcp-port", type=int, default=None)
    sp.add_argument("--daemon-id", default=None)
    sp.set_defaults(fn=cmd_daemon)

    def client_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--meta", default=DEFAULT_META, help="metadata service address ($KVSTORE_META)")
        sp.add_argument("--transports", type=_transports, default=None, help="preference, e.g. tcp")

    sp = sub.add_parser("put", help="store a value")
    client_opts(sp)
    sp.add_argument("key")
    sp.add_argument("value", nargs="?", help="the value as text (or --file, or stdin)")
    sp.add_argument("--file", help="read the value from this file")
    sp.set_defaults(fn=cmd_put)

    sp = sub.add_parser("get", help="print a value")
    client_opts(sp)
    sp.add_argument("key")
    sp.add_argument("--out", help="write the value to this file instead of stdout")
    sp.set_defaults(fn=cmd_get)

    sp = sub.add_parser("stat", help="usage, tiers, daemons and their transports")
    client_opts(sp)
    sp.add_argument("key", nargs="*", help="also say whether these keys are stored")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_stat)

    from kvstore.bench import add_arguments as bench_arguments   # flags only; the bench itself loads lazily

    for name, (_, summary) in _ENGINE_COMMANDS.items():
        sp = sub.add_parser(name, help=summary, add_help=False)
        sp.set_defaults(fn=cmd_engine_module, rest=[])

    sp = sub.add_parser("bench", help="measure throughput, latency and metadata cost against this host's ceilings")
    bench_arguments(sp)
    sp.set_defaults(fn=cmd_bench)

    return p


def _split_engine_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(what kvstore's parser reads, the engine command's own arguments or None)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] or argv[i] in ("-h", "--help") else 2   # global flags take a value
    if i < len(argv) and argv[i] in _ENGINE_COMMANDS:
        return argv[:i + 1], argv[i + 1:]
    return argv, None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, rest = _split_engine_command(argv)
    args = build_parser().parse_args(head)
    if rest is not None:
        args.rest = rest                        # the engine module parses its own flags
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except KVStoreError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
