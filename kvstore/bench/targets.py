"""The bench's targets, as data: targets.toml says what to compare with what; this module finds
both in a run's Results and judges them (kvstore.bench.results.TargetCheck). A target whose value
or reference the run did not measure comes back as NotJudged, with the reason."""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.bench.fmt import fmt_size, fmt_spread
from kvstore.bench.results import Results, Spread, TargetCheck
from kvstore.config import parse_size

TARGETS_FILE = Path(__file__).with_name("targets.toml")
Selector = dict[str, Any]
_LOWER_IS_BETTER_UNITS = ("us", "s", "B/block")


@dataclass(frozen=True)
class Target:
    name: str
    value: Selector
    reference: Selector
    need: float
    higher_is_better: bool = True
    issue: int = 0


@dataclass(frozen=True)
class NotJudged:
    name: str
    reason: str


@dataclass(frozen=True)
class _Match:
    value: Spread
    unit: str
    fields: dict[str, Any] = field(default_factory=dict)  # what it matched: path, op, size, ...
    text: str = ""


def load(path: Path = TARGETS_FILE) -> list[Target]:
    """Every target of the file, lists in the value selector expanded."""
    with open(path, "rb") as fh:
        doc = tomllib.load(fh)
    out = []
    for raw in doc.get("target", []):
        better = raw.get("better", "higher")
        if better not in ("higher", "lower"):
            raise ValueError(f"target {raw.get('name')!r}: better must be 'higher' or 'lower'")
        for value in _expand(raw["value"]):
            out.append(
                Target(
                    raw["name"],
                    value,
                    dict(raw["reference"]),
                    float(raw["need"]),
                    better == "higher",
                    raw.get("issue", 0),
                )
            )
    return out


def _expand(selector: Selector) -> Iterator[Selector]:
    listed = [k for k, v in selector.items() if isinstance(v, list)]
    for combo in itertools.product(*(selector[k] for k in listed)):
        yield {**selector, **dict(zip(listed, combo))}


def judge(results: Results, targets: list[Target] | None = None) -> tuple[list[TargetCheck], list[NotJudged]]:
    checks: list[TargetCheck] = []
    missing: list[NotJudged] = []
    for target in load() if targets is None else targets:
        if target.value["kind"] == "tiers":
            checks += _tier_checks(results, target)
            continue
        values = _find(results, target.value, {})
        if not values:
            missing.append(
                NotJudged(_name(target, target.value), f"not measured in this run: {_describe(target.value)}")
            )
            continue
        for match in values:
            name = _name(target, {**target.value, **match.fields})
            refs = _find(results, target.reference, match.fields)
            if not refs:
                missing.append(
                    NotJudged(name, f"no reference in this run: {_describe(target.reference, match.fields)}")
                )
                continue
            ref = refs[0]
            checks.append(
                TargetCheck(
                    name,
                    match.unit,
                    match.value,
                    ref.value,
                    ref.text,
                    target.need,
                    target.higher_is_better,
                    target.issue,
                )
            )
    return checks, missing


class _KeepMissing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _name(target: Target, fields: Selector) -> str:
    """The target's name with what it matched filled in ("best" and "*" stay placeholders)."""
    shown = _KeepMissing({k: v for k, v in fields.items() if isinstance(v, str | int) and v not in ("best", "*")})
    if "size" in shown:
        shown["size"] = fmt_size(_size(shown["size"]))
    if isinstance(shown.get("batch"), int):
        shown["batch"] = "single" if shown["batch"] == 1 else f"batched x{shown['batch']}"
    return target.name.format_map(shown)


def _size(value: Any) -> int:
    return value if isinstance(value, int) else parse_size(str(value))


def _resolve(selector: Selector, context: Selector) -> Selector:
    return {k: context.get(k) if v == "same" else v for k, v in selector.items()}


def _describe(selector: Selector, context: Selector | None = None) -> str:
    sel = _resolve(selector, context or {})
    return " ".join(f"{k}={v}" for k, v in sel.items())


def _batch_ok(want: Any, batch: int) -> bool:
    if want in (None, "*"):
        return True
    if want == "single":
        return batch == 1
    if want == "batched":
        return batch > 1
    return int(want) == batch


def _kvstore_paths(results: Results) -> set[str]:
    peers = {b.path for b in results.baselines}
    return ({t.path for t in results.throughput} | {lat.path for lat in results.latency}) - peers


def _best(matches: list[_Match], higher_is_better: bool) -> list[_Match]:
    if not matches:
        return []
    pick = max if higher_is_better else min
    return [pick(matches, key=lambda m: m.value.median)]


def _find(results: Results, selector: Selector, context: Selector) -> list[_Match]:
    sel = _resolve(selector, context)
    kind = sel["kind"]
    finder = _FINDERS.get(kind)
    if finder is None:
        raise ValueError(f"unknown target kind {kind!r}")
    if sel.get("path") == "best":
        kv = _kvstore_paths(results)
        found = [m for m in finder(results, {**sel, "path": "*"}) if m.fields.get("path") in kv]
        return _best(found, higher_is_better=found[0].unit not in _LOWER_IS_BETTER_UNITS if found else True)
    return finder(results, sel)


def _path_ok(want: Any, path: str) -> bool:
    return want in (None, "*") or want == path


def _throughput(results: Results, sel: Selector) -> list[_Match]:
    metric = sel.get("metric", "gbps")
    unit = "GB/s" if metric == "gbps" else "ops/s"
    out = []
    for t in results.throughput:
        if (
            _path_ok(sel.get("path"), t.path)
            and t.op == sel.get("op", t.op)
            and t.size == _size(sel["size"])
            and _batch_ok(sel.get("batch"), t.batch)
        ):
            value: Spread = getattr(t, metric)
            fields = {"path": t.path, "op": t.op, "size": t.size, "batch": t.batch}
            label = "single" if t.batch == 1 else f"x{t.batch}"
            out.append(
                _Match(
                    value, unit, fields, f"{t.path} {t.op} {fmt_size(t.size)} {label} {fmt_spread(value, unit)} {unit}"
                )
            )
    return out


def _latency(results: Results, sel: Selector) -> list[_Match]:
    pct = sel.get("pct", "p50")
    out = []
    for lat in results.latency:
        if _path_ok(sel.get("path"), lat.path) and lat.op == sel["op"] and lat.size == _size(sel["size"]):
            value: Spread = getattr(lat, f"{pct}_us")
            fields = {"path": lat.path, "op": lat.op, "size": lat.size}
            text = f"{lat.path} {lat.op} {fmt_size(lat.size)} {pct} {fmt_spread(value, 'us')} us"
            out.append(_Match(value, "us", fields, text))
    return out


def _cpu(results: Results, sel: Selector) -> list[_Match]:
    out = []
    for c in results.server_cpu:
        if _path_ok(sel.get("path"), c.path) and c.op == sel["op"] and c.size == _size(sel["size"]):
            fields = {"path": c.path, "op": c.op, "size": c.size}
            out.append(_Match(c.us_per_op, "us", fields, f"{c.processes} {fmt_spread(c.us_per_op, 'us')} us"))
    return out


def _prefix(results: Results, sel: Selector) -> list[_Match]:
    return [
        _Match(
            p.keys_per_s,
            "keys/s",
            {"path": p.path},
            f"{p.path} {p.batch} keys/call {fmt_spread(p.keys_per_s, 'keys/s')} keys/s",
        )
        for p in results.prefix
        if _path_ok(sel.get("path"), p.path)
    ]


def _meta_memory(results: Results, sel: Selector) -> list[_Match]:
    return [_Match(Spread((m.bytes_per_block,)), "B/block", {"blocks": m.blocks}) for m in results.meta_memory[:1]]


def _engine(results: Results, sel: Selector) -> list[_Match]:
    metric = sel["metric"]
    unit = "GB/s" if metric.endswith("gbps") else "s"
    out = []
    for e in results.engine:
        value = getattr(e, metric)
        if value is not None and sel.get("what") in ("*", e.what):
            out.append(_Match(value, unit, {"what": e.what}, f"{metric} {fmt_spread(value, unit)} {unit}"))
    return out


def _ceiling(results: Results, sel: Selector) -> list[_Match]:
    c = results.ceiling(sel["name"], _size(sel["size"]))
    if c is None:
        return []
    return [_Match(c.gbps, "GB/s", {}, f"{c.name} {fmt_size(c.size)} {fmt_spread(c.gbps, 'GB/s')} GB/s")]


def _absolute(results: Results, sel: Selector) -> list[_Match]:
    value = float(sel["value"])
    return [_Match(Spread((value,)), sel["unit"], {}, f"{value:g} {sel['unit']}")]


_FINDERS = {
    "throughput": _throughput,
    "latency": _latency,
    "cpu": _cpu,
    "prefix": _prefix,
    "meta_memory": _meta_memory,
    "engine": _engine,
    "ceiling": _ceiling,
    "absolute": _absolute,
}


def _tier_checks(results: Results, target: Target) -> list[TargetCheck]:
    """The SSD tier's rows (kvstore.bench.tiers), each against the raw-disk figure it names."""
    checks = []
    for tier in results.tiers:
        for what, gbps, against, ratio in tier.comparisons():
            ceiling = gbps / ratio if ratio else 0.0
            checks.append(
                TargetCheck(
                    f"{what} vs {against.split(' ', 2)[1]}",
                    "GB/s",
                    Spread((gbps,)),
                    Spread((ceiling,)),
                    against,
                    target.need,
                )
            )
    return checks
