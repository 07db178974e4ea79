"""The flags of `kvstore bench trace FILE` (argparse only: imported when the CLI builds its parser)."""

from __future__ import annotations

import argparse

SUMMARY = "replay a Mooncake-format trace: hit rate beside an exact LRU and the infinite bound (docs/traces.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the trace: JSON lines of timestamp, input_length, hash_ids, ...")
    kv = parser.add_mutually_exclusive_group(required=True)
    kv.add_argument(
        "--model",
        default=None,
        metavar="CONFIG",
        help="the KV size per token from a Hugging Face config.json (or its directory), or a `kvstore plan` "
        "preset such as llama3-8b: 2 x layers x KV heads x head dim x dtype bytes",
    )
    kv.add_argument("--kv-bytes-per-token", type=int, default=None, metavar="BYTES", help="the KV size per token")
    parser.add_argument(
        "--scale",
        type=float,
        required=True,
        help="divide the KV size by this so the run fits this machine (e.g. 4096: llama3-8b's 128 KiB a token "
        "becomes 32 B, a 10M-token store 312 MiB); printed with the results",
    )
    parser.add_argument(
        "--capacity",
        default=None,
        metavar="TOKENS",
        help="store capacities to sweep, in tokens of KV (a fresh store each, its DRAM that many tokens at the "
        "scaled size; default 1M,3M,10M). Not with --meta",
    )
    parser.add_argument(
        "--meta", default=None, metavar="ADDR", help="replay against this store instead of starting one per capacity"
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=0.0,
        metavar="X",
        help="replay at the trace's timestamps, X times faster (default 0: each request as soon as the last is done)",
    )
    parser.add_argument("--limit", type=int, default=0, metavar="N", help="replay only the first N requests")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON here")
    parser.add_argument(
        "--png",
        default=None,
        metavar="PATH",
        help="write the plots here (needs matplotlib; default: beside --json, with .png for .json)",
    )
