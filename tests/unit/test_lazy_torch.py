"""Nothing imports torch (hence CUDA) until a GPU tier or a tensor needs it: a client that moves
bytes and numpy arrays, the daemon, the service and the GPU modules themselves stay torch-free."""

import subprocess
import sys
import textwrap

from tests.cluster import ADMIN_TOKEN, SECRET


def test_host_buffers_never_import_torch(cluster):
    _, address = cluster.serve("64MiB")
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        import kvstore.cli, kvstore.daemon.storage_daemon, kvstore.meta.store, kvstore.storage.gpu, kvstore.bench.gpu
        from kvstore.client import KVClient
        with KVClient({address!r}) as c:
            c.put_many(["a", "b"], [b"x" * 100, np.arange(1000, dtype=np.float32)])
            out = np.zeros(1000, np.float32)
            c.get_many_into(["b"], [out])
            assert out[999] == 999 and c.get("a") == b"x" * 100
        assert "torch" not in sys.modules, "torch was imported"
    """)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"KVSTORE_SECRET": SECRET, "KVSTORE_TOKEN": ADMIN_TOKEN, "PATH": "/usr/bin:/bin", "PYTHONPATH": "."},
    )
    assert done.returncode == 0, done.stderr
