"""Test helpers around the package's CPU model: the tiny Llama, random batches, shims on.

Test ranks are throwaway processes, so `init_parallel` here installs the CPU patches of
`megatron_burst.tools.cpu_shims` for the rest of the process (the package itself only
patches inside `megatron_on_cpu()` blocks). The rest re-exports the package's CPU model
functions so tests read `cm.train_step(...)` as before.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from megatron_burst.tools import cpu_shims
from megatron_burst.tools.cpu_model import (ModelShape, build_gpt, reduce_gradients,
                                            split_batch_for_cp, train_step, transformer_config)
from megatron_burst.tools.cpu_model import init_parallel as _init_parallel

TinyLlama = ModelShape  # the default shape is the tiny test model
_PATCHED = False


def init_parallel(tp: int = 1, pp: int = 1, cp: int = 1,
                  hierarchical_cp: Optional[List[int]] = None, seed: int = 1234) -> None:
    """Patch megatron-core for CPU (once per process), then build the parallel state."""
    global _PATCHED
    if not _PATCHED:
        cpu_shims.apply()
        _PATCHED = True
    _init_parallel(tp=tp, pp=pp, cp=cp, hierarchical_cp=hierarchical_cp, seed=seed)


def tiny_llama_config(shape: ModelShape = ModelShape(), **kwargs: Any) -> Any:
    return transformer_config(shape, **kwargs)


def build_tiny_llama(shape: ModelShape = ModelShape(),
                     spec_kwargs: Optional[Dict[str, Any]] = None,
                     **config_kwargs: Any) -> torch.nn.Module:
    """The tiny Llama-style GPTModel with BurstDotProductAttention, on the current parallel
    state. ``spec_kwargs`` go to the layer spec (backward, intra_node_size, ulysses_size)."""
    from megatron_burst.megatron.spec import get_llama_layer_burst_spec

    config = transformer_config(shape, **config_kwargs)
    spec = get_llama_layer_burst_spec(config, use_te=False, **(spec_kwargs or {}))
    return build_gpt(config, spec, shape)


def random_batch(shape: ModelShape, batch_size: int = 2, seed: int = 0) -> Dict[str, torch.Tensor]:
    """A reproducible language-modelling batch: tokens, next-token labels, mask, positions."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab_size, (batch_size, shape.seq_length + 1), generator=gen)
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "loss_mask": torch.ones(batch_size, shape.seq_length),
        "position_ids": torch.arange(shape.seq_length).expand(batch_size, -1).contiguous(),
    }
