"""One attention layer of a config: its parameters per TP rank, and what it keeps per token.

Per TP rank of size t, h the hidden size, hq query heads, hkv K/V heads, d Q/K's head dim and
dv V's (``ModelConfig.head_dim``, ``v_dim``):

- plain (GQA) attention: the QKV projection h x (hq + 2 hkv) d and the output projection
  hq dv x h, split by t; with ``qk_layernorm`` two norms of d, on every rank.
- multi-latent attention, as Megatron's local layer spec builds it (every projection a
  column- or row-parallel linear, so the down projections are split by t too): Q down
  h x q_lora and up q_lora x hq d (one h x hq d projection without q_lora); K/V down
  h x (kv_lora + d_rope) and up kv_lora x hq (d_nope + dv); the output hq dv x h; with
  ``qk_layernorm`` norms of q_lora and kv_lora, on every rank.
- attention sinks: ``learnable`` keeps one logit per query head, hq / t per rank (the layer's
  ``softmax_offset``, split by heads); ``off-by-one`` is a constant zero, no parameter.

Saved for backward per token (e bytes per element; the flash-style kernel keeps no s x s
term): Q, K and V (MLA: hq heads of d, d and dv), the output (dv) and an fp32 lse per head;
with MLA also the latents the up projections read (q_lora + kv_lora, and the shared RoPE key
of d_rope), twice with ``qk_layernorm`` (the norms' inputs too); with plain attention and
``qk_layernorm`` the Q/K norms' inputs. Sinks keep nothing per token: they are merged into
the output and lse the layer keeps anyway.
"""
from __future__ import annotations

from ...decide.flops import mla_projections
from ..config.schema import Config


def attention_params(cfg: Config) -> tuple[int, int]:
    """(matrix weights, vector weights: norms and sinks) of one attention layer on one TP
    rank."""
    m, t = cfg.model, cfg.parallel.tensor
    h, hq, d, dv = m.hidden_size, m.num_attention_heads, m.head_dim, m.v_dim
    if m.multi_latent_attention:
        matrices = mla_projections(h, hq, m.q_lora_rank, m.kv_lora_rank, d,
                                   m.qk_pos_emb_head_dim, dv)
        norms = (m.q_lora_rank or 0) + m.kv_lora_rank if m.qk_layernorm else 0
    else:
        matrices = h * (hq + 2 * m.num_query_groups) * d + hq * dv * h
        norms = 2 * d if m.qk_layernorm else 0
    return matrices // t, norms + m.sink_params // t


def attention_activation_bytes(cfg: Config, tokens: int, *, keep_lse: bool) -> int:
    """Bytes one attention layer keeps for backward for ``tokens`` tokens of this rank,
    beyond its input (``memory`` counts the norm and projection inputs); ``keep_lse``:
    False where selective recompute reruns the core attention."""
    m, t = cfg.model, cfg.parallel.tensor
    e = 2 if cfg.training.precision == "bf16" else 4
    hq, d, dv = m.num_attention_heads, m.head_dim, m.v_dim
    norms = 2 if m.qk_layernorm else 1
    if m.multi_latent_attention:
        qkv = e * tokens * hq * (2 * d + dv) // t
        latents = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_pos_emb_head_dim
        qkv += norms * e * tokens * latents
    else:
        qk = (hq + m.num_query_groups) * d
        qkv = e * tokens * (norms * qk + m.num_query_groups * dv) // t
    out = e * tokens * hq * dv // t
    lse = 4 * tokens * hq // t if keep_lse else 0
    return qkv + out + lse
