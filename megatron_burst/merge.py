"""The online-softmax merge of partial attention results (BurstAttention's GAO).

Attention over a union of key sets is a weighted mean of the attention over each set,
weighted by each set's softmax mass exp(lse). Folding one partial (o_j, lse_j) into the
running (o, lse):

    lse' = logaddexp(lse, lse_j)
    o'   = exp(lse - lse') * o + exp(lse_j - lse') * o_j

Both weights are <= 1, so nothing overflows, and a row that has seen no key yet carries
lse = -inf: its weight is exactly 0 and it cannot pollute the result. A row that no block
ever saw ends with o = 0 and lse = -inf, never NaN.
"""
from __future__ import annotations

import torch


def merge_partial(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
                  block_lse: torch.Tensor) -> None:
    """Fold ``(block_out, block_lse)`` into the fp32 accumulators ``(out, lse)`` in place.

    out, block_out: [b, s, h, d] (views allowed); lse, block_lse: [b, h, s] fp32.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    # -inf - -inf is NaN; where nothing has been seen at all both weights must be 0.
    ref = new_lse.masked_fill(torch.isneginf(new_lse), 0.0)
    w_old = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(block_lse - ref).transpose(1, 2).unsqueeze(-1)
    out.mul_(w_old).add_(block_out.to(out.dtype) * w_new)
    lse.copy_(new_lse)
