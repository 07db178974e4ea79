"""`kvstore bench`: the store's throughput, latency, server CPU and metadata cost against ceilings
(memcpy, the raw loopback socket) measured in the same run, judged against the targets in
targets.toml. From a checkout, --compare also measures peer stores (Mooncake Store, Redis) in the
same run: they are the repository's lab (benchmarks/peers, not installed), found through the
plug-in point kvstore.bench.plugin.

This module only declares the command's flags (it imports nothing heavy, so the CLI can build its
parser cheaply); the measuring lives in kvstore.bench.runner and is imported when the command runs.
"""

from __future__ import annotations

import argparse

from kvstore.bench.trace import flags as trace_flags

SECTION_NAMES = "ceilings,throughput,latency,prefix,engine,metamem"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--meta", default=None, help="benchmark the store at this metadata address instead of starting one"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer iterations and sizes (4KiB,1MiB), 100k metadata blocks: under a minute",
    )
    parser.add_argument(
        "--transports",
        default=None,
        help="transports to measure (default shm,tcp; with --compare also mooncake and ucx where installed)",
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="PEERS",
        help="also measure these stores in the same run, comma-separated: mooncake (Mooncake Store: master + "
        "server + client processes on 127.0.0.1, tcp), redis (a redis-server the bench starts); prints "
        "kvstore / peer ratios and judges the targets against them. The peers live in the repository's "
        "benchmarks/ (not installed with kvstore): run it from the root of a checkout",
    )
    parser.add_argument(
        "--tiers",
        action="store_true",
        help="also measure the SSD tier: demotion (SSD write) and cold SSD reads per transport, "
        "against the raw disk (O_DIRECT and buffered) in the same run",
    )
    parser.add_argument(
        "--tiers-dir", default=None, help="directory on the disk to measure for --tiers (default: the system temp dir)"
    )
    parser.add_argument("--tiers-size", default="512MiB", help="bytes demoted and read back for --tiers")
    parser.add_argument(
        "--sizes", default=None, help="block sizes (default 4KiB,64KiB,1MiB,16MiB; with --quick 4KiB,1MiB)"
    )
    parser.add_argument(
        "--meta-blocks",
        type=int,
        default=None,
        help="blocks for the metadata memory measurement (default 1000000; --quick 100000)",
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON here")
    parser.add_argument(
        "--dram",
        default=None,
        help="DRAM of the daemon the bench starts (default 4GiB; --quick 1GiB). Blocks removed after a tcp or "
        "ucx read stay held until the read's grants expire (lease_ttl_s), so a full run needs several phases' room",
    )
    parser.add_argument("--segment-size", default="256MiB", help="segment size of that daemon (default 256MiB)")
    parser.add_argument(
        "--sections",
        default=None,
        help=f"comma-separated subset to run, in fixed order (default: {SECTION_NAMES}; "
        "plus peers with --compare, tiers with --tiers)",
    )
    forms = parser.add_subparsers(dest="bench_form", metavar="trace", title="other forms")
    trace = forms.add_parser("trace", help=trace_flags.SUMMARY, description=trace_flags.SUMMARY)
    trace_flags.add_arguments(trace)
