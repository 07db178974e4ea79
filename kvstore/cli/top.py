"""`kvstore top`: the dashboard in a terminal (rich), refreshing, for a machine without a browser.

With `--admin HOST:PORT` it shows the service's own snapshot (/dashboard/data: hit rates, recent
events, routers). With only `--meta` it asks the service for its statistics over gRPC and keeps
its own samples (daemon bandwidth from their /metrics; no hit rates or events, which only the
service sees).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich loads when top runs, not with every kvstore command
    from rich.console import Group

Snapshot = dict[str, Any]


def add_command(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin", default=os.environ.get("KVSTORE_ADMIN"), help="the service's admin face, HOST:PORT")
    p.add_argument(
        "--meta",
        default=os.environ.get("KVSTORE_META", "127.0.0.1:50051"),
        help="metadata service, used when --admin is not given",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(run=run)


def _bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _pct(r: float | None) -> str:
    return "–" if r is None else f"{100 * r:.1f}%"


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{1000 * s:.1f} ms"


def _rate(n: float | None) -> str:
    return "–" if n is None else f"{_bytes(n)}/s"


def render(d: Snapshot) -> Group:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    st = d["store"]
    get, match = d["lookups"]["get"], d["lookups"]["match_prefix"]
    head = Text.assemble(
        ("kvstore  ", "bold"),
        f"keys {st['keys']} (+{st['pending']} being written)  used {_bytes(st['used'])} of {_bytes(st['capacity'])} "
        f"({_pct(st['fill'])})  evictions {st['evictions']}  leases {st['leased']}  pins {st['pinned']}  "
        f"get hit rate {_pct(get['hit_rate'])}  prefix hit rate {_pct(match['hit_rate'])}",
    )
    tiers = Table(
        "tier",
        "fill",
        "used",
        "capacity",
        "blocks",
        "hits",
        "hit share",
        "evictions",
        "demotions",
        "promotions",
        title="tiers",
        expand=True,
    )
    for t in d["tiers"]:
        tiers.add_row(
            t["tier"],
            _pct(t["fill"]),
            _bytes(t["used"]),
            _bytes(t["capacity"]),
            str(t["blocks"]),
            str(t["hits"]),
            _pct(t["hit_share"]),
            str(t["evictions"]),
            str(t["demotions"]),
            str(t["promotions"]),
        )
    daemons = Table(
        "daemon",
        "fill",
        "used",
        "capacity",
        "segments",
        "in",
        "out",
        "transports",
        "heartbeat",
        title="daemons",
        expand=True,
    )
    for x in d["daemons"]:
        daemons.add_row(
            x["daemon_id"],
            _pct(x["fill"]),
            _bytes(x["used"]),
            _bytes(x["capacity"]),
            str(x["segments"]),
            _rate(x["in_bytes_per_s"]),
            _rate(x["out_bytes_per_s"]),
            ", ".join(x["transports"]),
            f"{x['heartbeat_age_s']:.1f} s ago",
        )
    parts: list[Any] = [head, tiers, daemons]
    if d["routers"]:
        routers = Table(
            "router",
            "requests",
            "TTFT p50",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "fallback rate",
            title="routers",
            expand=True,
        )
        for r in d["routers"]:
            routers.add_row(
                r["url"] + ("" if r["reachable"] else " (unreachable)"),
                str(r.get("requests", "–")),
                _ms(r.get("ttft_p50_s")),
                _ms(r.get("ttft_p99_s")),
                _ms(r.get("tpot_p50_s")),
                _ms(r.get("tpot_p99_s")),
                _pct(r.get("fallback_rate")),
            )
        parts.append(routers)
    events = Table("time", "event", "count", "detail", title="recent evictions, demotions and events", expand=True)
    for e in d["events"][:10]:
        events.add_row(time.strftime("%H:%M:%S", time.localtime(e["time"])), e["kind"], str(e["count"]), e["detail"])
    parts.append(events)
    return Group(*parts)


def _reason(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"


def admin_source(address: str) -> Callable[[], Snapshot]:
    url = address if address.startswith("http") else f"http://{address}"

    def fetch() -> Snapshot:
        try:
            with urllib.request.urlopen(f"{url}/dashboard/data", timeout=5) as resp:
                data: Snapshot = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # a standby answers 503 and says why
            from kvstore.errors import Unavailable

            raise Unavailable(f"{url}/dashboard/data: {_reason(exc)}") from None
        return data

    return fetch


def meta_source(address: str) -> tuple[Callable[[], Snapshot], Callable[[], None]]:
    """(a snapshot source over gRPC statistics and local samples, its close)."""
    from kvstore.client import KVClient
    from kvstore.clock import SystemClock
    from kvstore.config import ClientConfig
    from kvstore.dashboard.data import snapshot
    from kvstore.metrics.history import History

    client = KVClient(address, ClientConfig(metrics=False))
    history = History(client.stats, dict, high_watermark=1.0)

    def fetch() -> Snapshot:
        history.sample()
        return snapshot(client.stats(), {}, history, SystemClock().now())

    return fetch, client.close


def run(args: argparse.Namespace) -> int:
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError as exc:
        from kvstore.errors import Unavailable

        raise Unavailable(f"kvstore top needs rich ({exc}): pip install 'kvcachestore[top]'") from exc

    close: Callable[[], None] = lambda: None  # noqa: E731
    if args.admin:
        fetch = admin_source(args.admin)
    else:
        fetch, close = meta_source(args.meta)
    console = Console()
    try:
        if args.once:
            console.print(render(fetch()))
            return 0
        with Live(render(fetch()), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(args.interval)  # the refresh period
                live.update(render(fetch()))
    except KeyboardInterrupt:
        return 0
    finally:
        close()
