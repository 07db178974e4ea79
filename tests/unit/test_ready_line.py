"""The readiness line is written in one piece: a log line from another thread, on the same pipe,
never lands inside it. Found by CI: `print` wrote the line and its newline apart (unbuffered
stdout), a takeover's log line landed between them, and a test read the port as "332572026-12-06"."""

from __future__ import annotations

import os
import re
import subprocess
import sys

CHILD = r"""
import logging, sys, threading
from kvstore.logs import say_ready
logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(message)s")
done = threading.Event()
def noise():
    while not done.is_set():
        logging.warning("a log line from another thread")
threading.Thread(target=noise, daemon=True).start()
for port in range(2000):
    say_ready(f"meta=127.0.0.1:{port}")
done.set()
"""


def test_a_log_line_never_lands_inside_the_ready_line():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
        env=dict(os.environ, PYTHONUNBUFFERED="1"), check=True,
    ).stdout  # fmt: skip
    ready = [line for line in out.splitlines() if "kvstore ready:" in line]
    assert len(ready) == 2000
    assert all(re.fullmatch(r"kvstore ready: meta=127\.0\.0\.1:\d+", line) for line in ready)
