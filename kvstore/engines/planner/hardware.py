"""Accelerators the planner knows: memory, dense 16-bit tensor FLOP/s, memory bandwidth.

Figures are the vendor's data-sheet peaks (dense, no sparsity); memory is what `nvidia-smi`
reports as the total. Any of them can be overridden (`--gpu-memory`, `--gpu-tflops`,
`--gpu-bandwidth`), and a planner run says which it used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvstore.engines.planner import PlanError


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bytes: int
    flops: float  # dense BF16/FP16 tensor FLOP/s
    memory_bandwidth: float  # bytes/s
    source: str = ""

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.flops <= 0 or self.memory_bandwidth <= 0:
            raise PlanError(f"{self.name}: memory, FLOP/s and memory bandwidth must be positive")

    def overridden(self, memory_bytes: int | None, flops: float | None, bandwidth: float | None) -> Accelerator:
        """This accelerator with the figures given (None: keep the data sheet's)."""
        if memory_bytes is None and flops is None and bandwidth is None:
            return self
        return replace(
            self,
            name=f"{self.name} (modified)",
            source="given",
            memory_bytes=self.memory_bytes if memory_bytes is None else memory_bytes,
            flops=self.flops if flops is None else flops,
            memory_bandwidth=self.memory_bandwidth if bandwidth is None else bandwidth,
        )


ACCELERATORS = {
    a.name: a
    for a in [
        Accelerator("a100-80g", 81920 << 20, 312e12, 2.039e12, "NVIDIA A100 80GB SXM data sheet"),
        Accelerator("h100-80g", 81559 << 20, 989e12, 3.35e12, "NVIDIA H100 SXM data sheet"),
        Accelerator("h200", 143771 << 20, 989e12, 4.8e12, "NVIDIA H200 SXM data sheet"),
    ]
}
