"""`kvstore plan`: the formulas against figures worked out by hand and published parameter counts,
config.json reading, and bad input as one line and exit 2."""

import argparse
import json
import subprocess
import sys

import pytest

from kvstore.engines import plan
from kvstore.engines.planner import PlanError
from kvstore.engines.planner.hardware import ACCELERATORS
from kvstore.engines.planner.hf_config import shape_from_config
from kvstore.engines.planner.model import ARCHITECTURES, PRESETS
from kvstore.engines.planner.sizing import Deployment, Plan, Throughput, Workload

GIB = 1 << 30
LLAMA2_7B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def run_plan(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    assert plan.run(parser.parse_args(list(argv))) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def refused(capsys, *argv: str) -> str:
    """The one line a refused plan prints (exit 2, nothing on stdout)."""
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    assert plan.run(parser.parse_args(list(argv))) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    return out.err


def given(prefill=10000.0, decode=2000.0, stream=40.0) -> Throughput:
    return Throughput(prefill, decode, stream)


def test_7b_figures(capsys):
    shape = PRESETS["llama2-7b"]  # 32 layers, hidden 4096, fp16
    assert shape.kv_bytes_per_token == 512 * 1024  # 0.5 MiB per token
    dep = Deployment(ACCELERATORS["h100-80g"], kv_memory_bytes=80 * GIB)
    p = Plan(shape, Workload(), dep, given(), 4096)
    assert p.kv_bytes_per_request == 2 * GIB  # 4K tokens: 2 GiB
    assert p.requests_per_instance == 40
    out = run_plan(capsys, "--model", "llama2-7b", "--context", "4096")
    assert "0.50 MiB" in out and "2.00 GiB" in out
    custom = run_plan(
        capsys, "--layers", "32", "--hidden", "4096", "--heads", "32", "--dtype", "fp16", "--context", "4096"
    )
    assert "0.50 MiB" in custom and "2.00 GiB" in custom


def test_parameter_counts_match_the_published_ones():
    published = {
        "llama2-7b": 6_738_415_616,
        "llama2-70b": 68_976_648_192,
        "llama3-8b": 8_030_261_248,
        "qwen2.5-7b": 7_615_616_512,
        "mixtral-8x7b": 46_702_792_704,
    }
    assert {name: ARCHITECTURES[name].params for name in published} == published
    mixtral = ARCHITECTURES["mixtral-8x7b"]
    assert mixtral.compute_params + 2 * 32000 * 4096 == pytest.approx(12.88e9, rel=1e-3)  # 12.9B active


def test_pd_bandwidth_for_20_requests_a_second_of_4k_prompts(capsys):
    """The figure of issue 18: 20 req/s x 2 GiB of prompt KV = 40 GiB/s into the decode instances."""
    p = Plan(PRESETS["llama2-7b"], Workload(20, 4096, 256), Deployment(ACCELERATORS["h100-80g"]), given(), 4352)
    assert p.decode_read_rate == 40 * GIB and p.store_write_rate == 40 * GIB
    assert p.prefill_read_rate == 0 and p.store_capacity == 40 * GIB * 300
    assert p.transfer_s == pytest.approx(2 * GIB / 25e9)
    out = run_plan(capsys, "--request-rate", "20", "--input-tokens", "4096")
    assert "store -> decode   40.00 GiB/s" in out and "prefill -> store  40.00 GiB/s" in out


def test_prefix_hits_cut_prefill_and_store_writes_but_not_decode_loads():
    dep = Deployment(ACCELERATORS["h100-80g"], retention_s=600)
    p = Plan(PRESETS["llama3-8b"], Workload(10, 8192, 256, prefix_hit_rate=0.75), dep, given(prefill=20000), 8448)
    bpt = PRESETS["llama3-8b"].kv_bytes_per_token  # 128 KiB: 32 layers x 8 KV heads x 128 x 2 x 2
    assert bpt == 128 * 1024
    assert p.prefill_instances == 2  # ceil(10 x 8192 x 0.25 / 20000)
    assert p.store_write_rate == 10 * 2048 * bpt and p.store_capacity == 600 * 10 * 2048 * bpt
    assert p.decode_read_rate == 10 * 8192 * bpt and p.prefill_read_rate == 10 * 6144 * bpt
    assert p.prefill_link_rate == 10 * 8192 * bpt / 2  # reads the cached part, writes the rest


def test_weights_come_out_of_the_memory_before_kv():
    dep = Deployment(ACCELERATORS["h100-80g"])
    p = Plan(PRESETS["llama2-7b"], Workload(), dep, given(), 4096)
    weights = 6_738_415_616 * 2
    assert p.kv_budget == pytest.approx(81559 * 2**20 * 0.9 - weights)
    assert p.requests_per_instance == int((81559 * 2**20 * 0.9 - weights) // (2 * GIB)) == 29


def test_estimates_follow_the_model_and_the_hardware(capsys):
    small = run_plan(capsys, "--model", "llama2-7b")
    large = run_plan(capsys, "--model", "llama2-70b", "--tp", "4")
    assert "(estimated)" in small and "(given)" not in small and "MFU" in large
    w, dep7, dep70 = Workload(), Deployment(ACCELERATORS["h100-80g"]), Deployment(ACCELERATORS["h100-80g"], gpus=4)
    from kvstore.engines.planner.sizing import estimate

    t7, t70 = estimate(PRESETS["llama2-7b"], w, dep7, 2304), estimate(PRESETS["llama2-70b"], w, dep70, 2304)
    assert t70.prefill_tps / 4 < t7.prefill_tps / 8  # 10x the FLOPs a token, per GPU
    assert 1 / t7.stream_tps <= 0.05 and 1 / t70.stream_tps <= 0.05  # within the TPOT target
    h200 = estimate(PRESETS["llama2-7b"], w, Deployment(ACCELERATORS["h200"]), 2304)
    assert h200.decode_tps > t7.decode_tps  # more bandwidth and memory, more streams


def test_given_throughputs_are_used_and_labelled(capsys):
    out = run_plan(
        capsys,
        "--prefill-tps",
        "3000",
        "--decode-tps",
        "500",
        "--stream-tps",
        "50",
        "--request-rate",
        "4",
        "--context",
        "2304",
        "--model",
        "llama3-8b",
        "--kv-memory",
        "16GiB",
    )
    assert "(given)" in out
    assert "prefill           3  = ceil(8,192 / 3,000)" in out  # 4 x 2048 / 3000
    assert "decode            3  = max(rate: ceil(1,024 / 500) = 3; memory: 20.5 streams" in out
    mixed = run_plan(capsys, "--prefill-tps", "3000")
    assert "(given and estimated)" in mixed


def test_links_that_cannot_carry_the_hand_off_are_flagged(capsys):
    out = run_plan(
        capsys,
        "--request-rate",
        "20",
        "--input-tokens",
        "4096",
        "--link-gbps",
        "25",
        "--prefill-tps",
        "100000",
        "--decode-tps",
        "100000",
        "--stream-tps",
        "40",
    )
    assert "OVER" in out
    data = json.loads(
        run_plan(
            capsys,
            "--request-rate",
            "20",
            "--input-tokens",
            "4096",
            "--link-gbps",
            "25",
            "--json",
            "--prefill-tps",
            "100000",
            "--decode-tps",
            "100000",
            "--stream-tps",
            "40",
        )
    )
    assert data["links_ok"] is False and data["decode_read_rate"] == 40 * GIB


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--prefill-tps", "0"], "--prefill-tps must be a positive"),
        (["--prefill-tps", "inf", "--decode-tps", "1", "--stream-tps", "1"], "--prefill-tps must be a positive"),
        (["--context", "200000"], "does not fit"),
        (["--model", "llama2-70b"], "do not fit 1 x h100-80g"),
        (["--tpot", "0.001"], "TPOT is out of reach"),
        (["--prefix-hit-rate", "1"], "--prefix-hit-rate"),
        (["--request-rate", "0"], "must be positive"),
        (["--heads", "0"], "must be positive"),
        (["--config", "/nonexistent/config.json"], "no model config"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, says):
    assert says in refused(capsys, *argv)


def test_the_kvstore_command_exits_2_without_a_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore.cli", "plan", "--prefill-tps", "0"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.strip() == "kvstore plan: error: --prefill-tps must be a positive number of tokens/s, got 0.0"


def test_a_config_json_gives_the_presets_figures(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B_CONFIG))
    shape = shape_from_config(LLAMA2_7B_CONFIG, "llama")
    assert shape.kv_bytes_per_token == PRESETS["llama2-7b"].kv_bytes_per_token
    assert shape.params == ARCHITECTURES["llama2-7b"].params
    out = run_plan(capsys, "--config", str(tmp_path), "--context", "4096")  # a directory works too
    assert "0.50 MiB" in out and "2.00 GiB" in out and "6.74 B parameters" in out
    gqa = {**LLAMA2_7B_CONFIG, "num_key_value_heads": 8, "head_dim": 64, "torch_dtype": "float32"}
    assert shape_from_config(gqa, "gqa").kv_bytes_per_token == 32 * 2 * 8 * 64 * 4
    vlm = {"model_type": "llava", "text_config": LLAMA2_7B_CONFIG}
    assert shape_from_config(vlm, "vlm").kv_bytes_per_token == 512 * 1024


def test_mla_configs_cache_one_latent_a_token_and_need_their_parameter_count(tmp_path, capsys):
    deepseek = {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "moe_intermediate_size": 2048,
        "vocab_size": 129280,
        "intermediate_size": 18432,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(deepseek))
    assert shape_from_config(deepseek, "ds").kv_bytes_per_token == 61 * 576 * 2  # 68.6 KiB, not 2 x 128 heads
    assert "--params" in refused(capsys, "--config", str(path))
    out = run_plan(
        capsys,
        "--config",
        str(path),
        "--tp",
        "8",
        "--gpu",
        "h200",
        "--params",
        "671B",
        "--active-params",
        "37B",
        "--weight-dtype",
        "fp8",
    )
    assert "68.62 KiB" in out and "671.00 B parameters" in out


@pytest.mark.parametrize(
    "config, says",
    [
        ({"model_type": "jamba", "num_hidden_layers": 32, "mamba_d_state": 16, "attn_layer_period": 8}, "per-token KV"),
        ({**LLAMA2_7B_CONFIG, "layer_types": ["sliding_attention", "full_attention"]}, "mixes layer types"),
        ({"model_type": "llama", "hidden_size": 4096}, "num_hidden_layers"),
        ({**LLAMA2_7B_CONFIG, "torch_dtype": "float4"}, "unknown dtype"),
    ],
)
def test_configs_the_planner_cannot_describe_are_refused(config, says):
    with pytest.raises(PlanError, match=says):
        shape_from_config(config, "m")


def test_a_sliding_window_shorter_than_the_context_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA2_7B_CONFIG, "sliding_window": 4096}))
    assert "sliding window" in refused(capsys, "--config", str(path), "--context", "8192")
    assert "0.50 MiB" in run_plan(capsys, "--config", str(path), "--context", "4096")
    path.write_text("{not json")
    assert "cannot read" in refused(capsys, "--config", str(path))


def test_measured_on_the_reference_engine(capsys):
    # SLOs any host meets: this checks the measured path and the model's KV size, not this host's
    # speed (under load a decode step passed the default 25 ms TPOT and no fleet met the SLOs).
    slos = ("--slo-tpot", "10", "--slo-ttft", "600", "--batches", "1,4")
    out = run_plan(capsys, "--model", "reference", "--measure", "--memory", "1GiB", *slos)
    assert "measured on the reference engine" in out and "4.00 KiB" in out
