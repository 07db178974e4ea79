"""Start vLLM for the tests: `tests.vllm.instance` processes (one JSON command, one JSON answer),
and vLLM's own OpenAI server (`ApiServer`)."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class Instance:
    def __init__(
        self, name: str, settings: dict[str, Any], timeout: float = 180.0, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.lines: list[str] = []
        self._results: queue.Queue[str | None] = queue.Queue()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.vllm.instance", json.dumps(settings)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                **(env or {}),
            },
        )
        threading.Thread(target=self._pump, name=f"pump-{name}", daemon=True).start()
        self._wait("kvstore ready:", timeout)

    def _pump(self) -> None:
        assert self.popen.stdout is not None  # stdout=PIPE
        for line in self.popen.stdout:
            self.lines.append(line)
            if line.startswith("RESULT ") or line.startswith("kvstore ready:"):
                self._results.put(line)
        self._results.put(None)

    def _wait(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise TimeoutError(f"{self.name}: no {prefix!r} in {timeout}s:\n{self.log()[-6000:]}") from None
            if line is None:
                raise RuntimeError(f"{self.name} exited ({self.popen.wait()}):\n{self.log()[-6000:]}")
            if line.startswith(prefix):
                return line[len(prefix) :]

    def call(self, timeout: float = 180.0, **cmd: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None  # stdin=PIPE
        self.popen.stdin.write(json.dumps(cmd) + "\n")
        self.popen.stdin.flush()
        return json.loads(self._wait("RESULT ", timeout))

    def generate(
        self, prompts: list[list[int]], max_tokens: int = 16, timeout: float = 180.0, **kw: Any
    ) -> dict[str, Any]:
        return self.call(timeout, op="generate", prompts=prompts, max_tokens=max_tokens, **kw)

    def log(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                assert self.popen.stdin is not None  # stdin=PIPE
                self.popen.stdin.write('{"op": "exit"}\n')
                self.popen.stdin.flush()
                self.popen.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


def kv_config(role: str, meta: str, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore.engines.vllm",
        "kv_role": role,
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"meta": meta, **extra},
    }


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before by this process. vLLM's server cannot report
    the port it bound to, so it is chosen here."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class ApiServer:
    """`python -m vllm.entrypoints.openai.api_server` over a local model, as the README deploys it
    (default multiprocess mode), with a small KV cache; its log goes to `log_dir/NAME.log`."""

    def __init__(
        self,
        name: str,
        model: str,
        kv: dict[str, Any] | None,
        log_dir: Path,
        kv_cache_bytes: int = 64 << 20,
        kv_events: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = Path(log_dir) / f"{name}.log"
        self._args = [
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--dtype",
            "float32",
            "--block-size",
            "32",
            "--max-model-len",
            "4096",
            "--kv-cache-memory-bytes",
            str(kv_cache_bytes),
            "--enforce-eager",
        ]
        if kv is not None:
            self._args += ["--kv-transfer-config", json.dumps(kv)]
        self.events: tuple[str, str] | None = None
        if kv_events:  # vLLM's KV events, as a router consumes them (ports chosen here, like the server's)
            pub, replay = free_port(), free_port()
            self.events = (f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
            self._args += [
                "--kv-events-config",
                json.dumps(
                    {
                        "enable_kv_cache_events": True,
                        "publisher": "zmq",
                        "endpoint": f"tcp://*:{pub}",
                        "replay_endpoint": f"tcp://*:{replay}",
                    }
                ),
            ]
        self._env = env or {}
        self._launch()

    def _launch(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(self.log_path, "w") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", str(self.port), *self._args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **self._env},
            )

    def wait_ready(self, timeout: float = 300.0, relaunches: int = 2) -> None:
        """Poll /health until the server answers (vLLM prints no readiness line of its own). The
        port was free when chosen but vLLM binds it seconds later; if another process took it
        meanwhile, start again on a new one."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                if relaunches > 0 and "address already in use" in self.log().lower():
                    relaunches -= 1
                    self._launch()
                    continue
                raise RuntimeError(f"vLLM server exited ({self.popen.returncode}):\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polling readiness, not sleeping for luck
        raise TimeoutError(f"vLLM server not ready in {timeout}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
