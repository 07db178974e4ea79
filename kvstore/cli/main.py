"""The `kvstore` command: its parser, dispatch, and one line (never a traceback) per failure."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from kvstore.cli.exits import Exit, Parser, formatter
from kvstore.version import __version__

log = logging.getLogger("kvstore")
LOG_LEVEL_ENV = "KVSTORE_LOG_LEVEL"
LOG_FORMAT_ENV = "KVSTORE_LOG_FORMAT"

# Engine-side commands live in kvstore.engines; each module declares its own flags and is imported
# only when its command runs. `demo` is the repository's (benchmarks/, not in the wheel): it runs
# from a checkout.
ENGINE_COMMANDS = {
    "engine": ("kvstore.engines.reference.cli", "a reference-engine instance: prefill, decode or colocated"),
    "route": ("kvstore.engines.router.cli", "the PD router: OpenAI-compatible front end over engine instances"),
    "demo": ("benchmarks.demo.scenarios", "store + router + prefill/decode/colocated instances, a workload, TTFT/TPOT"),
    "plan": ("kvstore.engines.plan", "capacity planner: KV bytes, instances, store size and links for a PD deployment"),
}
# The store's own commands: module (in kvstore.cli), one-line summary.
COMMANDS = {
    "serve": ("servers", "metadata service + one storage daemon on this machine (the embedded default)"),
    "meta": ("servers", "the metadata service alone"),
    "daemon": ("servers", "a storage daemon that offers its memory (and disk, GPU) to a metadata service"),
    "clean": ("servers", "delete what kvstore left on disk: an SSD tier's files, segment files of killed daemons"),
    "put": ("data", "store a value (text, a file or stdin)"),
    "get": ("data", "print or save a value"),
    "rm": ("data", "remove keys"),
    "ls": ("data", "list stored keys (admin)"),
    "stat": ("data", "usage, tiers and daemons; with keys, each key's size, tiers, replicas, lease and pin"),
    "reshard": ("reshard", "move every key of a store into one of another shard count (S -> 2S), checked"),
    "tenant": ("tenants", "tenants and their tokens (admin): add, token, revoke, list"),
    "top": ("top", "the dashboard in the terminal: tiers, daemons, events, routers"),
    "bench": ("bench", "throughput, latency and metadata cost against this host's ceilings"),
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="kvstore", description="kvstore: a KVCache-centric store for disaggregated LLM serving.",
               formatter_class=formatter)  # fmt: skip
    p.add_argument("--version", action="version", version=f"kvstore {__version__}")
    _log_flags(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, (module, summary) in COMMANDS.items():
        sp = sub.add_parser(name, help=summary, description=summary, formatter_class=formatter)
        _log_flags(sp)
        if module == "bench":
            from kvstore.bench import add_arguments  # flags only: the bench itself loads when it runs

            add_arguments(sp)
            sp.set_defaults(run=_run_bench)
        else:
            commands = importlib.import_module(f"kvstore.cli.{module}")
            commands.add_command(name, sp)
    for name, (_, summary) in ENGINE_COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return p


def _log_flags(p: argparse.ArgumentParser) -> None:
    """Shown in --help; main() takes them out of the command line itself (see _take_flag)."""
    p.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help=f"DEBUG, INFO, WARNING or ERROR, before or after the command (default: WARNING; env {LOG_LEVEL_ENV})",
    )
    p.add_argument(
        "--log-format",
        default=argparse.SUPPRESS,
        metavar="FORMAT",
        help="text, or json: one JSON object per line, notable events with an `event` key, a request's lines "
        f"with its request_id (default: text; env {LOG_FORMAT_ENV})",
    )


def _run_bench(args: argparse.Namespace) -> int:
    from kvstore.bench import runner

    result: int = runner.main(args)
    return result


def _take_flag(argv: list[str], flag: str) -> tuple[list[str], str | None]:
    """Remove `flag` and its value (anywhere before a `--`) so it works before or after any
    command, engine commands included."""
    out, value, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out += argv[i:]
            break
        if arg == flag and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(flag + "="):
            value, i = arg.split("=", 1)[1], i + 1
            continue
        out.append(arg)
        i += 1
    return out, value


def _engine_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(name, its own arguments) when argv names an engine command (after global flags)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("-h", "--help", "--version"):
            return None
        i += 1
    if i < len(argv) and argv[i] in ENGINE_COMMANDS:
        return argv[i], argv[i + 1 :]
    return None


def _run_engine_command(name: str, rest: list[str]) -> int:
    module_name, summary = ENGINE_COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks":
            raise
        from kvstore.errors import Unavailable

        raise Unavailable(
            f"`kvstore {name}` runs the repository's benchmarks/, which the wheel does not ship: "
            "run it from a kvstore checkout (python -m benchmarks.demo)"
        ) from None
    parser = Parser(prog=f"kvstore {name}", description=summary)
    module.add_arguments(parser)
    result: int = module.run(parser.parse_args(rest))
    return result


def _setup_logging(level_name: str, fmt: str) -> None:
    from kvstore.jsonlog import configure

    level = logging.getLevelName(level_name.upper())
    if not isinstance(level, int):
        print(f"kvstore: error: --log-level {level_name!r}: use DEBUG, INFO, WARNING or ERROR", file=sys.stderr)
        sys.exit(Exit.USAGE)
    if fmt not in ("text", "json"):
        print(f"kvstore: error: --log-format {fmt!r}: use text or json", file=sys.stderr)
        sys.exit(Exit.USAGE)
    configure(level_name, fmt)
    # gRPC's C core logs its own lines to stderr (e.g. "Failed to add port" when a port is in use):
    # kvstore reports those failures itself, in one line. It reads this when grpc is first imported.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR" if level <= logging.DEBUG else "NONE")


def main(argv: Sequence[str] | None = None) -> int:
    args_in, level = _take_flag(list(sys.argv[1:] if argv is None else argv), "--log-level")
    args_in, fmt = _take_flag(args_in, "--log-format")
    _setup_logging(level or os.environ.get(LOG_LEVEL_ENV) or "WARNING", fmt or os.environ.get(LOG_FORMAT_ENV) or "text")
    engine = _engine_command(args_in)
    try:
        if engine is not None:
            return _run_engine_command(*engine)
        args = build_parser().parse_args(args_in)
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - every failure is one line and a non-zero exit
        return _report(exc)


def _report(exc: BaseException) -> int:
    from kvstore.errors import KVStoreError

    if isinstance(exc, KVStoreError):
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    elif isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
    else:
        log.debug("unexpected failure", exc_info=exc)
        print(f"error: {type(exc).__name__}: {exc} (run with --log-level DEBUG for the traceback)", file=sys.stderr)
    return Exit.ERROR


if __name__ == "__main__":
    sys.exit(main())
