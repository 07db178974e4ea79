"""The CLI as a person uses it: serve, put, get, stat, clean shutdown."""

import glob
import re
import subprocess
import sys

from tests.cluster import SECRET


def kv(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], input=stdin, capture_output=True,
                          timeout=60, env={"KVSTORE_SECRET": SECRET, "PATH": "/usr/bin:/bin"})


def test_serve_put_get_stat_and_clean_shutdown(cluster, tmp_path):
    proc, address = cluster.serve("64MiB")
    out = kv("put", "--meta", address, "greeting", "hello")
    assert out.returncode == 0 and b"stored" in out.stdout
    assert kv("get", "--meta", address, "greeting").stdout == b"hello"
    assert kv("get", "--meta", address, "--transports", "tcp", "greeting").stdout == b"hello"
    src = tmp_path / "blob"
    src.write_bytes(bytes(range(256)) * 1000)
    assert kv("put", "--meta", address, "--file", str(src), "blob").returncode == 0
    assert kv("put", "--meta", address, "piped", stdin=b"from stdin").returncode == 0
    assert kv("get", "--meta", address, "piped").stdout == b"from stdin"
    dst = tmp_path / "copy"
    assert kv("get", "--meta", address, "blob", "--out", str(dst)).returncode == 0
    assert dst.read_bytes() == src.read_bytes()

    missing = kv("get", "--meta", address, "nope")
    assert missing.returncode == 1 and b"KeyNotFound" in missing.stderr and b"recompute" in missing.stderr
    stat = kv("stat", "--meta", address, "greeting", "nope")
    assert b"keys 3" in stat.stdout and re.search(rb"transports (\w+, )*shm, (\w+, )*tcp", stat.stdout)
    assert b"greeting: stored" in stat.stdout and b"nope: absent" in stat.stdout

    files = glob.glob(f"/dev/shm/kvstore-{proc.pid}-*")
    assert files
    assert proc.stop() == 0
    assert not glob.glob(f"/dev/shm/kvstore-{proc.pid}-*")   # clean shutdown removes segment files


def test_unreachable_meta_is_a_clear_error():
    out = kv("stat", "--meta", "127.0.0.1:1")
    assert out.returncode == 1 and b"Unavailable" in out.stderr and b"kvstore meta" in out.stderr
