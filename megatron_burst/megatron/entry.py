"""The names both ways into Megatron's training loop call, so that they cannot diverge.

This package's entry point (`megatron_burst.megatron.pretrain_gpt`) and Megatron-LM's own
`pretrain_gpt.py` with `patches/` applied (which imports this module as `burst_entry`) call
these and nothing else of the package; each lives in the module of its job:

- `configure_run` (returning a `BurstRun`): the run's BurstAttention choices, made once
  (`burst_run`), refusing what the run could not honour (`run_checks`);
- `check_own_entry`: what this package's entry point adds to those refusals (`run_checks`);
- `dataset_on_every_rank`, `document_batch`, `mask_batch`: the micro-batches with document
  masks, or with a slice mask per micro-batch (`run_batches`);
- `plain_flops_once`: the FLOPs line the benchmarks read, for runs without documents
  (`run_flops`);
- `say`: the rank-0 printer (`printer`).
"""
from __future__ import annotations

from megatron_burst.megatron.burst_run import BurstRun, configure_run
from megatron_burst.megatron.printer import say
from megatron_burst.megatron.run_batches import (dataset_on_every_rank, document_batch,
                                                 mask_batch)
from megatron_burst.megatron.run_checks import check_own_entry
from megatron_burst.megatron.run_flops import plain_flops_once

__all__ = [
    "BurstRun",
    "check_own_entry",
    "configure_run",
    "dataset_on_every_rank",
    "document_batch",
    "mask_batch",
    "plain_flops_once",
    "say",
]
