"""The optional faces without their extras, in this venv, with their libraries hidden: each fails
with one line naming its extra (ha: redis; events: pyzmq, msgpack; top: rich), and what the plain
install serves (the admin face, whose KV indexer imports the events' wire types) still imports.
test_wheel.py checks the same on a real plain install, slowly."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HIDE = textwrap.dedent("""
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):      # as if the extras were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("redis", "zmq", "msgpack", "rich"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())
""")
REPO = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/bin:/bin", "KVSTORE_SECRET": "the extras test secret", "PYTHONPATH": str(REPO)}


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    script = HIDE + "from kvstore.cli import main\nsys.argv[0] = 'kvstore'\nsys.exit(main())\n"
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**ENV, "HOME": str(tmp_path)},
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("meta", "--port", "0", "--redis", "redis://127.0.0.1:1"), "ha"),
        (("meta", "--port", "0", "--events-port", "0"), "events"),
        (("top", "--once", "--meta", "127.0.0.1:1"), "top"),
    ],
)
def test_a_face_without_its_extra_names_it(tmp_path, args, extra) -> None:
    out = _cli(tmp_path, *args)
    assert out.returncode != 0
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: Unavailable: ") and line.endswith(f"pip install 'kvcachestore[{extra}]'"), line


def test_the_indexer_imports_and_subscribing_names_the_extra() -> None:
    script = HIDE + textwrap.dedent("""
        from kvstore.errors import Unavailable
        from kvstore.indexer.api import IndexerApi
        from kvstore.indexer.store_table import StoreTable
        from kvstore.events.subscriber import EventSubscriber
        from kvstore.indexer.engine_cache import EngineCache

        IndexerApi(StoreTable())
        try:
            EventSubscriber("tcp://127.0.0.1:1", EngineCache(16))
        except Unavailable as exc:
            print("unavailable:", exc)

        # over HTTP, as an operator registers an engine: 503 naming the extra, not an internal error
        import json, urllib.error, urllib.request
        from kvstore.admin.http import AdminServer
        admin = AdminServer(operator=lambda token: None).start()
        IndexerApi(StoreTable()).mount(admin)
        body = json.dumps({"endpoint": "tcp://127.0.0.1:1", "instance_id": "e1", "model": "m", "block_size": 16})
        request = urllib.request.Request(
            f"http://{admin.address}/register", body.encode(), {"Authorization": "Bearer x"}, method="POST"
        )
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as exc:
            print("register:", exc.code, json.loads(exc.read())["error"])
        admin.stop()
        assert "zmq" not in sys.modules and "msgpack" not in sys.modules
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "unavailable: KV events need pyzmq and msgpack" in out.stdout
    assert "pip install 'kvcachestore[events]'" in out.stdout
    assert re.search(r"^register: 503 KV events need pyzmq .*pip install 'kvcachestore\[events\]'$", out.stdout, re.M)
