"""The accelerators a config can name (``cluster.gpu``): memory, MFU peak, matmul rate, profile.

Links, the attention kernel and the host's overheads are the time model's, in a profile
(``megatron_burst.decide.timing``; ``megatron-burst tune`` measures one); what is here is what the
profile does not hold.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the planner needs to know about one accelerator beyond the time model's profile
    (``megatron_burst.decide.timing``, which holds the links, the attention kernel and the host)."""

    memory_gib: float
    # Memory no tensor can use: CUDA context, NCCL buffers, allocator fragmentation.
    reserved_gib: float
    # The time model's profile for `auto` and `plan` (megatron_burst/profiles/NAME.json).
    profile: str
    # Dense bf16 datasheet peak (TFLOP/s), the denominator of MFU; None: no MFU (CPU ranks).
    peak_tflops: float | None = None
    # What large bf16 matrix multiplies achieve (TFLOP/s): the time of a layer's linears.
    matmul_tflops: float | None = None
    # GPUs in one node of this kind (HGX boards hold 8): a job that takes fewer shares it.
    node_gpus: int = 8

    @property
    def timed(self) -> bool:
        """Whether `plan` predicts times here (no for CPU ranks: the profiles are GPUs')."""
        return self.matmul_tflops is not None


# A100: 312 TFLOP/s bf16 peak, ~250 achieved by cuBLAS on large bf16 GEMMs (80%). H100 SXM
# and H200 share one chip and clocks: 989 peak; 700 is what this package measured for an
# 8192^3 bf16 GEMM on an H200 (no results file holds it; `tools.calibration` compares the step
# times built on it with the end-to-end runs in benchmarks/results/). CPU ranks have no
# profile of their own: no step time.
HARDWARE: dict[str, Hardware] = {
    "a100-80gb": Hardware(memory_gib=80, reserved_gib=6, profile="a100-ib",
                          peak_tflops=312, matmul_tflops=250),
    "h100-80gb": Hardware(memory_gib=80, reserved_gib=6, profile="a100-ib",
                          peak_tflops=989, matmul_tflops=700),
    "h200-141gb": Hardware(memory_gib=141, reserved_gib=8, profile="h200-nvlink",
                           peak_tflops=989, matmul_tflops=700),
    "cpu": Hardware(memory_gib=4, reserved_gib=0.5, profile="h200-nvlink"),
}
