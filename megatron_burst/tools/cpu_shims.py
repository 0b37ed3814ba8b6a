"""Run megatron-core's GPTModel on CPU ranks: patch its CUDA-only call sites, and undo it.

megatron-core assumes CUDA in a handful of places that have nothing to do with the model's
math. The CPU run of `megatron-burst run` (and the tests) replace exactly those places for
as long as they need them, with `megatron_on_cpu()`; importing this module patches nothing,
and leaving the block restores every original. It refuses to run where CUDA exists: a GPU
host must never train with these stand-ins.

What is patched (found on megatron-core 0.16.1 and 0.19.2 with torch CPU builds):
- `torch.cuda.current_device()`: RoPE, the global memory buffer and the pipeline p2p code
  allocate on it; it returns "cpu" here.
- `torch.cuda.synchronize()`: the pipeline p2p code calls it around batched send/recv; a
  no-op on CPU, where gloo's wait() is already synchronous.
- the tensor-parallel RNG tracker's CUDA generator state getters/setters: CPU ones.
- `rope_utils.get_pos_emb_on_this_cp_rank` builds its index with pin_memory + .cuda(), and
  `transformer.utils.get_default_causal_mask` (Megatron's local attention) uses device="cuda";
  both are replaced wherever they were imported by name.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist


def apply() -> Callable[[], None]:
    """Patch the CUDA-only call sites; return the function that restores them."""
    if torch.cuda.is_available():
        raise RuntimeError("megatron_on_cpu is for CPU-only hosts; this host has CUDA")
    import megatron.core.models.gpt  # noqa: F401  (import every user of the rebound names)
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.tensor_parallel import random as mp_random
    from megatron.core.transformer import utils as transformer_utils

    undo: list[Callable[[], None]] = []
    _set(undo, torch.cuda, "current_device", lambda: "cpu")
    _set(undo, torch.cuda, "synchronize", lambda *args, **kwargs: None)
    _set(undo, mp_random, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state())
    _set(undo, mp_random, "_set_cuda_rng_state",
         lambda state, *args, **kwargs: torch.set_rng_state(state))
    _rebind(undo, rope_utils, "get_pos_emb_on_this_cp_rank", _pos_emb_on_this_cp_rank)
    _rebind(undo, transformer_utils, "get_default_causal_mask", _default_causal_mask)

    def restore() -> None:
        for step in reversed(undo):
            step()
    return restore


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """The patches of `apply()` for the duration of the block."""
    restore = apply()
    try:
        yield
    finally:
        restore()


def _set(undo: list, home: Any, name: str, value: Any) -> None:
    original = getattr(home, name)
    setattr(home, name, value)
    undo.append(lambda: setattr(home, name, original))


def _rebind(undo: list, home: Any, name: str, replacement: Any) -> None:
    """Replace `home.name` everywhere it was imported by name (`from x import name`)."""
    original = getattr(home, name)
    for module in list(sys.modules.values()):
        if getattr(module, name, None) is original:
            _set(undo, module, name, replacement)


def _default_causal_mask(sq: int) -> torch.Tensor:
    """transformer.utils.get_default_causal_mask without device="cuda"."""
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def _pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int,
                             cp_group: dist.ProcessGroup) -> torch.Tensor:
    """rope_utils.get_pos_emb_on_this_cp_rank without pin_memory/.cuda(): zigzag chunks."""
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1,
                           *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])
