"""A plan as the text `kvstore plan` prints: each figure with the inputs it came from, and every
assumption named with the flag that changes it."""

from __future__ import annotations

from kvstore.engines.planner.sizing import Plan


def human_bytes(n: float) -> str:
    """In the largest unit that reads as at least 0.5 (a 7B model's token is "0.50 MiB")."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size / 2:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def rate(n: float) -> str:
    return f"{human_bytes(n)}/s"


def _count(n: float | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def format_plan(p: Plan) -> str:
    m, w, d, t = p.model, p.workload, p.deployment, p.throughput
    a = d.accelerator
    link = d.link_bytes_per_s
    weights = m.weights_bytes
    lines = [
        f"model {m.name}: {m.describe()}; {_count(m.params)} parameters"
        + (f" ({human_bytes(weights)} of weights at {m.weight_bytes} B each)" if weights else ""),
        f"  KV per token      {human_bytes(m.kv_bytes_per_token)} ({m.kv_bytes_per_token:,} B)",
        f"  KV per request    {human_bytes(p.kv_bytes_per_request)} ({p.context_tokens} tokens; "
        f"its prompt's {w.input_tokens}: {human_bytes(p.prompt_kv_bytes)})",
        f"instance: {d.gpus} x {a.name} ({human_bytes(a.memory_bytes)}, {a.flops / 1e12:,.0f} TFLOP/s, "
        f"{a.memory_bandwidth / 1e12:.2f} TB/s; --gpu, --tp)",
        f"  usable memory     {human_bytes(d.usable_memory)} (x {d.memory_utilization:.2f}, --memory-utilization)",
    ]
    if d.kv_memory_bytes is not None:
        lines.append(f"  KV cache          {human_bytes(p.kv_budget)} (given, --kv-memory)")
    else:
        lines.append(
            f"  KV cache          {human_bytes(p.kv_budget)} = usable memory - {human_bytes(weights or 0)} of weights"
        )
    lines += [
        f"  fits              {p.requests_per_instance} requests of {p.context_tokens} tokens at once",
        f"workload: {w.request_rate:g} req/s x ({w.input_tokens} in + {w.output_tokens} out) tokens, "
        f"prefix hit rate {w.prefix_hit_rate:.0%} = {w.computed_input_rate:,.0f} prompt tokens/s to compute, "
        f"{w.output_token_rate:,.0f} output tokens/s",
        f"throughput per instance ({t.source}):",
        f"  prefill           {t.prefill_tps:,.0f} tokens/s" + (f"  = {t.prefill_how}" if t.prefill_how else ""),
        f"  decode            {t.decode_tps:,.0f} tokens/s, {t.stream_tps:,.1f} per stream "
        f"(TPOT {1e3 / t.stream_tps:.1f} ms)" + (f"  = {t.decode_how}" if t.decode_how else ""),
        "instances",
        f"  prefill           {p.prefill_instances}  = ceil({w.computed_input_rate:,.0f} / {t.prefill_tps:,.0f})",
        f"  decode            {p.decode_instances}  = max(rate: ceil({w.output_token_rate:,.0f} / "
        f"{t.decode_tps:,.0f}) = {p.decode_instances_by_rate}; memory: {p.concurrent_decodes:,.1f} streams at "
        f"once / {p.requests_per_instance} = {p.decode_instances_by_memory})",
        f"KV traffic (the PD hand-off through kvstore; links of {link * 8 / 1e9:,.0f} Gbit/s, --link-gbps)",
        f"  prefill -> store  {rate(p.store_write_rate)} (new blocks)"
        + (f", store -> prefill {rate(p.prefill_read_rate)} (cached prefixes)" if p.prefill_read_rate else ""),
        f"  store -> decode   {rate(p.decode_read_rate)} (every prompt's KV)",
        f"  per instance      prefill {rate(p.prefill_link_rate)} ({p.prefill_link_rate / link:.0%} of a link), "
        f"decode {rate(p.decode_link_rate)} ({p.decode_link_rate / link:.0%})  "
        + ("ok" if p.links_ok else "OVER: more instances, faster links, or fewer bytes (--dtype fp8)"),
        f"  store hosts       {rate(p.store_traffic)} in and out = {p.store_links} link(s) of that speed",
        f"  per request       {human_bytes(p.prompt_kv_bytes)} in {p.transfer_s * 1e3:,.0f} ms over one link; "
        f"prefill {p.prefill_s * 1e3:,.0f} ms -> TTFT about {p.ttft_estimate_s * 1e3:,.0f} ms unloaded "
        f"({'within' if p.ttft_estimate_s <= d.ttft_s else 'OVER'} the {d.ttft_s:g} s target, --ttft)",
        f"store: {human_bytes(p.store_capacity)} keeps {d.retention_s:g} s of new KV (--retention) at "
        f"{rate(p.store_write_rate)}",
    ]
    return "\n".join(lines)
