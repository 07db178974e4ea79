"""The CLI as a person uses it: serve, put, get, stat, ls, rm, clean shutdown, and one clear line
(never a traceback) with a non-zero exit for every mistake."""

import glob
import os
import re
import socket
import subprocess
import sys

import pytest

from kvstore.version import __version__
from tests.cluster import ADMIN_TOKEN, SECRET, spawn


def kv(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={"KVSTORE_SECRET": SECRET, "KVSTORE_TOKEN": ADMIN_TOKEN, "PATH": "/usr/bin:/bin", **(env or {})},
    )


def one_line_error(out: subprocess.CompletedProcess[bytes], code: int, says: str) -> None:
    err = out.stderr.decode()
    assert out.returncode == code, (out.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert says in err, err


def test_serve_put_get_stat_ls_rm_and_clean_shutdown(cluster, tmp_path):
    proc, address = cluster.serve("64MiB")
    assert any("reserves 64 MiB of memory" in line and "no disk" in line for line in proc.lines)
    out = kv("put", "--meta", address, "greeting", "hello")
    assert out.returncode == 0 and b"stored" in out.stdout
    assert kv("get", "--meta", address, "greeting").stdout == b"hello"
    assert kv("get", "--meta", address, "--transports", "tcp", "greeting").stdout == b"hello"
    src = tmp_path / "blob"
    src.write_bytes(bytes(range(256)) * 1000)
    assert kv("put", "--meta", address, "--file", str(src), "blob").returncode == 0
    assert kv("put", "--meta", address, "piped", stdin=b"from stdin").returncode == 0
    assert kv("get", "piped", env={"KVSTORE_META": address}).stdout == b"from stdin"  # $KVSTORE_META
    dst = tmp_path / "copy"
    assert kv("get", "--meta", address, "blob", "--out", str(dst)).returncode == 0
    assert dst.read_bytes() == src.read_bytes()

    # A stored key is kept (content addressed) with exit 3, or replaced on request.
    one_line_error(kv("put", "--meta", address, "greeting", "other"), 3, "already stored")
    assert kv("get", "--meta", address, "greeting").stdout == b"hello"
    assert kv("put", "--meta", address, "--replace", "greeting", "other").returncode == 0
    assert kv("get", "--meta", address, "greeting").stdout == b"other"

    missing = kv("get", "--meta", address, "nope")
    assert missing.returncode == 1 and b"KeyNotFound" in missing.stderr and b"recompute" in missing.stderr
    stat = kv("stat", "--meta", address)
    assert b"keys 3" in stat.stdout and re.search(rb"transports (\w+, )*shm, (\w+, )*tcp", stat.stdout)
    keys = kv("stat", "--meta", address, "blob", "nope")
    assert keys.returncode == 4
    assert re.search(
        rb"blob: complete, 256000 bytes, tier dram, (not leased|leased [\d.]+s more), not pinned", keys.stdout
    ), keys.stdout
    assert b"replicas 1:" in keys.stdout and b"nope: absent" in keys.stdout

    assert kv("ls", "--meta", address).stdout.split() == [b"blob", b"greeting", b"piped"]
    assert kv("ls", "--meta", address, "-l", "p").stdout.split() == [b"10", b"piped"]
    assert kv("ls", "--meta", address, "--limit", "1").stdout.split() == [b"blob"]
    rm = kv("rm", "--meta", address, "piped", "nope")
    assert rm.returncode == 4 and b"removed: piped" in rm.stdout and b"KeyNotFound" in rm.stderr
    assert kv("ls", "--meta", address).stdout.split() == [b"blob", b"greeting"]

    files = glob.glob(f"/dev/shm/kvstore-{proc.pid}-*")
    assert files
    assert proc.stop() == 0
    assert not glob.glob(f"/dev/shm/kvstore-{proc.pid}-*")  # clean shutdown removes segment files


def test_unreachable_meta_is_a_clear_error():
    out = kv("stat", "--meta", "127.0.0.1:1")
    assert out.returncode == 1 and b"Unavailable" in out.stderr and b"kvstore meta" in out.stderr


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        one_line_error(kv("meta", "--port", port), 1, f"127.0.0.1:{port}: the port is in use")
        one_line_error(kv("serve", "--port", port, "--dram", "16MiB"), 1, "the port is in use")


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["serve", "--dram", "lots"], 2, "argument --dram: 'lots' is not a size"),
        (["serve", "--config", "/nonexistent/kv.toml"], 1, "config file /nonexistent/kv.toml does not exist"),
        (["put", "--meta", "127.0.0.1:1", "k", "--file", "/nonexistent/value"], 1, "No such file or directory"),
        (["plan", "--prefill-tps", "0"], 2, "--prefill-tps must be a positive"),
        (["meta", "--lease-ttl-s", "soon"], 2, "argument --lease-ttl-s"),
        (["--log-level", "LOUD", "stat"], 2, "--log-level 'LOUD'"),
    ],
)
def test_mistakes_are_one_line_and_a_nonzero_exit(args, code, says):
    one_line_error(kv(*args), code, says)


def test_a_malformed_config_names_the_file(tmp_path):
    bad = tmp_path / "kv.toml"
    bad.write_text("[daemon\nssd_dir = ")
    one_line_error(kv("serve", "--config", str(bad)), 1, f"config file {bad} is not valid TOML")
    bad.write_text("[daemon]\nbogus = 1\n")
    one_line_error(kv("daemon", "--config", str(bad)), 1, "unknown [daemon] settings")


def test_the_file_beats_defaults_env_beats_the_file_and_flags_beat_env(cluster, tmp_path):
    ssd = tmp_path / "ssd"
    conf = tmp_path / "kv.toml"
    conf.write_text(f'[daemon]\nssd_dir = "{ssd}"\nssd_size = "8MiB"\ndram_size = "32MiB"\n')
    proc = spawn(["serve", "--port", "0", "--config", str(conf)], {"KVSTORE_DAEMON_DRAM_SIZE": "48MiB"})
    cluster.procs.append(proc)
    said = "".join(proc.lines)
    assert "reserves 48 MiB of memory" in said and f"8 MiB of disk preallocated in {ssd}" in said
    assert proc.stop() == 0
    assert glob.glob(str(ssd / "ssd-*.data"))  # kept at stop, for a restart ...
    out = kv("clean", "--ssd-dir", str(ssd))
    assert out.returncode == 0 and b"removed 3 SSD tier files (8 MiB)" in out.stdout
    assert not os.listdir(ssd)  # ... until cleaned
    proc = spawn(
        ["serve", "--port", "0", "--config", str(conf), "--ssd-dir", "", "--dram", "16MiB"],
        {"KVSTORE_DAEMON_DRAM_SIZE": "48MiB"},
    )
    cluster.procs.append(proc)
    assert "reserves 16 MiB of memory" in "".join(proc.lines) and "no disk" in "".join(proc.lines)


def test_version_help_and_log_level_anywhere():
    assert kv("--version").stdout.decode().strip() == f"kvstore {__version__}"
    help_text = " ".join(kv("serve", "--help").stdout.decode().split())
    assert "(default: 1GiB; env KVSTORE_DAEMON_DRAM_SIZE)" in help_text and "env KVSTORE_SECRET" in help_text
    for args in (
        ["--log-level", "ERROR", "stat", "--meta", "127.0.0.1:1"],
        ["stat", "--meta", "127.0.0.1:1", "--log-level", "ERROR"],
    ):
        one_line_error(kv(*args), 1, "Unavailable")
    assert "--role" in kv("engine", "--help").stdout.decode()
