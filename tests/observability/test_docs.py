"""The shipped Prometheus rules and Grafana dashboard parse: every expression passes promtool, and
every metric they name is one kvstore exports (docs/observability.md lists them)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
GRAFANA = DOCS / "grafana" / "kvstore.json"
OUR_METRIC = re.compile(r"\b(kvstore_[a-z_]+)")


def grafana_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(GRAFANA.read_text())["panels"] for t in p["targets"]]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_every_grafana_expression_is_valid_promql(tmp_path):
    rules = {
        "groups": [
            {
                "name": "grafana",
                "rules": [{"record": f"kvstore:panel_{i}", "expr": e} for i, e in enumerate(grafana_exprs())],
            }
        ]
    }
    path = tmp_path / "grafana-exprs.yml"
    path.write_text(json.dumps(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_and_panels_name_documented_metrics():
    documented = set(OUR_METRIC.findall((DOCS / "observability.md").read_text()))
    text = (DOCS / "prometheus" / "alerts.yml").read_text() + "\n".join(grafana_exprs())
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for m in OUR_METRIC.findall(text)}

    def known(name: str) -> bool:
        stem = re.sub(r"_total$", "", name)
        return any(d.startswith(stem) or stem.startswith(d.rstrip("_")) for d in documented)

    assert {m for m in used if not known(m)} == set()
