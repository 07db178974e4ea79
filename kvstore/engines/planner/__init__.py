"""The capacity planner behind `kvstore plan` (kvstore/engines/plan.py is its command line).

    model.py      a model's KV cache per token and its parameter counts; presets
    hf_config.py  the same, read from a Hugging Face `config.json`
    hardware.py   accelerators: memory, FLOP/s, memory bandwidth
    sizing.py     the formulas: throughput estimates, instances, links, store capacity
    report.py     the plan as text

Every formula and its source is in docs/planning.md.
"""

from __future__ import annotations


class PlanError(ValueError):
    """The inputs cannot make a plan (a request that cannot fit, a throughput of 0, a model the
    planner cannot read). The message is one line meant for the operator."""
