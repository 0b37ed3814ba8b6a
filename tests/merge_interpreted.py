"""The fused Triton merge (``kernels.merge``) run by Triton's interpreter on the CPU, so CI
checks the kernel's own arithmetic without a GPU. Run by ``tests/test_merge_interpreted.py``
as ``TRITON_INTERPRET=1 python -m tests.merge_interpreted`` (the variable is read when the
kernel is defined, so it needs a process of its own); it prints one line per check.

Checked: the merge against float64 on strided views with rows not seen yet; that a
half-precision home takes the fp32 home's result rounded once (the rule ``home_dtype`` and
``WideRows`` rely on: a row of at most two partials needs no fp32 copy; the interpreter
rounds by truncation, a GPU to nearest); rows the block did not see are left bit for bit;
rows whose strides are not 16-element multiples; folds at row offsets (``merge.fold_rows``:
the offsets go to the kernel as numbers), merged or written, against the same fold of views,
leaving every other row as it was.
"""
from __future__ import annotations

import os

import torch

from megatron_burst.kernels import merge


def _float64_merge(out, lse, blk, blse):
    new = torch.logaddexp(lse.double(), blse.double())
    safe = new.masked_fill(torch.isneginf(new), 0.0)
    w_old = torch.exp(lse.double() - safe).transpose(1, 2)[..., None]
    w_new = torch.exp(blse.double() - safe).transpose(1, 2)[..., None]
    return out.double() * w_old + blk.double() * w_new, new


def against_float64(gen) -> None:
    out = torch.randn(2, 90, 4, 32, generator=gen)
    lse = torch.randn(2, 4, 90, generator=gen)
    blk = torch.randn(2, 180, 4, 32, generator=gen).bfloat16()
    blse = torch.randn(2, 4, 180, generator=gen)
    lse[:, :, :7] = float("-inf")  # rows not seen yet
    blse[:, :, 90:97] = float("-inf")  # ... and not by this block either: 0 and -inf
    view, bview = blk[:, 90:], blse[:, :, 90:]
    ref, ref_lse = _float64_merge(out, lse, view, bview)
    merge._launch(out, lse, view, bview)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isnan(out).any() and (out[:, :7].abs().sum() == 0)
    assert (out.double() - ref).abs().max().item() < 1e-5
    finite = torch.isfinite(ref_lse)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-5


def half_home_rounds_once(gen) -> None:
    first = torch.randn(1, 77, 4, 32, generator=gen).bfloat16()  # a first partial, written
    lse = torch.randn(1, 4, 77, generator=gen)
    blk = torch.randn(1, 77, 4, 32, generator=gen).bfloat16()
    blse = torch.randn(1, 4, 77, generator=gen)
    wide, wide_lse = first.float(), lse.clone()
    half, half_lse = first.clone(), lse.clone()
    merge._launch(wide, wide_lse, blk, blse)
    merge._launch(half, half_lse, blk, blse)
    # The interpreter stores fp32 as bf16 by dropping the low 16 bits, where a GPU rounds to
    # nearest (``tests/test_gpu_wide_rows.py`` holds that one): either way, one rounding of
    # the fp32 result, the same for every row.
    truncated = (wide.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()
    assert torch.equal(half, wide.bfloat16()) or torch.equal(half, truncated)
    assert not torch.equal(wide.bfloat16(), truncated)  # (the two differ: the check decides)
    assert torch.equal(half_lse, wide_lse)


def unseen_rows_left(gen) -> None:
    for home in (torch.float32, torch.bfloat16):
        out = torch.randn(1, 300, 2, 64, generator=gen).to(home)
        lse = torch.randn(1, 2, 300, generator=gen)
        blk = torch.randn(1, 300, 2, 64, generator=gen).bfloat16()
        blse = torch.randn(1, 2, 300, generator=gen)
        blse[:, :, 64:200] = float("-inf")
        blk[:, 64:128] = float("nan")  # a whole program's rows, all skipped: never read
        before, before_lse = out.clone(), lse.clone()
        merge._launch(out, lse, blk, blse)
        assert torch.equal(out[:, 64:200], before[:, 64:200])
        assert torch.equal(lse[:, :, 64:200], before_lse[:, :, 64:200])
        assert not torch.isnan(out).any()


def unaligned_rows(gen) -> None:
    for d, pad in ((32, 2), (8, 0)):
        out = torch.randn(1, 50, 3, d + pad, generator=gen)[..., :d]
        blk = torch.randn(1, 50, 3, d + pad, generator=gen).bfloat16()[..., :d]
        lse, blse = (torch.randn(1, 3, 50, generator=gen) for _ in range(2))
        assert merge.row_alignment(out, blk) == 1
        ref, ref_lse = _float64_merge(out, lse, blk, blse)
        merge._launch(out, lse, blk, blse)
        assert (out.double() - ref).abs().max().item() < 1e-5
        assert (lse.double() - ref_lse).abs().max().item() < 1e-5


def offsets_and_writes(gen) -> None:
    for home, write in ((torch.float32, False), (torch.bfloat16, True), (torch.float32, True)):
        out = torch.randn(1, 70, 2, 32, generator=gen).to(home)
        lse = torch.randn(1, 2, 90, generator=gen)  # (a wider lse: a kept rows' buffer)
        blk = torch.randn(1, 60, 2, 32, generator=gen).bfloat16()
        blse = torch.randn(1, 2, 60, generator=gen)
        blse[:, :, 20:25] = float("-inf")
        want, want_lse = out.clone(), lse.clone()
        o_rows, l_rows = want[:, 11:51], want_lse[:, :, 30:70]
        if write:
            o_rows.copy_(blk[:, 13:53])
            l_rows.copy_(blse[:, :, 13:53])
        else:
            ref, ref_lse = _float64_merge(o_rows, l_rows, blk[:, 13:53], blse[:, :, 13:53])
            o_rows.copy_(ref)
            l_rows.copy_(ref_lse)
        merge._launch(out, lse, blk, blse, at=(11, 30, 13), n=40, write=write)
        assert torch.equal(out[:, :11], want[:, :11]) and torch.equal(out[:, 51:], want[:, 51:])
        assert torch.equal(lse[:, :, :30], want_lse[:, :, :30])
        assert torch.equal(lse[:, :, 70:], want_lse[:, :, 70:])
        tol = 0 if write else 1e-5
        assert (out.double() - want.double()).abs().max().item() <= tol
        assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
        fin = torch.isfinite(want_lse)
        assert (lse[fin].double() - want_lse[fin].double()).abs().max().item() <= tol


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("tests.merge_interpreted: run with TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(42)
    for check in (against_float64, half_home_rounds_once, unseen_rows_left, unaligned_rows,
                  offsets_and_writes):
        check(gen)
        print(f"{check.__name__}: ok", flush=True)


if __name__ == "__main__":
    main()
