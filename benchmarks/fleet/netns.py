"""Hosts on one machine: each a Linux network namespace with its own IPv4 address on a bridge
(a veth pair per host), its link shaped with tc `tbf`, partitions made and healed at will.

    with Fleet() as fleet:
        a, b = fleet.add_host("a", rate_mbit=800), fleet.add_host("b")
        proc = fleet.popen(a, ["python", "-m", "server", "--host", a.address])
        fleet.partition(a, b)              # a <-/-> b: packets both ways dropped silently
        fleet.heal(a, b)
        fleet.shape(b, 200)                # b's link (both directions) at 200 Mbit/s

What each mechanism is, on a kernel without netfilter tools and without `netem`:
- A link is a veth pair: one end (`eth0`) inside the host's namespace, the other on the bridge.
  tbf on the inside end shapes what the host sends, on the bridge end what it receives. There is
  no `netem`, so no added delay or loss: latency comes only from queueing behind the token bucket.
- A partition src -> dst is an `ip rule ... blackhole` in dst's namespace matching packets from
  src's address: they are dropped on arrival, silently (no RST, no ICMP), as a real partition drops
  them, established connections included (TCP early demux, which would skip the route lookup for
  them, is turned off in every host). `cut`/`uncut` take a host's whole link down and up.
- Each process runs as `ip netns exec NS unshare --uts`, with the host's own hostname, so
  software that tells hosts apart by hostname sees different hosts (no shared-memory shortcut).

Names: every namespace and link of a fleet starts with `kvf` + the owner's pid in base 36 + a
counter, so one run never touches another's; `Fleet()` first removes what a dead owner of that
family left behind. Everything is removed by `close()` (the context manager), at exit, and on
SIGTERM/SIGHUP. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): `missing()` says what is absent.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

FAMILY = "kvf"
_OWNED = re.compile(rf"^{FAMILY}([0-9a-z]{{5}})[0-9a-f](?:-|br$|v\d+$)")
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
_counter = itertools.count()
_open: list[Fleet] = []
_open_lock = threading.Lock()


class FleetError(RuntimeError):
    """A command that builds or changes the fleet failed (its stderr is in the message)."""


@dataclass(frozen=True)
class Host:
    name: str  # the role's name in this fleet, e.g. "meta1"
    netns: str  # the namespace (and hostname) its processes run in
    address: str  # its IPv4 address on the bridge
    bridge_end: str  # the veth end on the bridge (its egress: what the host receives)
    rate_mbit: float | None  # the rate its link was created with (None: unshaped)


def missing() -> str | None:
    """Why this machine cannot run a fleet (None: it can): root's capabilities, or a tool."""
    try:
        with open("/proc/self/status") as fh:
            caps = int(next(line for line in fh if line.startswith("CapEff:")).split()[1], 16)
    except (OSError, StopIteration, ValueError):
        caps = 0
    if not caps & (1 << _CAP_NET_ADMIN):
        return "a fleet needs CAP_NET_ADMIN (run as root) to make network namespaces, veths and tc qdiscs"
    if not caps & (1 << _CAP_SYS_ADMIN):
        return "a fleet needs CAP_SYS_ADMIN (run as root) for `ip netns` and `unshare --uts`"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"a fleet needs `{tool}` (iproute2 / util-linux)"
    return None


def _b36(n: int, width: int) -> str:
    digits = ""
    while n:
        n, d = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
    return digits.rjust(width, "0")[-width:]


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise FleetError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_pids_in(netns: str) -> None:
    for pid in _run("ip", "netns", "pids", netns, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def remove_leftovers() -> list[str]:
    """Remove the namespaces and links of this family whose owning process is gone (a run that
    was killed before it could clean up). Returns what was removed; never touches a live run's."""
    removed: list[str] = []
    for line in _run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = _OWNED.match(name)
        if m and not _alive(int(m.group(1), 36)):
            _kill_pids_in(name)
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = _OWNED.match(name)
        if m and not _alive(int(m.group(1), 36)):
            _run("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no address or route of this machine overlaps."""
    used = _run("ip", "-4", "-o", "addr", "show", check=False) + _run("ip", "-4", "route", "show", check=False)
    taken = [ipaddress.IPv4Network(m, strict=False) for m in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", used)]
    subnets = list(_SUBNETS.subnets(new_prefix=24))
    for i in range(len(subnets)):
        net = subnets[(seed + i) % len(subnets)]
        if not any(net.overlaps(t) for t in taken):
            return net
    raise FleetError(f"no free /24 left in {_SUBNETS}")


class Fleet:
    """Hosts on one bridge. Not thread safe: one thread builds and changes it."""

    def __init__(self, startup_timeout_s: float = 20.0) -> None:
        remove_leftovers()
        n = next(_counter)
        self.prefix = f"{FAMILY}{_b36(os.getpid(), 5)}{n % 16:x}"
        self.subnet = _free_subnet(os.getpid() * 16 + n)
        self.bridge = f"{self.prefix}br"
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen[Any]] = []
        self._rules: dict[tuple[str, str], int] = {}  # (src, dst) -> the rule's pref in dst
        self._prefs = itertools.count(10)
        self._addresses = self.subnet.hosts()
        self.gateway = str(next(self._addresses))  # the bridge's own address: this (root) process
        self._closed = False
        with _open_lock:
            _open.append(self)
        _install_handlers()
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str, rate_mbit: float | None = None) -> Host:
        """A new namespace with lo and eth0 up, an address on the bridge, its link at `rate_mbit`."""
        index = len(self.hosts)
        netns, outer = f"{self.prefix}-{name}", f"{self.prefix}v{index}"
        host = Host(name, netns, str(next(self._addresses)), outer, rate_mbit)
        self.hosts[name] = host
        _run("ip", "netns", "add", netns)
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", f"{outer}i")
        _run("ip", "link", "set", f"{outer}i", "netns", netns)
        _run("ip", "-n", netns, "link", "set", f"{outer}i", "name", "eth0")
        _run("ip", "-n", netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        for dev in ("lo", "eth0"):
            _run("ip", "-n", netns, "link", "set", dev, "up")
        _run("ip", "link", "set", outer, "master", self.bridge, "up")
        # Partitions are rules ahead of the local table; early demux would bypass them for
        # established TCP connections, so it is off.
        _run("ip", "-n", netns, "rule", "add", "pref", "1000", "lookup", "local")
        _run("ip", "-n", netns, "rule", "del", "pref", "0")
        _run("ip", "netns", "exec", netns, "sysctl", "-q", "-w", "net.ipv4.tcp_early_demux=0")
        self.shape(host, rate_mbit)
        return host

    # -- links -----------------------------------------------------------------------------------

    def shape(self, host: Host, rate_mbit: float | None) -> None:
        """Both directions of `host`'s link through a token bucket of `rate_mbit` (None: unshaped).
        The bucket holds 4 ms of the rate (at least 32 KiB); its queue 50 ms."""
        inside, outside = ["ip", "netns", "exec", host.netns, "tc"], ["tc"]
        for argv, dev in ((inside, "eth0"), (outside, host.bridge_end)):
            if rate_mbit is None:
                _run(*argv, "qdisc", "del", "dev", dev, "root", check=False)
                continue
            burst = max(32 << 10, int(rate_mbit * 1e6 / 8 * 0.004))
            _run(*argv, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                 "burst", str(burst), "latency", "50ms")  # fmt: skip

    def restore(self, host: Host) -> None:
        """`host`'s link back to the rate it was created with."""
        self.shape(host, host.rate_mbit)

    def partition(self, src: Host, dst: Host, both: bool = True) -> None:
        """Drop every packet from `src` to `dst` (and from `dst` to `src` if `both`), silently."""
        for a, b in ((src, dst), (dst, src)) if both else ((src, dst),):
            if (a.name, b.name) not in self._rules:
                pref = next(self._prefs)
                _run("ip", "-n", b.netns, "rule", "add", "pref", str(pref), "from", a.address, "iif", "eth0",
                     "blackhole")  # fmt: skip
                self._rules[(a.name, b.name)] = pref

    def heal(self, src: Host, dst: Host, both: bool = True) -> None:
        """Undo partition(src, dst, both)."""
        for a, b in ((src, dst), (dst, src)) if both else ((src, dst),):
            pref = self._rules.pop((a.name, b.name), None)
            if pref is not None:
                _run("ip", "-n", b.netns, "rule", "del", "pref", str(pref))

    def heal_all(self) -> None:
        for src, dst in list(self._rules):
            self.heal(self.hosts[src], self.hosts[dst], both=False)

    def partitioned(self, src: Host, dst: Host) -> bool:
        return (src.name, dst.name) in self._rules

    def cut(self, host: Host) -> None:
        """Take `host`'s link down (every peer loses it at once)."""
        _run("ip", "link", "set", host.bridge_end, "down")

    def uncut(self, host: Host) -> None:
        _run("ip", "link", "set", host.bridge_end, "up")

    # -- processes -------------------------------------------------------------------------------

    def command(self, host: Host, argv: list[str]) -> list[str]:
        """`argv` as run on `host`: in its namespace, under its own hostname."""
        return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                host.netns, *argv]  # fmt: skip

    def popen(self, host: Host, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` on `host` (subprocess.Popen's keywords); stopped by close() if still running.
        The process is argv's own (ip, unshare and sh exec into it): its pid is the one to signal."""
        proc = subprocess.Popen(self.command(host, argv), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, host: Host, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(host, argv), capture_output=True, text=True, timeout=timeout)

    # -- teardown --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process started here (SIGTERM, then SIGKILL after 10 s), then remove every
        namespace, veth and the bridge. Safe to call twice, and from a signal handler."""
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for host in self.hosts.values():
            _kill_pids_in(host.netns)
            _run("ip", "netns", "del", host.netns, check=False)
            _run("ip", "link", "del", host.bridge_end, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        with _open_lock:
            if self in _open:
                _open.remove(self)


def close_all() -> None:
    """Close every fleet this process still has open (at exit, on a fatal signal)."""
    with _open_lock:
        fleets = list(_open)
    for fleet in fleets:
        fleet.close()


_handled = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """atexit, and SIGTERM/SIGHUP (SIGINT raises KeyboardInterrupt, which the context manager
    and pytest's teardown already handle). Only from the main thread, and only over defaults."""
    global _handled
    if _handled:
        return
    _handled = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) in (signal.SIG_DFL, None):
                signal.signal(signum, _on_signal)
