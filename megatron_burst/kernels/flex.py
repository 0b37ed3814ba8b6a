"""FlexAttention for the forward of large band blocks (sliding windows) on CUDA.

Why: a window's band runs slower in flash (FlashAttention-2, the kernel that takes windows)
than in FlexAttention's block-sparse Triton kernel: on one H100, a causal sliding window's
forward ran 220 TFLOP/s in the package's plan against 305 in FlexAttention
(``benchmarks/results/h100x2_issue42_captured/``), and the window families' CP forward was
held to the slower of the two. Only the forward moves: the ring's backward takes the merged
output and lse of the whole ring, and every kernel's lse is the same logsumexp, so a forward
from one kernel and a backward from another are pieces of one exact gradient (flash's
backward ran as fast as FlexAttention's there). On 2x H100 the window families' captured
CP forward ran 9-18% faster with it (``benchmarks/results/h100x2_issue42_flex_bands/``).

``FlexBandForward`` wraps the band kernel (flash) and takes from it only the forward of band
blocks of at least ``min_side`` rows and keys. Its block mask is made from the band's tiles
on the host (O(tiles), never an n x m tensor) and cached by value. FlexAttention runs
compiled, and each call signature (shapes, strides, dtype, scale, band: what dynamo's guards
read; the inputs go in detached, so whether they need gradients is not one of them) gets a
compiled function of its own and a block mask of its own. One function shared by many
signatures would recompile for each and, at dynamo's recompile limit (8), fall back to
FlexAttention's unfused form, which materialises the scores (on 2x H100 that asked for 48
GiB). At most ``MAX_SIGNATURES`` a process go to FlexAttention (each costs a compile, seconds
on its first call). Each is checked against the wrapped kernel's forward on its first call
(``_checked``); one that fails, or first meets FlexAttention inside a CUDA graph capture,
stays with the wrapped kernel.
"""
from __future__ import annotations

import dataclasses
import inspect
import types
import logging

import numpy as np
import torch

from ..plan.schedule import Block
from .protocol import VarlenByLoop

LOG = logging.getLogger(__name__)

TILE = 128  # FlexAttention's default block size
MAX_SIGNATURES = 16  # compiled call signatures a process: a compile each
MAX_SIDE = 1 << 17  # beyond this the host's tile tables grow past what is worth it

try:
    from torch.nn.attention import flex_attention as _flex
except ImportError:  # a torch without FlexAttention: the wrapped kernel runs everything
    _flex = None


def available() -> bool:
    """Whether this torch has FlexAttention."""
    return _flex is not None


def band_tiles(n: int, m: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """([qt, kt] bool partial, [qt, kt] bool full): which TILE x TILE tiles of an n x m band
    block (key - query in [lo, hi]) see some pair but not all, and which see every pair.
    A tile cut short by the block's edge is never full (the mask decides its pairs)."""
    q0, k0 = np.arange(0, n, TILE), np.arange(0, m, TILE)
    q1, k1 = np.minimum(q0 + TILE, n), np.minimum(k0 + TILE, m)
    dmin = k0[None, :] - (q1[:, None] - 1)
    dmax = (k1[None, :] - 1) - q0[:, None]
    seen = (dmax >= lo) & (dmin <= hi)
    whole = ((q1 - q0) == TILE)[:, None] & ((k1 - k0) == TILE)[None, :]
    full = (dmin >= lo) & (dmax <= hi) & whole
    return seen & ~full, full


def _table(tiles: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's (count, indices) of one kind of tile a query tile: the tiles' columns
    first, in order."""
    count = torch.as_tensor(tiles.sum(axis=1, dtype=np.int32))
    order = torch.as_tensor(np.argsort(~tiles, axis=1, kind="stable").astype(np.int32))
    return count[None, None].to(device), order[None, None].to(device)


_TAKES_Q_BLOCKS = (_flex is not None and "compute_q_blocks"
                   in inspect.signature(_flex.BlockMask.from_kv_blocks).parameters)


def band_mask(n: int, m: int, lo: int, hi: int, device: torch.device):
    """The ``BlockMask`` of an n x m band block. lo and hi reach the kernel as tensors, so
    a new band of one shape needs no new compile."""
    partial, full = band_tiles(n, m, lo, hi)
    lo_t = torch.tensor(lo, device=device)
    hi_t = torch.tensor(hi, device=device)

    def in_band(b, h, q_idx, kv_idx):
        diff = kv_idx - q_idx
        return (diff >= lo_t) & (diff <= hi_t)

    extra = dict(compute_q_blocks=False) if _TAKES_Q_BLOCKS else {}  # forward only
    return _flex.BlockMask.from_kv_blocks(
        *_table(partial, device), *_table(full, device), BLOCK_SIZE=TILE, mask_mod=in_band,
        seq_lengths=(n, m), **extra)


@dataclasses.dataclass
class _Signature:
    """What one call signature runs: its own function (compiled, so its own dynamo cache)
    and block mask, and whether FlexAttention passed its check there (None: not yet)."""

    attend: object
    mask: object
    passed: bool | None = None


_SIGNATURES: dict = {}  # for the whole process, as dynamo's caches are (never emptied)


def signatures() -> dict:
    """Each call signature FlexAttention met, and whether it passed its check there."""
    return {key: sig.passed for key, sig in _SIGNATURES.items()}


def _attend(q, k, v, block_mask, scale, gqa):
    """FlexAttention's output and natural-log lse for [b, h, s, d] tensors."""
    if hasattr(_flex, "AuxRequest"):
        out, aux = _flex.flex_attention(q, k, v, block_mask=block_mask, scale=scale,
                                        enable_gqa=gqa, return_aux=_flex.AuxRequest(lse=True))
        return out, aux.lse
    return _flex.flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                                return_lse=True)


def _own_compile(index: int):
    """``_attend`` compiled as a function of its own: a code object of its own, so dynamo
    keeps a cache for it alone."""
    code = _attend.__code__.replace(co_name=f"_attend_{index}")
    return torch.compile(types.FunctionType(code, _attend.__globals__, code.co_name),
                         dynamic=False)


class FlexBandForward(VarlenByLoop):
    """``inner`` (a kernel with windows), with the forward of its large band blocks run by
    FlexAttention. ``compiled``: through ``torch.compile`` (on CUDA; the CPU tests run
    FlexAttention's unfused form on small blocks); ``min_side``: the fewest rows and keys a
    block needs to go to FlexAttention (below it flash's launch is the cheaper)."""

    def __init__(self, inner, *, min_side: int = 2048, compiled: bool = True):
        self.inner, self.min_side, self.compiled = inner, min_side, compiled
        self.name = f"flex-band+{inner.name}"
        self.capabilities = inner.capabilities
        self.dense_min_area = inner.dense_min_area
        self.gpu_bound_min_area = inner.gpu_bound_min_area

    def _takes(self, q, k, v, block: Block) -> bool:
        n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
        return (block.kind == "band" and self.min_side <= min(n, m) and max(n, m) <= MAX_SIDE
                and q.shape[-1] == v.shape[-1] and q.shape[-1] in (64, 128))

    def forward(self, q, k, v, block, scale):
        if not self._takes(q, k, v, block):
            return self.inner.forward(q, k, v, block, scale)
        key = (self.compiled, q.dtype, str(q.device), float(scale), block.lo, block.hi,
               *((tuple(t.shape), t.stride()) for t in (q, k, v)))
        sig = _SIGNATURES.get(key)
        if sig is None:
            capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
            if capturing or len(_SIGNATURES) >= MAX_SIGNATURES:
                return self.inner.forward(q, k, v, block, scale)
            n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
            attend = _own_compile(len(_SIGNATURES)) if self.compiled else _attend
            sig = _SIGNATURES[key] = _Signature(attend, band_mask(n, m, block.lo, block.hi,
                                                                  q.device))
            got = self._checked(sig, q, k, v, block, scale)
            if sig.passed:
                return got
        if not sig.passed:
            return self.inner.forward(q, k, v, block, scale)
        return self._run(sig, q, k, v, scale)

    @staticmethod
    def _run(sig: _Signature, q, k, v, scale):
        out, lse = sig.attend(*(t.detach().transpose(1, 2) for t in (q, k, v)), sig.mask,
                              scale, q.shape[2] != k.shape[2])
        return out.transpose(1, 2), lse.float()

    def _checked(self, sig: _Signature, q, k, v, block, scale):
        """FlexAttention's first result at a signature; ``sig.passed`` says whether it
        matches the wrapped kernel's forward on the same inputs (bf16-level tolerances; a
        failure is logged and the signature stays with the wrapped kernel)."""
        try:
            got = self._run(sig, q, k, v, scale)
        except Exception as err:  # a shape or arch FlexAttention's compile refuses
            LOG.warning("burst_attn: FlexAttention fails on %s (%s); %s runs it",
                        block.describe(), err, self.inner.name)
            sig.passed = False
            return None
        want = self.inner.forward(q, k, v, block, scale)
        err = (got[0].float() - want[0].float()).norm() / want[0].float().norm().clamp_min(1e-30)
        same = got[1] == want[1]  # rows that see nothing: -inf in both
        lse_err = torch.where(same, 0.0, got[1] - want[1]).abs().nan_to_num(nan=1.0).max()
        sig.passed = bool(err < 2e-2) and bool(lse_err < 2e-2)
        if not sig.passed:
            LOG.warning("burst_attn: FlexAttention differs from %s on %s (relative error "
                        "%.3g, lse %.3g); %s runs it", self.inner.name, block.describe(),
                        float(err), float(lse_err), self.inner.name)
        return got

    def has_native(self, block: Block) -> bool:
        return hasattr(self.inner, "native")

    def native(self, q, k, v, block, scale):
        return self.inner.native(q, k, v, block, scale)

    def backward(self, dout, q, k, v, out, lse, block, scale):
        return self.inner.backward(dout, q, k, v, out, lse, block, scale)

    def forward_varlen(self, q, k, v, call, scale):
        return self.inner.forward_varlen(q, k, v, call, scale)

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        return self.inner.backward_varlen(dout, q, k, v, out, lse, call, scale)
