"""What a training step computes, in FLOPs: the one count the planner, the Megatron entry
point's printed figures and the benchmarks use.

A matmul counts 2 FLOPs per multiply-add, and training runs each one three times (the
forward, and the backward's data and weight gradients): fwd+bwd = 3 x the forward, the
convention of Megatron's own count and of MFU. Per token, one layer's forward:

- QKV projection: ``2 h (hq + 2 hkv) d`` (GQA: ``hkv`` key/value heads of ``d`` channels);
- output projection: ``2 hq dv h`` (dv: V's head dim, d but for MLA);
- multi-latent attention (MLA) instead projects through low-rank latents: ``2 x`` its
  projections' weights (``mla_projections``) per token;
- MLP: ``2 h f x 3`` with SwiGLU (gate and up, h -> 2f, then down, f -> h), ``x 2`` without.

Attention costs ``2 hq (d + dv)`` per visible (query, key) pair and layer (QK^T at Q/K's
head dim, PV at V's; ``4 hq d`` where they agree): a causal document of n tokens has
n(n+1)/2 pairs, a pack the sum over its documents (``causal_pairs``), so document masks
remove work and the count says so. The logits cost ``2 h V`` per token, V the *padded*
vocabulary the output layer multiplies by.
Norms, RoPE, softmax, the loss and the embedding lookup are no matmul and are not counted.

Model FLOPs (MFU's numerator) leave recompute out; ``hardware`` adds what recompute repeats
(``Recompute``): the forward of every recomputed layer (its attention too, unless the
attention output is kept, as remat-aware recompute does) and, for selective recompute, the
core attention's or the MLP's forward.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

FWD_BWD = 3  # forward + data gradient + weight gradient


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The matmul shapes of a GPT/Llama model (whole model: before tensor parallelism)."""

    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    head_dim: int
    vocab: int  # padded: the output layer's rows
    swiglu: bool = True
    v_head_dim: int = 0  # V's head dim where it is not Q/K's (MLA); 0: head_dim
    projections: int = 0  # one layer's attention projection weights where they are not
    #                       plain GQA's (MLA: ``mla_projections``); 0: from the heads

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn_hidden", "heads", "query_groups", "head_dim",
                     "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelShape.{name} must be positive, got {getattr(self, name)}")
        for name in ("v_head_dim", "projections"):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelShape.{name} must be positive or 0 (not given), got "
                                 f"{getattr(self, name)}")

    @property
    def attention_linear(self) -> int:
        """Forward FLOPs per token of one layer's QKV and output projections."""
        if self.projections:
            return 2 * self.projections
        qkv = self.hidden * (self.heads + 2 * self.query_groups) * self.head_dim
        return 2 * (qkv + self.heads * self.v_dim * self.hidden)

    @property
    def mlp(self) -> int:
        """Forward FLOPs per token of one layer's MLP."""
        return 2 * self.hidden * self.ffn_hidden * (3 if self.swiglu else 2)

    @property
    def per_pair(self) -> int:
        """Forward FLOPs of one layer's attention per visible (query, key) pair."""
        return 2 * self.heads * (self.head_dim + self.v_dim)


def mla_projections(hidden: int, heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                    head_dim: int, rope_dim: int, v_head_dim: int) -> int:
    """Weights of one multi-latent attention layer's projections (before tensor
    parallelism), as Megatron's MLA builds them: Q down h x q_lora and up q_lora x hq d (one
    h x hq d projection without q_lora); K/V down h x (kv_lora + d_rope) and up
    kv_lora x hq (d - d_rope + dv); the output hq dv x h. ``head_dim`` is Q/K's whole head
    dim, RoPE part included."""
    q = hidden * heads * head_dim if not q_lora_rank else q_lora_rank * (hidden + heads * head_dim)
    kv = hidden * (kv_lora_rank + rope_dim) + kv_lora_rank * heads * (head_dim - rope_dim
                                                                       + v_head_dim)
    return q + kv + heads * v_head_dim * hidden


@dataclasses.dataclass(frozen=True)
class Recompute:
    """Forward work a step does twice. ``layers``: layers recomputed whole (full recompute);
    ``keeps_attention``: their attention is not rerun (remat-aware recompute keeps its
    output); ``attention_layers`` / ``mlp_layers``: layers whose core attention / MLP alone
    is recomputed (selective recompute)."""

    layers: int = 0
    keeps_attention: bool = False
    attention_layers: int = 0
    mlp_layers: int = 0


NO_RECOMPUTE = Recompute()


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """FLOPs of one sequence's forward and backward: ``model`` (no recompute, MFU's count)
    and ``hardware`` (what runs, recompute included)."""

    model: float
    hardware: float


def causal_pairs(lens: Sequence[int], window_left: int = -1) -> int:
    """Visible (query, key) pairs of causal attention inside each document of ``lens``; with
    a sliding window of ``window_left`` earlier keys (-1: unbounded) a query sees at most
    window_left + 1 keys. Vectorised: a pack may hold thousands of documents (a few are
    summed in Python: `plan` and the CLI count a plain sequence without importing numpy)."""
    if len(lens) <= 64:
        if any(x < 0 for x in lens):
            raise ValueError(f"document lengths must not be negative, got {min(lens)}")
        w = window_left + 1
        return sum(x * (x + 1) // 2 if window_left < 0 or x <= w
                   else w * (w + 1) // 2 + (x - w) * w for x in lens)
    import numpy as np

    n = np.asarray(lens, dtype=np.int64)
    if n.size and n.min() < 0:
        raise ValueError(f"document lengths must not be negative, got {int(n.min())}")
    if window_left < 0:
        return int((n * (n + 1) // 2).sum())
    w = window_left + 1  # keys a query sees once the window is full
    short = np.minimum(n, w)
    return int((short * (short + 1) // 2 + (n - short) * w).sum())


def training_flops(shape: ModelShape, tokens: int, pairs: float,
                   recompute: Recompute = NO_RECOMPUTE) -> StepFlops:
    """FLOPs of one sequence of ``tokens`` tokens whose attention, in every layer, computes
    ``pairs`` visible pairs (the mean over the layers where their masks differ)."""
    linear = shape.attention_linear + shape.mlp  # per token, one layer
    attention = shape.per_pair * pairs  # one layer
    forward = shape.layers * (linear * tokens + attention) + 2 * shape.hidden * shape.vocab * tokens
    again = recompute.layers * (linear * tokens + (0 if recompute.keeps_attention else attention))
    again += recompute.attention_layers * attention + recompute.mlp_layers * shape.mlp * tokens
    model = FWD_BWD * forward
    return StepFlops(model=float(model), hardware=float(model + again))


# How a run prints its count, and how a benchmark reads it back from the run's log (logs on
# file name the module where it was before it moved to decide/).
_LINE = "FLOPs per sequence (megatron_burst.decide.flops): model {:.6e}, with recompute {:.6e}"
_READ = re.compile(r"FLOPs per sequence \(megatron_burst\.(?:decide\.)?flops\): "
                   r"model ([\d.e+-]+), with recompute ([\d.e+-]+)")


def flops_line(step: StepFlops) -> str:
    """The line a run prints with its FLOPs per sequence (``read_flops`` reads it back)."""
    return _LINE.format(step.model, step.hardware)


def read_flops(log: str) -> StepFlops | None:
    """The last FLOPs line in a run's log (the running mean over all its sequences), or None."""
    found = _READ.findall(log)
    if not found:
        return None
    model, hardware = found[-1]
    return StepFlops(float(model), float(hardware))
