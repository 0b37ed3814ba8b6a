"""GPU check of rows kept apart in fp32 beside a half-precision home (skipped without 2
GPUs): the CPU tests (``tests/test_wide_rows.py``) emulate the fused merge's rounding; here
the fused Triton kernel itself merges, over NCCL, and out, lse and every gradient must be
the bits of a whole fp32 home, and within bf16 accuracy of float64."""
from __future__ import annotations

import pytest
import torch

from .distributed import run_ranks
from .test_wide_rows import CASES, _worker, check_against_whole_and_float64

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(NGPU < 3, reason="needs 3 GPUs")  # (the 3-rank case)
@pytest.mark.parametrize("case", [c for c in range(len(CASES)) if CASES[c][2] == 3])
def test_rows_kept_apart_on_three_gpus(case):
    name, lens, world = CASES[case]
    check_against_whole_and_float64(run_ranks(world, _worker, name, lens, "burst", True,
                                              backend="nccl"), name, lens, world)


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("backward", ["ring", "burst"])
@pytest.mark.parametrize("case", [c for c in range(len(CASES)) if CASES[c][2] == 2])
def test_rows_kept_apart_give_a_whole_fp32_homes_bits_over_nccl(case, backward):
    name, lens, world = CASES[case]
    check_against_whole_and_float64(run_ranks(world, _worker, name, lens, backward, True,
                                              backend="nccl"), name, lens, world)
