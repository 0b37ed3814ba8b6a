"""Which kernel runs: probed once per shape, chosen by name, or dispatched per block.

Why apart: choosing needs every backend, and no backend needs the choice. On CUDA each
candidate (``flash_attn`` when importable, then PyTorch's cuDNN and flash) is probed once
with a tiny fwd+bwd against the reference and skipped if it fails (``_cuda_kernel``);
``BandDispatch`` sends dense blocks to the fastest and band blocks to flash, which takes
windows. On CPU the CPU flash kernel runs, and the plain reference is the last resort.
"""
from __future__ import annotations

import math

import torch

from ..schedule import Block
from .cuda import CudnnAttention, FlashAttnPackage, TorchFlashAttention
from .protocol import LocalAttention, VarlenByLoop
from .reference import CpuFlashAttention, ReferenceAttention


def _agrees(got: tuple, ref: tuple) -> bool:
    """(out, lse, dq, dk, dv) against the reference's, at bf16-level tolerances."""
    out, lse, *grads = got
    r_out, r_lse, *r_grads = ref
    ok = torch.allclose(lse, r_lse, atol=2e-2) and torch.allclose(
        out.float(), r_out.float(), atol=3e-2)
    for g, rg in zip(grads, r_grads):
        ok = ok and g.shape == rg.shape and torch.allclose(g.float(), rg.float(),
                                                           atol=5e-2, rtol=5e-2)
    return bool(ok)


def _probe(kernel: LocalAttention, dtype: torch.dtype, hq: int, hkv: int, d: int,
           device: torch.device, band: bool = False) -> bool:
    """Run a tiny causal (or band) fwd+bwd against the reference; False if anything fails."""
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        shape_q, shape_k = (1, 128, hq, d), (1, 128, hkv, d)
        q, k, v, do = (torch.randn(s, generator=gen).to(device, dtype)
                       for s in (shape_q, shape_k, shape_k, shape_q))
        blk = Block(0, 128, 0, 128, *(("band", -40, 3) if band else ("causal",)))
        scale = d ** -0.5
        ref = ReferenceAttention()
        out, lse = kernel.forward(q, k, v, blk, scale)
        r_out, r_lse = ref.forward(q, k, v, blk, scale)
        grads = kernel.backward(do, q, k, v, r_out, r_lse, blk, scale)
        r_grads = ref.backward(do, q, k, v, r_out, r_lse, blk, scale)
        return _agrees((out, lse, *grads), (r_out, r_lse, *r_grads))
    except Exception:  # an op missing or refusing this shape/arch: try the next backend
        return False


class BandDispatch(VarlenByLoop):
    """Dense blocks (full, causal) to the fastest kernel; band blocks, and blocks too small
    for cuDNN (it refuses s_q = s_kv = 1, which tiny padded documents produce), to the
    kernel that takes windows and any size."""

    SMALL = 128

    def __init__(self, dense: LocalAttention, band: LocalAttention,
                 varlen: LocalAttention | None = None):
        self.dense, self.band = dense, band
        self.name = dense.name if dense is band else f"{dense.name}+{band.name}"
        # A one-launch varlen kernel (checked by the probe), else the loop of our own calls.
        self.varlen = varlen
        if varlen is not None:
            self.name += f", varlen {varlen.name}"
            # The same kernel for both: pack everything; else big blocks go dense.
            self.dense_min_area = (float("inf") if varlen is dense
                                   else VARLEN_DENSE_MIN_AREA)

    def _pick(self, block: Block) -> LocalAttention:
        small = min(block.q_stop - block.q_start, block.k_stop - block.k_start) < self.SMALL
        return self.band if block.kind == "band" or small else self.dense

    def forward(self, q, k, v, block, scale):
        return self._pick(block).forward(q, k, v, block, scale)

    def backward(self, dout, q, k, v, out, lse, block, scale):
        return self._pick(block).backward(dout, q, k, v, out, lse, block, scale)

    def forward_varlen(self, q, k, v, call, scale):
        if self.varlen is None:
            return super().forward_varlen(q, k, v, call, scale)
        return self.varlen.forward_varlen(q, k, v, call, scale)

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        if self.varlen is None:
            return super().backward_varlen(dout, q, k, v, out, lse, call, scale)
        return self.varlen.backward_varlen(dout, q, k, v, out, lse, call, scale)


# From this many visible pairs a block runs faster alone on the dense kernel (cuDNN, ~550
# TFLOP/s fwd+bwd on H200) than inside a varlen flash call (~325): the launch it saves
# (~20-50 us) is worth less than the slower kernel costs above ~1.5K x 1.5K pairs.
VARLEN_DENSE_MIN_AREA = float(2 ** 21)


def _probe_varlen(kernel: LocalAttention, dtype: torch.dtype, hq: int, hkv: int, d: int,
                  device: torch.device) -> bool:
    """Its varlen form against the reference's loop, on three causal sequences of different
    lengths, given the reference's lse (as the ring's backward gives the merged lse)."""
    from ..varlen import plan_calls
    try:
        gen = torch.Generator(device="cpu").manual_seed(1)
        lens = (37, 128, 90)
        blocks, a = [], 0
        for n in lens:
            blocks.append(Block(a, a + n, a, a + n, "causal"))
            a += n
        (call,) = plan_calls(blocks, varlen=True, dense_min_area=float("inf"))
        q, do = (torch.randn(a, hq, d, generator=gen).to(device, dtype) for _ in range(2))
        k, v = (torch.randn(a, hkv, d, generator=gen).to(device, dtype) for _ in range(2))
        scale, ref = d ** -0.5, ReferenceAttention()
        out, lse = kernel.forward_varlen(q, k, v, call, scale)
        r_out, r_lse = ref.forward_varlen(q, k, v, call, scale)
        grads = kernel.backward_varlen(do, q, k, v, r_out, r_lse, call, scale)
        r_grads = ref.backward_varlen(do, q, k, v, r_out, r_lse, call, scale)
        return _agrees((out, lse, *grads), (r_out, r_lse, *r_grads))
    except Exception:  # an op missing or refusing this shape/arch: no one-launch varlen
        return False


_CHOSEN: dict[tuple, LocalAttention] = {}  # (dtype, hq, hkv, d, device index) -> kernel


def _cuda_kernel(dtype: torch.dtype, hq: int, hkv: int, d: int, index: int) -> LocalAttention:
    """The kernel chosen for this head shape on this GPU, probed once.

    Probing runs small kernels and copies from the host: inside a CUDA graph capture it
    would fail and fall back to the slow reference kernel without a word, so a capture that
    reaches a shape never probed raises instead (run the call once before capturing)."""
    key = (dtype, hq, hkv, d, index)
    if key not in _CHOSEN:
        if torch.cuda.is_current_stream_capturing():
            raise ValueError(f"burst_attn: no kernel probed yet for {hq}:{hkv} heads of "
                             f"dim {d} in {dtype}; run the call once outside the CUDA graph "
                             f"capture first (make_graphed_callables' warm-up does)")
        _CHOSEN[key] = _probe_kernels(dtype, hq, hkv, d, torch.device("cuda", index))
    return _CHOSEN[key]


def _probe_kernels(dtype: torch.dtype, hq: int, hkv: int, d: int,
                   device: torch.device) -> LocalAttention:
    candidates: list[LocalAttention] = []
    try:
        candidates.append(FlashAttnPackage())
    except ImportError:
        pass
    # PyTorch's memory-efficient kernel is not in the chain: its backward, given an lse
    # it did not produce itself, returned wrong gradients on H200 (torch 2.11).
    candidates += [CudnnAttention(), TorchFlashAttention()]
    dense = next((c for c in candidates if _probe(c, dtype, hq, hkv, d, device)),
                 ReferenceAttention())
    # Windows and padded documents need a band: only flash (PyTorch's) expresses it.
    band = next((c for c in candidates if isinstance(c, TorchFlashAttention)
                 and _probe(c, dtype, hq, hkv, d, device, band=True)), ReferenceAttention())
    varlen = next((c for c in candidates if isinstance(c, (FlashAttnPackage, TorchFlashAttention))
                   and _probe_varlen(c, dtype, hq, hkv, d, device)), None)
    return BandDispatch(dense, band, varlen)


KERNELS = {"reference": ReferenceAttention, "cpu-flash": CpuFlashAttention,
           "cudnn": CudnnAttention, "torch-flash": TorchFlashAttention}
KERNEL_NAMES = (*sorted(KERNELS), "flash-attn")  # what ``kernel=`` may force


def select_kernel(q: torch.Tensor, k: torch.Tensor, name: str | None = None) -> LocalAttention:
    """The fastest working backend for these tensors, or the one ``name`` forces."""
    if name is not None:
        if name == "flash-attn":
            return FlashAttnPackage()
        if name not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNEL_NAMES}, got {name!r}")
        return KERNELS[name]()
    if q.is_cuda:
        return _cuda_kernel(q.dtype, q.shape[2], k.shape[2], q.shape[3],
                            q.device.index or 0)
    if q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return CpuFlashAttention()
    return ReferenceAttention()


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
