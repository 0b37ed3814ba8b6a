"""The online-softmax merge of partial attention results (BurstAttention's GAO).

Attention over a union of key sets is a weighted mean of the attention over each set,
weighted by each set's softmax mass exp(lse). Folding one partial (o_j, lse_j) into the
running (o, lse):

    lse' = logaddexp(lse, lse_j)
    o'   = exp(lse - lse') * o + exp(lse_j - lse') * o_j

Both weights are <= 1, so nothing overflows, and a row that has seen no key yet carries
lse = -inf: its weight is exactly 0 and it cannot pollute the result. A row that no block
ever saw ends with o = 0 and lse = -inf, never NaN.

On CUDA a Triton kernel does the whole update in one pass over the rows (reading o, o_j
and both lse once, writing o and lse once); the PyTorch version needs about six passes.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .triton_direct import DirectLaunches

try:  # Triton is optional: CPU runs, and CUDA machines without it, use the torch path.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None


def merge_partial_torch(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
                        block_lse: torch.Tensor) -> None:
    """Reference implementation of ``merge_partial`` in plain PyTorch ops."""
    new_lse = torch.logaddexp(lse, block_lse)
    # -inf - -inf is NaN; where nothing has been seen at all both weights must be 0.
    ref = new_lse.masked_fill(torch.isneginf(new_lse), 0.0)
    w_old = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(block_lse - ref).transpose(1, 2).unsqueeze(-1)
    out.mul_(w_old).add_(block_out.to(out.dtype) * w_new)
    lse.copy_(new_lse)


# Triton compiles a variant per combination of integer arguments that are 1 or divisible by
# 16. A document pack's blocks have new row counts and offsets every batch, which made new
# packs compile new variants (~0.1 s each); none of these integers is worth specialising.
_NOT_SPECIALISED = ["S", "H", "o_at", "l_at", "b_at", "o_sb", "o_ss", "o_sh", "l_sb", "l_sh",
                    "l_ss", "b_sb", "b_ss", "b_sh", "bl_sb", "bl_sh", "bl_ss"]
# Pointers are specialised on 16-byte alignment too. The lse rows of a block start at any
# row (4 bytes each), so each new alignment compiled a variant (the 32K new-pack figure of
# issue 39); one fp32 load per row gains nothing from it. The outputs' rows stay aligned
# (head dims are powers of two) and keep their vector loads.
_ANY_ALIGNMENT = ["lse_ptr", "blse_ptr"]


def _jit_options() -> dict:
    """``triton.jit``'s options: the alignment one where this Triton has it (3.2 on)."""
    import inspect

    options: dict = {"do_not_specialize": _NOT_SPECIALISED}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        options["do_not_specialize_on_alignment"] = _ANY_ALIGNMENT
    return options


if triton is not None:
    @triton.jit(**_jit_options())
    def _merge_kernel(out_ptr, lse_ptr, blk_ptr, blse_ptr, S, H, o_at, l_at, b_at,
                      o_sb, o_ss, o_sh, l_sb, l_sh, l_ss, b_sb, b_ss, b_sh,
                      bl_sb, bl_sh, bl_ss, D: tl.constexpr, ROWS: tl.constexpr,
                      ALIGN: tl.constexpr, WRITE: tl.constexpr):
        # A program: ROWS positions of one (batch, head). Its lse loads are consecutive,
        # its output rows D contiguous values each (the layout both tensors have). The
        # first version took 16 (position, head) rows of a flat index: lse loads S apart,
        # 0.74 ms for 16K x 32 x 128 on an H100 (a quarter of the memory bandwidth).
        # S rows from row o_at of out, l_at of lse and b_at of the block's: offsets, not
        # views, since a view is a host op of its own (``fold_rows``).
        s = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: huge shards
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        live = s < S
        d = tl.arange(0, D)
        m2 = live[:, None]
        # The outputs' strides come divided by ALIGN (``_launch``): multiplied back by a
        # constant, Triton knows each row starts ALIGN elements aligned and loads it in
        # vectors. Unspecialised strides alone gave scalar loads.
        o_off = ((b * o_sb + h * o_sh + (s + o_at) * o_ss) * ALIGN)[:, None] + d[None, :]
        k_off = ((b * b_sb + h * b_sh + (s + b_at) * b_ss) * ALIGN)[:, None] + d[None, :]
        l_ptrs = lse_ptr + b * l_sb + h * l_sh + (s + l_at) * l_ss
        blse = tl.load(blse_ptr + b * bl_sb + h * bl_sh + (s + b_at) * bl_ss, mask=live,
                       other=float("-inf"))
        if WRITE:  # rows nothing has written yet: the block's partial, as it is
            x = tl.load(blk_ptr + k_off, mask=m2, other=0.0)
            tl.store(out_ptr + o_off, x.to(out_ptr.dtype.element_ty), mask=m2)
            tl.store(l_ptrs, blse, mask=live)
        else:
            lse = tl.load(l_ptrs, mask=live, other=0.0)
            # Rows this block saw nothing of, already holding a result, are left as they
            # are (the merge would rewrite them unchanged): most rows of a pack_zigzag
            # block whose keys precede its queries. Nothing is read of them but two lse.
            skip = (tl.max(blse, 0) == float("-inf")) & (tl.min(lse, 0) > float("-inf"))
            if not skip:
                hi = tl.maximum(lse, blse)
                safe = tl.where(hi == float("-inf"), 0.0, hi)
                ea, eb = tl.exp(lse - safe), tl.exp(blse - safe)
                tot = ea + eb
                new_lse = tl.where(tot > 0, safe + tl.log(tot), float("-inf"))
                inv = tl.where(tot > 0, 1.0 / tot, 0.0)
                wa, wb = ea * inv, eb * inv
                o = tl.load(out_ptr + o_off, mask=m2, other=0.0).to(tl.float32)
                x = tl.load(blk_ptr + k_off, mask=m2, other=0.0).to(tl.float32)
                merged = o * wa[:, None] + x * wb[:, None]  # fp32, rounded once when stored
                tl.store(out_ptr + o_off, merged.to(out_ptr.dtype.element_ty), mask=m2)
                tl.store(l_ptrs, new_lse, mask=live)


_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fuses(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether outputs of ``dtype`` on ``device`` with ``head_dim`` merge in the fused
    kernel, which computes in fp32 and rounds once as it stores: then a half-precision
    output that receives one merge (two partials) is exactly the fp32 accumulator's
    result cast at the end, and needs no fp32 copy."""
    return (triton is not None and device.type == "cuda" and dtype in _FUSED_DTYPES
            and head_dim & (head_dim - 1) == 0)


def _fusable(out: torch.Tensor, block_out: torch.Tensor) -> bool:
    return (fuses(out.device, out.dtype, out.shape[-1]) and out.stride(-1) == 1
            and block_out.stride(-1) == 1)


def merge_partial(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
                  block_lse: torch.Tensor) -> None:
    """Fold ``(block_out, block_lse)`` into the accumulators ``(out, lse)`` in place.

    out, block_out: [b, s, h, d] (views allowed); lse, block_lse: [b, h, s]. ``out`` is
    fp32, or half precision where ``fuses`` says the fused kernel merges it.
    """
    if _fusable(out, block_out):
        compile_variants(out.device, block_out.dtype, out.shape[-1])
        _launch(out, lse, block_out, block_lse)
        return
    if out.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"merge_partial: a {out.dtype} accumulator merges only in the "
                         f"fused kernel (CUDA, Triton, power-of-two head dim)")
    merge_partial_torch(out, lse, block_out, block_lse)


def fold_rows(out: torch.Tensor, lse: torch.Tensor, out_at: int, lse_at: int,
              block_out: torch.Tensor, block_lse: torch.Tensor, at: int, n: int,
              write: bool) -> None:
    """Rows ``at:at+n`` of a partial (``block_out`` bshd, ``block_lse`` [b, h, s]) folded
    into rows ``out_at:`` of ``out`` and ``lse_at:`` of ``lse``: merged, or written where
    nothing has been (``write``). The fused kernel takes the offsets as numbers: one launch,
    where the views and copies cost the host four to six ops more (about 10 us each on a
    slow host), for every run of every call of an eager forward."""
    if _fusable(out, block_out):
        compile_variants(out.device, block_out.dtype, out.shape[-1])
        _launch(out, lse, block_out, block_lse, at=(out_at, lse_at, at), n=n, write=write)
        return
    rows = out.narrow(1, out_at, n), lse.narrow(2, lse_at, n)
    part = block_out.narrow(1, at, n), block_lse.narrow(2, at, n)
    if write:
        rows[0].copy_(part[0])
        rows[1].copy_(part[1])
    else:
        merge_partial(*rows, *part)


# (device, partial dtype, head dim) whose accumulator variants are compiled.
_COMPILED: set[tuple] = set()


def compile_variants(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    """Every accumulator variant of the merge for these partials (merging and writing),
    compiled before the first call that may fold runs (``prepare`` asks when it plans a
    ring call on CUDA): a pack whose rows take at most two partials merges into
    half-precision homes, others into fp32 (``home_output.home_dtype``), so which one a new
    pack needs, and whether it merges at all (documents held whole on one rank need no
    merge), depends on the pack. Compiled on demand, the first merge of a run cost a Triton
    compile (0.35-0.6 s, most of it Triton hashing its own sources) at whichever pack first
    needed one, inside a timed step (issue 39's 32K new-pack figure: one 626 ms call)."""
    key = (device, dtype, head_dim)
    if key in _COMPILED:
        return
    _COMPILED.add(key)
    for acc in {torch.float32, dtype}:
        if fuses(device, acc, head_dim):  # empty folds: compiled, no row touched
            o = torch.zeros(1, 1, 1, head_dim, device=device, dtype=acc)
            lse = torch.zeros(1, 1, 1, device=device)
            for write in (False, True):
                _launch(o, lse, o.to(dtype), lse, n=0, write=write)


_ROCM = torch.version.hip is not None
ROW_ALIGN = 16  # elements: a 16-byte vector of fp32, two of bf16


def row_alignment(*tensors: torch.Tensor) -> int:
    """``ROW_ALIGN`` where every outer stride of ``tensors`` is a multiple of it (a [b, s, h, d]
    view of whole heads, d >= 16: every call the ring makes), else 1 (scalar loads)."""
    strides = [t.stride(i) for t in tensors for i in range(3)]
    return ROW_ALIGN if all(x % ROW_ALIGN == 0 for x in strides) else 1


def _launch(out, lse, block_out, block_lse, rows: int | None = None, num_warps: int = 4,
            at: tuple[int, int, int] = (0, 0, 0), n: int | None = None,
            write: bool = False) -> None:
    """The fused kernel's launch over ``n`` rows (default all of ``out``) from the row
    offsets ``at`` (out, lse, block); ``rows`` (positions a program, default 4K values of
    each tensor) and ``num_warps`` are for ``benchmarks/merge_rate.py --sweep``. Every launch
    of an eager forward pays this function's Python on the host: strides are read once
    each (``row_alignment``'s rule, inline)."""
    b, s, h, d = out.shape
    s = s if n is None else n
    rows = rows or max(16, 4096 // d)
    (o0, o1, o2, _), (b0, b1, b2, _) = out.stride(), block_out.stride()
    align = ROW_ALIGN if not (o0 % 16 or o1 % 16 or o2 % 16 or b0 % 16 or b1 % 16
                              or b2 % 16) else 1
    ints = (s, h, *at, o0 // align, o1 // align, o2 // align, *lse.stride(), b0 // align,
            b1 // align, b2 // align, *block_lse.stride())
    key = _direct_key(out, lse, block_out, block_lse, ints, align, rows, num_warps, write)
    _LAUNCHES.launch(key, ((s + rows - 1) // rows or 1, b * h or 1, 1),
                     (out, lse, block_out, block_lse, *ints),
                     {"D": d, "ROWS": rows, "ALIGN": align, "WRITE": write}, num_warps)


def _direct_key(out, lse, block_out, block_lse, ints, align: int, rows: int,
                num_warps: int, write: bool) -> tuple | None:
    """What Triton specialises ``_merge_kernel`` on, for a launch past its binding
    (``triton_direct``): the four dtypes, the constants, the 16-byte alignment of the two
    output pointers (the lse pointers are not specialised), integers that fit 32 bits (no
    other integer is specialised). None (Triton's own launch) off CUDA (the interpreter),
    for rows not ``ROW_ALIGN`` aligned, unaligned pointers, 64-bit integers, or ROCm."""
    if (not out.is_cuda or align != ROW_ALIGN or _ROCM
            or (out.data_ptr() | block_out.data_ptr()) % 16 or max(ints) >= 2 ** 31):
        return None
    return (out.get_device(), out.dtype, lse.dtype, block_out.dtype, block_lse.dtype,
            out.shape[-1], rows, num_warps, write)


def _same_as_tritons(key: tuple, launcher) -> bool:
    """``launcher`` (``triton_direct``) gives Triton's own launch's bits for ``key``: both
    fold the same scratch partials (rows unseen on either side, a part-filled program, row
    offsets on every side)."""
    index, o_dtype, l_dtype, b_dtype, bl_dtype, d, rows, num_warps, write = key
    device, gen = torch.device("cuda", index), torch.Generator().manual_seed(0)
    s, h, at = rows + 8, 2, (1, 2, 3)
    out = torch.randn(1, s, h, d, generator=gen).to(device, o_dtype)
    lse = torch.randn(1, h, s, generator=gen).to(device, l_dtype)
    blk = torch.randn(1, s, h, d, generator=gen).to(device, b_dtype)
    blse = torch.randn(1, h, s, generator=gen).to(device, bl_dtype)
    lse[..., :4], blse[..., 3:7] = float("-inf"), float("-inf")
    ints = (s - 3, h, *at, *[out.stride(i) // ROW_ALIGN for i in range(3)], *lse.stride(),
            *[blk.stride(i) // ROW_ALIGN for i in range(3)], *blse.stride())
    grid, mine, theirs = (triton.cdiv(s, rows), h, 1), (out.clone(), lse.clone()), (out, lse)
    _merge_kernel[grid](*theirs, blk, blse, *ints, D=d, ROWS=rows, ALIGN=ROW_ALIGN,
                        WRITE=write, num_warps=num_warps)
    launcher(grid, *mine, blk, blse, *ints, d, rows, ROW_ALIGN, write)
    return torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])


_LAUNCHES = DirectLaunches(_merge_kernel, _same_as_tritons) if triton is not None else None


@contextlib.contextmanager
def tritons_own_launch() -> Iterator[None]:
    """Inside: every merge launched through Triton's own binding (a launcher that adopts no
    key), the yardstick the direct launch is held to (``benchmarks/merge_launch.py`` times
    both, ``tests/test_gpu_merge_launch.py`` compares their bits)."""
    global _LAUNCHES
    if triton is None:
        raise RuntimeError("merge.tritons_own_launch: Triton is not installed here")
    saved, _LAUNCHES = _LAUNCHES, DirectLaunches(_merge_kernel, lambda key, launcher: False)
    try:
        yield
    finally:
        _LAUNCHES = saved
