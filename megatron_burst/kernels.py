"""Local attention kernels behind one small protocol (BurstAttention's LAO).

Every backend computes attention for one ``Block`` of the ring schedule:

    forward(q, k, v, block, scale)  -> (out, lse)
    backward(dout, q, k, v, out, lse, block, scale) -> (dq, dk, dv)

and for many blocks at once, packed back to back (``varlen.KernelCall``; tensors
[total, h, d], lse [h, total]):

    forward_varlen(q, k, v, call, scale) -> (out, lse)
    backward_varlen(dout, q, k, v, out, lse, call, scale) -> (dq, dk, dv)

PyTorch's flash kernel (and flash-attn's) do the varlen form in one launch; every other
backend does it by a loop of its own dense calls (``VarlenByLoop``), which is also how the
CPU tests exercise the packing. ``dense_min_area`` tells ``varlen.plan_calls`` from which
block size a dense call beats the varlen kernel.

Tensors are ``[b, s, h, d]`` views (bshd; sbhd inputs arrive as strided views, never
copied). K/V may have fewer heads than Q (GQA/MQA). ``lse`` is fp32 ``[b, hq, s]``.
``backward`` receives the *final* (merged) ``out`` and ``lse`` of the whole ring, so each
block's gradients are exact pieces of the global gradient. It uses ``out`` only for the
row sums ``delta = rowsum(dout * out)``, which is what lets the burst backward send delta
instead of O (see ``surrogate_out``).

Backends: ``flash_attn`` (the package, when importable), PyTorch's built-in CUDA kernels
(cuDNN, then flash: each is probed once and skipped if it fails; band blocks go to
flash, which takes windows), the CPU flash kernel, and a plain PyTorch reference used by
the tests and as the last resort.
"""
from __future__ import annotations

import functools
import math
from typing import Protocol

import torch

from .schedule import Block


class LocalAttention(Protocol):
    name: str
    dense_min_area: float

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: Block,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, block: Block,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def forward_varlen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward_varlen(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, call,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def _sequences(call):
    """(query slice, key slice, the block as a local block) of each packed sequence."""
    for i, blk in enumerate(call.blocks):
        n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
        yield (slice(call.cu_q[i], call.cu_q[i + 1]), slice(call.cu_k[i], call.cu_k[i + 1]),
               Block(0, n, 0, m, blk.kind, blk.lo, blk.hi))


class VarlenByLoop:
    """The varlen form by one dense call per packed sequence (CPU, and any fallback)."""

    dense_min_area = float("inf")  # no faster varlen kernel here: pack everything

    def forward_varlen(self, q, k, v, call, scale):
        outs, lses = [], []
        for qs, ks, blk in _sequences(call):
            o, lse = self.forward(q[None, qs], k[None, ks], v[None, ks], blk, scale)
            outs.append(o[0])
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, dim=1)

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        grads = [self.backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks],
                               out[None, qs], lse[None, :, qs], blk, scale)
                 for qs, ks, blk in _sequences(call)]
        return tuple(torch.cat([g[i][0] for g in grads]) for i in range(3))


def _lse_dtype(lse: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """lse is fp32, or fp64 for fp64 inputs."""
    return lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _heads(t: torch.Tensor) -> torch.Tensor:
    """bshd view -> bhsd view (no copy)."""
    return t.transpose(1, 2)


def visible(block: Block, device: torch.device) -> torch.Tensor:
    """[n, m] bool: which (query, key) pairs of a 'causal' or 'band' block are visible.

    O(n*m) for one block: used by the CPU and reference kernels, which have no band
    support of their own, and never by the CUDA fast paths.
    """
    n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
    lo, hi = (-(n - 1), 0) if block.kind == "causal" else (block.lo, block.hi)
    diff = torch.arange(m, device=device)[None, :] - torch.arange(n, device=device)[:, None]
    return (diff >= lo) & (diff <= hi)


def flash_window(block: Block) -> tuple[int, int]:
    """(left, right) for flash-attn's bottom-right-aligned window that equals the band.

    Flash aligns query i with key i + m - n. Blocks are trimmed so that both values are
    >= 0 (schedule.py: the last row and the last column each see something).
    """
    n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
    return (m - n) - block.lo, block.hi - (m - n)


def surrogate_out(dout: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """A tensor O' with rowsum(dout * O') == delta, built locally from dout and delta.

    Flash-style backward kernels read O only to form delta = rowsum(dO * O). The burst
    backward ships delta (hq fp32 scalars per token) instead of O (hq*d elements), and
    rebuilds an O' with the same row sums: O' = dO * delta / |dO|^2. Every term of the
    kernel's sum dO_i * O'_i has the same sign, so the rebuilt delta has no cancellation
    error, and |O'| <= |O| by Cauchy-Schwarz, so it cannot overflow. Rows with dO = 0 give
    O' = 0, which is exact (their delta is 0 too).
    dout: [b, s, h, d]; delta: [b, h, s] fp32.
    """
    # Two passes over dout and no fp32 copy of it: the norm reduces in fp32 as it reads,
    # and the product is computed in fp32 and rounded once as it is written.
    norm2 = torch.linalg.vector_norm(dout, dim=-1, dtype=delta.dtype).square_()
    coef = torch.where(norm2 > 0, delta.transpose(1, 2) / norm2.clamp_min(1e-30),
                       torch.zeros_like(norm2))
    return torch.mul(dout, coef.unsqueeze(-1), out=torch.empty_like(dout))


# ---------------------------------------------------------------------------- reference


class ReferenceAttention(VarlenByLoop):
    """Plain PyTorch: materialises the block's scores. For tests and tiny shapes only."""

    name = "reference"

    def _probs(self, q, k, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        kk = k.repeat_interleave(hq // hkv, dim=2) if hq != hkv else k
        s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
        if block.kind != "full":
            s = s.masked_fill(~visible(block, s.device), float("-inf"))
        return s

    def forward(self, q, k, v, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        vv = v.repeat_interleave(hq // hkv, dim=2) if hq != hkv else v
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        s = self._probs(q.to(work), k.to(work), block, scale)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0).unsqueeze(-1))
        out = torch.einsum("bhqk,bkhd->bqhd", p, vv.to(work))
        return out.to(q.dtype), _lse_dtype(lse, q)

    def backward(self, dout, q, k, v, out, lse, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        g = hq // hkv
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        q_, k_, v_, do_ = (t.to(work) for t in (q, k, v, dout))
        vv = v_.repeat_interleave(g, dim=2) if g > 1 else v_
        kk = k_.repeat_interleave(g, dim=2) if g > 1 else k_
        s = self._probs(q_, k_, block, scale)
        p = torch.exp(s - lse.to(work).unsqueeze(-1))
        delta = (do_ * out.to(work)).sum(-1).transpose(1, 2)  # [b, h, q]
        dv = torch.einsum("bhqk,bqhd->bkhd", p, do_)
        dp = torch.einsum("bqhd,bkhd->bhqk", do_, vv)
        ds = p * (dp - delta.unsqueeze(-1)) * scale
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk)
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q_)
        if g > 1:
            b, m = dk.shape[:2]
            dk = dk.view(b, m, hkv, g, -1).sum(3)
            dv = dv.view(b, m, hkv, g, -1).sum(3)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---------------------------------------------------------------------------- CPU


class CpuFlashAttention(VarlenByLoop):
    """PyTorch's CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``).

    It handles GQA natively. For a row with no visible key it returns out = 0 and lse = 0
    (not -inf); the schedule trims every block so no row is empty, and the merge treats
    only lse = -inf as "nothing seen".
    """

    name = "cpu-flash"

    @staticmethod
    def _bias(block, q):
        """Band blocks become an additive mask (the op has no window support)."""
        if block.kind != "band":
            return None
        keep = visible(block, q.device)
        return torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~keep, float("-inf"))

    def forward(self, q, k, v, block, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _heads(q), _heads(k), _heads(v), 0.0, block.causal,
            attn_mask=self._bias(block, q), scale=scale)
        return out.transpose(1, 2), _lse_dtype(lse, q)

    def backward(self, dout, q, k, v, out, lse, block, scale):
        # The op takes lse in the dtype it produces: fp32 for fp32/bf16, fp64 for fp64.
        lse = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _heads(dout), _heads(q), _heads(k), _heads(v), _heads(out), lse, 0.0,
            block.causal, attn_mask=self._bias(block, q), scale=scale)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


# ---------------------------------------------------------------------------- CUDA


def _expand_kv(t: torch.Tensor, hq: int) -> torch.Tensor:
    hkv = t.shape[2]
    return t if hkv == hq else t.repeat_interleave(hq // hkv, dim=2)


def _fold_kv_grad(g: torch.Tensor, hkv: int) -> torch.Tensor:
    b, s, hq, d = g.shape
    return g if hq == hkv else g.view(b, s, hkv, hq // hkv, d).sum(3)


class CudnnAttention(VarlenByLoop):
    """cuDNN fused attention through PyTorch (fastest on Hopper: ~550 TFLOP/s fwd+bwd)."""

    name = "cudnn"

    def forward(self, q, k, v, block, scale):
        hq = q.shape[2]
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            _heads(q), _heads(_expand_kv(k, hq)), _heads(_expand_kv(v, hq)), None, True, 0.0,
            block.causal, False, scale=scale)
        out, lse = res[0], res[1]
        if lse.dim() == 4:
            lse = lse.squeeze(-1)
        return out.transpose(1, 2), lse.float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        kk, vv = _expand_kv(k, hq), _expand_kv(v, hq)
        empty = torch.empty(0, device=q.device)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            _heads(dout), _heads(q), _heads(kk), _heads(vv), _heads(out),
            lse.unsqueeze(-1).contiguous(), empty, empty, None, None, None,
            q.shape[1], k.shape[1], 0.0, block.causal, scale=scale)
        dk, dv = dk.transpose(1, 2), dv.transpose(1, 2)
        return dq.transpose(1, 2), _fold_kv_grad(dk, hkv), _fold_kv_grad(dv, hkv)


class TorchFlashAttention(VarlenByLoop):
    """FlashAttention-2 as built into PyTorch (bshd-native, GQA-native)."""

    name = "torch-flash"

    @staticmethod
    def _window(block):
        return flash_window(block) if block.kind == "band" else (None, None)

    def forward(self, q, k, v, block, scale):
        left, right = self._window(block)
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, q.shape[1], k.shape[1], 0.0, block.causal, False, scale=scale,
            window_size_left=left, window_size_right=right)
        return out, lse.float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        left, right = self._window(block)
        # The kernel reads lse as a dense [b, h, s]; the ring hands a slice of the rows.
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, None, q.shape[1], k.shape[1], 0.0,
            block.causal,
            torch.empty(2, dtype=torch.int64, device=q.device),
            torch.empty(0, device=q.device), scale=scale, window_size_left=left,
            window_size_right=right)
        return dq, dk, dv

    @staticmethod
    def _varlen_window(call):
        return (None, None) if call.causal or call.window == (-1, -1) else call.window

    def forward_varlen(self, q, k, v, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = self._varlen_window(call)
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, call.max_q, call.max_k, 0.0, call.causal, False, scale=scale,
            window_size_left=left, window_size_right=right)
        return out, lse.float()

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = self._varlen_window(call)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), cu_q, cu_k, call.max_q, call.max_k, 0.0,
            call.causal, torch.empty(2, dtype=torch.int64, device=q.device),
            torch.empty(0, device=q.device), scale=scale, window_size_left=left,
            window_size_right=right)
        return dq, dk, dv


class FlashAttnPackage(VarlenByLoop):
    """The ``flash_attn`` package (Dao-AILab), preferred on CUDA when installed."""

    name = "flash-attn"

    def __init__(self):
        from flash_attn import flash_attn_interface as fai  # noqa: F401
        self._fai = fai

    def forward(self, q, k, v, block, scale):
        res = self._fai._flash_attn_forward(q, k, v, 0.0, scale, causal=block.causal,
                                            window_size_left=-1, window_size_right=-1,
                                            softcap=0.0, alibi_slopes=None,
                                            return_softmax=False)
        return res[0], res[1].float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fai._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, scale,
                                       block.causal, -1, -1, 0.0, None, False)
        return dq, dk, dv

    # flash-attn 2.x's varlen entry points; a version whose signature differs fails the
    # probe in ``_cuda_kernel`` and the package is then not used for varlen calls.
    def forward_varlen(self, q, k, v, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = (-1, 0) if call.causal else call.window
        res = self._fai._flash_attn_varlen_forward(
            q, k, v, cu_q, cu_k, call.max_q, call.max_k, 0.0, scale, call.causal,
            window_size_left=left, window_size_right=right, softcap=0.0, alibi_slopes=None,
            return_softmax=False)
        return res[0], res[1].float()

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = (-1, 0) if call.causal else call.window
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fai._flash_attn_varlen_backward(
            dout, q, k, v, out, lse.contiguous(), dq, dk, dv, cu_q, cu_k, call.max_q,
            call.max_k, 0.0, scale, call.causal, left, right, 0.0, None, False)
        return dq, dk, dv


# ---------------------------------------------------------------------------- selection


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
    from .varlen import plan_calls
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


@functools.lru_cache(maxsize=64)
def _cuda_kernel(dtype: torch.dtype, hq: int, hkv: int, d: int, index: int) -> LocalAttention:
    device = torch.device("cuda", index)
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


def select_kernel(q: torch.Tensor, k: torch.Tensor, name: str | None = None) -> LocalAttention:
    """The fastest working backend for these tensors, or the one ``name`` forces."""
    if name is not None:
        if name == "flash-attn":
            return FlashAttnPackage()
        if name not in KERNELS:
            raise ValueError(f"kernel must be one of {sorted(KERNELS) + ['flash-attn']}, "
                             f"got {name!r}")
        return KERNELS[name]()
    if q.is_cuda:
        return _cuda_kernel(q.dtype, q.shape[2], k.shape[2], q.shape[3],
                            q.device.index or 0)
    if q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return CpuFlashAttention()
    return ReferenceAttention()


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
