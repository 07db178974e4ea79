"""Optional transports (mooncake, ucx) whose library is missing: a message naming the extra,
never an ImportError; clients and daemons go on with the transports they have."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import importlib.abc, logging, sys

    class Missing(importlib.abc.MetaPathFinder):      # as if the extras were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("mooncake", "ucxx"):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, Missing())
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    from kvstore.client import KVClient
    from kvstore.config import ClientConfig
    from kvstore.errors import Unavailable
    from kvstore.transport import registry

    for name in ("mooncake", "ucx"):
        try:
            registry.client_class(name)
        except Unavailable as exc:
            print("unavailable:", exc)
    client = KVClient("127.0.0.1:1")                   # the default preference: shm, mooncake, ucx, tcp
    print("preferred:", ",".join(client.transports))
    client.close()
    try:
        KVClient("127.0.0.1:1", ClientConfig(transports=("ucx",)))
    except Unavailable as exc:
        print("only ucx:", exc)
""")


def test_missing_libraries_are_named_and_skipped() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert "pip install 'kvcachestore[mooncake]'" in out.stdout and "pip install 'kvcachestore[ucx]'" in out.stdout
    assert "preferred: shm,tcp" in out.stdout
    assert "only ucx:" in out.stdout and "kvcachestore[ucx]" in out.stdout.split("only ucx:")[1]
