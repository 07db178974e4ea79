"""The committed generated code must match proto/: regenerate with `make proto`.

protoc runs in a child process: in this one, libraries earlier tests loaded can crash it (NIXL's
bundled ones do: the nixl transport's tests import them)."""

import subprocess
import sys

from scripts.gen_proto import ROOT

GENERATE = "import sys; from pathlib import Path; from scripts.gen_proto import generate; generate(Path(sys.argv[1]))"


def test_generated_code_is_current(tmp_path):
    done = subprocess.run([sys.executable, "-c", GENERATE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    fresh_files = sorted(p for p in (tmp_path / "kvstore" / "v1").glob("*_pb2*") if p.suffix in (".py", ".pyi"))
    assert fresh_files, f"protoc wrote nothing: {done.stdout}{done.stderr}"
    for fresh in fresh_files:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run `make proto`"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run `make proto`"
