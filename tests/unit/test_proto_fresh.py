"""The committed generated code must match proto/: regenerate with `make proto`."""

from scripts.gen_proto import ROOT, generate


def test_generated_code_is_current(tmp_path):
    for fresh in generate(tmp_path):
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run `make proto`"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run `make proto`"
