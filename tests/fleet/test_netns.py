"""The harness itself (benchmarks/fleet/netns.py): hosts reach each other, a partition drops
packets silently in the directions asked and heals, and nothing outlives a fleet: not after
close(), not after SIGTERM, and what a SIGKILLed owner left is removed by the next fleet."""

from __future__ import annotations

import signal
import subprocess
import sys

from benchmarks.fleet.netns import Fleet, Host, remove_leftovers
from tests.fleet.roles import REPO

SERVER = """
import socket, sys
listener = socket.create_server((sys.argv[1], 7000))
print("listening", flush=True)
while True:
    conn, _ = listener.accept()
    conn.sendall(socket.gethostname().encode())
    conn.close()
"""
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=1) as s:
        print(s.recv(100).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def ask(net: Fleet, src: Host, dst: Host) -> str:
    return net.run(src, [sys.executable, "-c", CLIENT, dst.address]).stdout.strip()


def names() -> str:
    return (
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        + subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    )


def test_partitions_drop_silently_in_the_directions_asked_and_heal(net: Fleet):
    a, b = net.add_host("a"), net.add_host("b")
    for host in (a, b):
        server = net.popen(host, [sys.executable, "-c", SERVER, host.address], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline() == "listening\n"
    assert ask(net, a, b) == b.netns  # its own hostname: another host
    net.partition(a, b, both=False)  # a -> b dropped: a's SYN never arrives
    assert ask(net, a, b) == "TimeoutError"  # silent: no reset, no ICMP
    assert ask(net, b, a) == "TimeoutError"  # b's SYN arrives, a's answer is dropped
    net.heal(a, b, both=False)
    assert ask(net, a, b) == b.netns
    net.partition(a, b)
    assert net.partitioned(b, a)
    net.heal_all()
    assert ask(net, b, a) == a.netns
    net.cut(b)
    assert ask(net, a, b) == "TimeoutError"
    net.uncut(b)
    assert ask(net, a, b) == b.netns


def test_nothing_outlives_a_fleet(net: Fleet):
    prefix = net.prefix
    net.add_host("x")
    net.close()
    assert prefix not in names()

    build = (
        "import sys\nfrom benchmarks.fleet.netns import Fleet\n"
        "f = Fleet(); f.add_host('y'); print(f.prefix, flush=True); sys.stdin.read()"
    )
    for signum in (signal.SIGTERM, signal.SIGKILL):
        owner = subprocess.Popen([sys.executable, "-c", build], cwd=REPO, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert owner.stdout is not None
        theirs = owner.stdout.readline().strip()
        assert theirs and theirs in names()
        owner.send_signal(signum)
        owner.wait(30)
        if signum == signal.SIGKILL:  # no chance to clean up: the next fleet's start does
            assert theirs in names()
            assert any(name.startswith(theirs) for name in remove_leftovers())
        assert theirs not in names(), f"{theirs} left after {signum!r}"
