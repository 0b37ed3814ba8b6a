"""Attention sinks (gpt-oss's learnable softmax offset) as one more partial of the merge.

A sink is a logit ``s_h`` per query head that joins every row's softmax and contributes no
value: ``P_ij = exp(x_ij - L_i)`` with ``L_i = log(sum_j exp(x_ij) + exp(s_h))``, and the
output is ``sum_j P_ij v_j``. In the ring's online-softmax merge that is one more partial
with lse ``s_h`` and a zero output, merged once per row after every step (``merge_sinks``):

    lse' = logaddexp(lse, s_h),    out' = out * exp(lse - lse').

No kernel needs to know: the backward kernels, handed the merged (out', lse'), compute the
probabilities with the sink in their denominator, and their ``delta = rowsum(dO * O')`` is
the sink-aware one (the sink's own output is zero). What the sink adds is its gradient
(``sink_grad``): ``d s_h = -sum over the rows of head h of P_sink * delta``, with
``P_sink = exp(s_h - lse')`` and ``delta = rowsum(dO * O') - dlse`` (a gradient on lse'
reaches the sink through ``d lse' / d s_h = P_sink``). Each rank sums its own rows, as
Megatron's gradient reduction over the CP group expects of a replicated parameter.

A row that sees no key (padding) gets ``out' = 0`` and ``lse' = s_h``: never NaN.
"""
from __future__ import annotations

import torch


def check_sinks(sinks: object, heads: int, device: torch.device) -> None:
    """Raise ValueError unless ``sinks`` is None or one logit per query head."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a floating-point tensor of one logit per query head "
                         f"(or None), got {type(sinks).__name__}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must have shape [hq] = [{heads}] (one logit per query head "
                         f"of q), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks must be on q's device ({device}), got {sinks.device}")


def merge_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor,
                seq_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out', lse') with the sink merged into every row (see the module docstring).

    out: [b, s, h, dv] (``seq_first``: [s, b, h, dv]); lse: [b, h, s] in the working dtype.
    """
    merged = torch.logaddexp(lse, sinks.to(lse.dtype)[None, :, None])
    # A row that sees no key, in a head without a sink (-inf), keeps lse' = -inf and a zero
    # output: its factor is 0, not exp(-inf - -inf).
    keep = torch.exp(lse - merged).nan_to_num_(0.0).transpose(1, 2).unsqueeze(-1)
    if seq_first:
        keep = keep.transpose(0, 1)
    # One pass over the output, in its own dtype (a row's factor rounds once, as the
    # output's own elements do); ``out`` is the kernel's or the ring's fresh result.
    return out.mul_(keep.to(out.dtype)), merged


def sink_grad(dout: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor,
              dlse: torch.Tensor | None, sinks: torch.Tensor, seq_first: bool) -> torch.Tensor:
    """d loss / d sinks for this rank's rows, from the merged (out', lse')."""
    delta = torch.zeros_like(lse)
    if dout is not None:
        if seq_first:
            dout, out = dout.transpose(0, 1), out.transpose(0, 1)
        # rowsum(dO * O') summed in fp32 over products in the tensors' own dtype: one pass
        # over each, no fp32 copies of the two largest tensors of the backward.
        delta = torch.sum(dout * out, -1, dtype=lse.dtype).transpose(1, 2)
    if dlse is not None:
        delta = delta - dlse.to(lse.dtype)
    # exp(-inf - -inf) is NaN where a row without keys meets a head without a sink: no mass.
    p_sink = torch.exp(sinks.to(lse.dtype)[None, :, None] - lse).nan_to_num_(0.0)
    return -(p_sink * delta).sum((0, 2)).to(sinks.dtype)
