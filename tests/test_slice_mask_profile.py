"""``benchmarks/slice_mask_profile.py --copies``: the forward's copies, casts and fills
grouped by shapes and by the package's lines that made them (what the next GPU run of
issue 42's causal window reads)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import slice_mask_profile  # noqa: E402

from megatron_burst.plan.schedule import Block  # noqa: E402
from megatron_burst.kernels import run_calls, varlen  # noqa: E402


def test_copies_are_grouped_by_shape_and_by_the_package_lines_that_made_them():
    """A call's first write copies its partial into the accumulator (``merge.fold_rows`` via
    ``run_forward``, off the fused kernel): the table names it, with its shapes, once per
    shape."""
    q = k = v = torch.randn(1, 32, 2, 8)
    out, lse = torch.empty(1, 32, 2, 8), torch.empty(1, 2, 32)

    class Kernel:
        def forward(self, q, k, v, block, scale):
            return q.clone(), torch.zeros(1, 2, q.shape[1])

    call = varlen.KernelLaunch((Block(0, 32, 0, 32, "full"),), False)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True) as p:
        for _ in range(3):
            run_calls.run_forward(Kernel(), call, q, k, v, out, lse, 1.0, (True,))
    rows = slice_mask_profile.copies_table(p.events())
    copies = [r for r in rows if "aten::copy_ [[1, 32, 2, 8], [1, 32, 2, 8]" in r]
    assert len(copies) == 2  # the fake kernel's clone, under run_forward; and the write
    written = [r for r in copies if "fold_rows" in r]
    assert len(written) == 1 and written[0].lstrip().startswith("3 x")
    assert "run_forward" in written[0]
