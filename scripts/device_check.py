"""The GPU checks of issue 19 in one run (started by scripts/device_check.sh; docs/gpu.md).

Sections, in order, each in its own process under its own time limit, so one that fails, hangs or
crashes is reported and the next still runs:

    env        the machine, the device, the packages
    tests      pytest -m gpu: the GPU segment, CUDA tensors to and from every tier, the tier stack,
               and the conformance suite over the GPU tier (on a CPU dry run: the same tests on the
               GPU segment's host stand-in, and the gpu-marked ones collected and skipped)
    copies     get_into a CUDA tensor from the GPU tier and from DRAM, against device-to-device,
               pinned and pageable host-to-device copies and memcpy (kvstore/bench/gpu.py)
    ttft       the reference model at ~1B parameters, bf16, on the GPU: decode-side TTFT with KV
               from the store (DRAM tier, GPU tier) against recompute, 2K / 8K / 32K tokens
               (benchmarks/engines/ttft.py; dry run: the tiny config, short prompts, on the CPU)
    metascale  the sharded-metadata scaling bench (python -m benchmarks.sharding) with 1, 2, 4, 8
               shards and 12 client processes: CPU per call, aggregate calls/s, match_prefix p50
    vllm_tier  kvstore as vLLM's offloading tier (tests/vllm/test_tier*.py; with CUDA and vLLM's
               CUDA build, two vLLM instances sharing KV through it with real GPU copies)

Everything goes to one JSON file, rewritten after each section: OUT/device_check.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("env", "tests", "copies", "ttft", "metascale", "vllm_tier")
CAPS_S = {"env": 60, "tests": 240, "copies": 120, "ttft": 240, "metascale": 150, "vllm_tier": 180}
# issue 15's scaling bench
META_SCALING = ["-m", "benchmarks.sharding", "--shards", "1,2,4,8", "--rounds", "3", "--clients", "12"]
META_SCALING += ["--seconds", "2", "--calls", "300"]
GPU_TESTS = ["tests/unit", "tests/integration", "tests/conformance", "tests/engines/test_device_model.py"]
STAND_IN_TESTS = [
    "tests/unit/test_gpu_segment.py",
    "tests/unit/test_gpu_tiering.py",
    "tests/unit/test_gpu_quotas.py",
    "tests/integration/test_gpu_tier.py",
    "tests/integration/test_device_buffers.py",
    "tests/engines/test_device_model.py",
]


# -- sections (each runs in a child process and returns JSON-ready data) -------------------------


def section_env(device: str, quick: bool) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
    for name in ("grpc", "grpc_health.v1.health", "google.protobuf", "numpy", "xxhash", "pytest"):
        try:
            module = __import__(name, fromlist=["__version__"])
            out[name] = getattr(module, "__version__", "ok")
        except ImportError as exc:
            out[name] = f"MISSING: {exc}"
    out["shm_free_gib"] = round(shutil.disk_usage("/dev/shm").free / 2**30, 1) if Path("/dev/shm").is_dir() else None
    pki = os.environ.get("KVSTORE_TEST_PKI")
    out["openssl"] = shutil.which("openssl") or (
        f"missing: the TLS tests take the certificates in {pki}" if pki else "missing: the TLS tests will fail"
    )
    if shutil.which("nvidia-smi"):
        out["nvidia_smi"] = _run(["nvidia-smi", "-L"], 20).strip()
    out["commit"] = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], 10).strip() or os.environ.get("KVSTORE_COMMIT")
    return out


def section_tests(device: str, quick: bool) -> dict[str, Any]:
    runs = {"gpu_marked": ["-m", "gpu", *GPU_TESTS]}
    if device == "cpu":  # what can run here of the same paths: the GPU segment's host stand-in
        runs["host_stand_in"] = STAND_IN_TESTS[:2] if quick else STAND_IN_TESTS
        if not quick:
            runs["conformance_gpu_host"] = ["tests/conformance", "-k", "gpu-host"]
    out = {name: _pytest(args) for name, args in runs.items()}
    failed = [n for n, r in out.items() if r["returncode"] not in (0, 5)]  # 5: nothing collected
    if failed:
        raise SectionFailed(f"pytest failed: {', '.join(failed)}", out)
    return out


def section_copies(device: str, quick: bool) -> dict[str, Any]:
    from kvstore.bench import gpu

    sizes = (1 << 20, 8 << 20) if quick else (1 << 20, 64 << 20)
    out = gpu.run(device, sizes)
    if out["errors"]:
        raise SectionFailed("; ".join(out["errors"]), out)
    return out


def section_ttft(device: str, quick: bool) -> dict[str, Any]:
    import torch

    from benchmarks.engines.ttft import TtftBench
    from kvstore.bench.procs import LocalStore
    from kvstore.client import KVClient
    from kvstore.client.staging import HostStaging
    from kvstore.config import ClientConfig
    from kvstore.engines.reference.device_model import DeviceModel, llama_1b, parameter_count
    from kvstore.engines.reference.model import ModelConfig, ReferenceModel

    cuda = device == "cuda"
    config = llama_1b() if cuda else ModelConfig(max_positions=2048)
    lengths = (2048, 8192, 32768) if cuda else ((128,) if quick else (128, 512))
    block_size = 64 if cuda else 16
    kv = config.kv_bytes_per_token * sum(lengths) + (256 << 20)
    started = time.perf_counter()
    model = DeviceModel(ReferenceModel(config), torch.device(device))
    out: dict[str, Any] = {
        "model": config.name,
        "parameters": parameter_count(config),
        "dtype": config.dtype,
        "block_size": block_size,
        "model_init_s": round(time.perf_counter() - started, 1),
        "kv_bytes_per_token": config.kv_bytes_per_token,
        "results": [],
    }
    gpu_env = {} if cuda else {"KVSTORE_DAEMON_GPU_DEVICE": "-1"}
    stores: tuple[tuple[str, tuple[str, ...], dict[str, str]], ...] = (
        ("dram tier over shm", (), {}),
        ("gpu tier over tcp", ("--gpu", str(kv)), gpu_env),
    )
    for label, args, env in stores:
        dram = kv if not args else 256 << 20
        with LocalStore(dram, min(dram, 1 << 30), args, env=env) as store:
            staging = HostStaging(ClientConfig().staging_bytes, stage_cpu=not cuda)
            with KVClient(store.meta_address, ClientConfig(timeout_s=60), staging=staging) as client:
                bench = TtftBench(model, client, label, block_size)
                bench.measure(4 * block_size + 1, runs=1)  # warm-up: kernels, pinned buffers
                for n in lengths:
                    try:
                        r = bench.measure(n).summary()
                    except Exception as exc:  # noqa: BLE001 - kept with the others' figures
                        out.setdefault("errors", []).append(
                            {"prompt_tokens": n, "store": label, "error": f"{type(exc).__name__}: {exc}"}
                        )
                        continue
                    out["results"].append(r)
                    _progress(
                        f"ttft {label} {n} tokens: {r['store_ttft_ms']['median']} ms "
                        f"vs {r['recompute_ttft_ms']['median']} ms recomputed"
                    )
    if "errors" in out:
        raise SectionFailed(f"{len(out['errors'])} TTFT measurement(s) failed", out)
    return out


def section_metascale(device: str, quick: bool) -> dict[str, Any]:
    command = os.environ.get("KVSTORE_META_SCALING_CMD")  # another command to run instead
    if device == "cpu" and not command:
        raise SectionSkipped(
            "the dry run does not run issue 15's scaling bench (2 cores here: python -m benchmarks.sharding)"
        )
    args = command.split() if command else [sys.executable, *META_SCALING]
    done = run_group(args, _left())
    lines = (done.stdout + done.stderr).strip().splitlines()
    result = {"command": " ".join(args), "returncode": done.returncode, "output": lines[-80:]}
    if done.returncode:
        raise SectionFailed("the scaling script failed", result)
    return result


def section_vllm_tier(device: str, quick: bool) -> dict[str, Any]:
    """kvstore as vLLM's offloading tier; on a GPU, under vLLM's real GPU <-> CPU copies."""
    if quick:
        raise SectionSkipped("--quick leaves the vLLM tier out (tests/vllm/test_tier.py runs in the suite)")
    if importlib.util.find_spec("vllm") is None:
        raise SectionSkipped("vLLM is not installed here (its CUDA build is too big to carry to a device call)")
    tests = ["tests/vllm/test_tier.py", "tests/vllm/test_tier_lookups.py", "tests/vllm/test_tier_gpu.py"]
    result = _pytest(tests, per_test_s=300)
    if result["returncode"]:
        raise SectionFailed("the tier's tests failed", result)
    return result


def _pytest(args: list[str], per_test_s: int = 120) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--timeout", str(per_test_s), *args]
    done = run_group(cmd, _left())
    lines = (done.stdout + done.stderr).strip().splitlines() or [""]
    return {"command": " ".join(cmd[1:]), "returncode": done.returncode, "summary": lines[-1], "tail": lines[-60:]}


class SectionSkipped(Exception):
    """The section cannot run here; its message says why."""


class SectionFailed(Exception):
    """The section ran and failed; `data` is what it found."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.data = data


# -- the driver --------------------------------------------------------------------------------


_DEADLINE = [float("inf")]  # time.time() by which a section's process must be done (set by child())


def _left() -> float:
    """Seconds a section's own subprocess may run: it must end, killed with everything it started,
    a little before the driver kills the section (whose kill does not reach another group)."""
    return max(1.0, _DEADLINE[0] - time.time() - 10)


def run_group(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in its own process group; past `timeout` the whole group is killed (pytest and
    the servers it started, a section and everything under it), and the output so far returned
    with returncode -9."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n(killed after {timeout:.0f} s)"
        return subprocess.CompletedProcess(cmd, -9, stdout, stderr)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _run(cmd: list[str], timeout: float) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def child(name: str, device: str, quick: bool, path: Path, deadline: float) -> int:
    """Run one section and write {status, data|reason|error} to `path`."""
    _DEADLINE[0] = deadline
    try:
        record: dict[str, Any] = {"status": "ok", "data": globals()[f"section_{name}"](device, quick)}
    except SectionSkipped as exc:
        record = {"status": "skipped", "reason": str(exc)}
    except SectionFailed as exc:
        record = {"status": "error", "error": str(exc), "data": exc.data}
    except Exception as exc:  # noqa: BLE001 - every failure is reported, and the next section runs
        record = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc().splitlines()[-25:],
        }
    path.write_text(json.dumps(record, indent=1, default=str))
    return 0


def detect_device(force_cpu: bool) -> tuple[str, str]:
    if force_cpu:
        return "cpu", "--cpu given: CPU dry run"
    try:
        import torch
    except ImportError:
        return "cpu", "torch is not installed: CPU dry run of what needs no torch"
    if torch.cuda.is_available():
        return "cuda", f"CUDA device: {torch.cuda.get_device_name(0)}"
    return "cpu", "no CUDA device here: CPU dry run (what needs CUDA is reported as skipped)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="a CPU dry run even where CUDA is present")
    p.add_argument("--quick", action="store_true", help="smaller sizes and test selection (the dry run's own test)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "device_check_out"))
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS)}")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all sections (default 480)")
    p.add_argument("--section", help=argparse.SUPPRESS)  # internal: run one section in this process
    p.add_argument("--device", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=float("inf"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.section:
        return child(args.section, args.device, args.quick, Path(args.json), args.deadline)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(names) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    device, why = detect_device(args.cpu)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "device_check.json"
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mode": device,
        "why": why,
        "quick": args.quick,
        "sections": {},
    }
    print(f"device_check: {why}; results in {results_path}", flush=True)
    deadline = time.monotonic() + args.budget
    for name in names:
        left = deadline - time.monotonic()
        if left < 15:
            record: dict[str, Any] = {"status": "skipped", "reason": f"out of time (budget {args.budget:.0f} s)"}
        else:
            record = run_section(name, device, args.quick, min(CAPS_S[name], left))
        results["sections"][name] = record
        results_path.write_text(json.dumps(results, indent=1, default=str))
        print(
            f"[{name}] {record['status']} in {record.get('seconds', 0):.0f} s"
            f"{': ' + (record.get('reason') or record.get('error') or '') if record['status'] != 'ok' else ''}",
            flush=True,
        )
    print(summary(results), flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results["sections"].values()) else 1


def run_section(name: str, device: str, quick: bool, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"device-check-{name}-") as tmp:
        path = Path(tmp) / "record.json"
        cmd = [sys.executable, "-m", "scripts.device_check", "--section", name, "--device", device, "--json", str(path)]
        cmd += ["--deadline", str(time.time() + timeout)]
        if quick:
            cmd.append("--quick")
        done = run_group(cmd, timeout)
        sys.stderr.write(done.stderr[-4000:])
        output = (done.stdout + done.stderr).splitlines()[-40:]
        record: dict[str, Any]
        if done.returncode == -9:
            record = {"status": "timeout", "error": f"killed after {timeout:.0f} s", "output": output}
        elif path.exists():
            record = json.loads(path.read_text())
        else:
            error = f"the section's process exited with {done.returncode} and no record"
            record = {"status": "error", "error": error, "output": output}
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


def summary(results: dict[str, Any]) -> str:
    """The figures people look for first: ratios and TTFTs."""
    lines = [f"== device_check ({results['mode']}) =="]
    sections = results["sections"]
    tests = sections.get("tests", {}).get("data") or {}
    for name, run in tests.items():
        lines.append(f"tests {name}: {run['summary']}")
    if tier := sections.get("vllm_tier", {}).get("data"):
        lines.append(f"vllm_tier: {tier['summary']}")
    copies = sections.get("copies", {}).get("data") or {}
    for r in copies.get("ratios", []):
        lines.append(f"copies {r['size'] >> 20} MiB: {r['what']} / {r['against']} = {r['ratio']}")
    ttft = sections.get("ttft", {}).get("data") or {}
    for r in ttft.get("results", []):
        lines.append(
            f"ttft {r['prompt_tokens']} tokens, {r['store']}: {r['store_ttft_ms']['median']} ms from the "
            f"store vs {r['recompute_ttft_ms']['median']} ms recomputed (x{r['speedup']}), "
            f"same first token: {r['same_first_token']}"
        )
    for name, record in sections.items():
        if record["status"] != "ok":
            lines.append(f"{name}: {record['status']}: {record.get('reason') or record.get('error')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
