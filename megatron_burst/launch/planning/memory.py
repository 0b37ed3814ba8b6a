"""Per-GPU memory of a Megatron run: weights, gradients, optimizer state, activations.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), adapted in three ways:
- Context parallelism: every rank holds s/CP tokens of each sequence, so every activation
  term scales with the local token count T = micro_batch * seq_length / CP.
- The attention kernel is flash-style (BurstAttention's local kernels return out and lse),
  so there is no s^2 score or softmax term: attention keeps Q, K, V (GQA: only hkv heads),
  its output and an fp32 log-sum-exp per query row.
- Llama blocks: RMSNorm, SwiGLU (fc1 is 2*ffn wide), no dropout (so no masks).

Per layer, with e bytes per element, TP size t, and SP dividing the sequence-sharded
tensors by t too (Korthikanti's Table 2 "sequence parallel" column):
  norm inputs (2x)       2 * e*T*h / t_sp
  qkv and fc1 inputs     2 * e*T*h / t_sp     (with SP the pre-all-gather shard is saved)
  Q, K, V                e*T*(hq + 2*hkv)*d / t
  attention out, lse     e*T*hq*d / t + 4*T*hq / t
  fc1 out, fc2 input     e*T*(2f + f) / t     (SwiGLU; GeLU: e*T*(f + f) / t)
where t_sp = t with sequence parallelism and 1 without. Attention's terms (and its
parameters) for MLA's two head dims and latents, Q/K norms and sinks are
``attention_params``'s.

Weights/gradients/optimizer follow Megatron's mixed precision with the distributed
optimizer: bf16 weights (2 bytes), fp32 main gradients (4), and fp32 master weights plus
Adam's two moments (12) sharded over the data-parallel x context-parallel group, which is
the group Megatron's distributed optimizer shards over when CP > 1.

Transient workspace: the layer being recomputed in backward, one layer's gradients, and
the ring's buffers and fp32 accumulators (``ring_buffer_bytes``).

The pipeline schedule is 1F1B: the first stage holds min(PP, microbatches) microbatches in
flight, the last stage one microbatch plus the logits. Both stages are estimated; the plan
reports the larger.
"""
from __future__ import annotations

import dataclasses
import math

from .attention_params import attention_activation_bytes, attention_params
from ..config.schema import Config
from ..config.burst import topology_of

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU on the most loaded pipeline stage, by kind."""

    stage: str  # 'only', 'first' or 'last'
    params: int  # parameter count on this GPU
    weights: int
    gradients: int
    optimizer: int
    activations: int  # saved for backward, all in-flight microbatches
    logits: int  # output layer + cross-entropy (last stage only)
    workspace: int  # transient: one layer recomputed/back-propagated at a time
    reserved: int  # CUDA context, NCCL, fragmentation (from the hardware table)

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.logits + self.workspace + self.reserved)

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) pairs in report order, total last."""
        return [("weights", self.weights), ("gradients", self.gradients),
                ("optimizer", self.optimizer), ("activations", self.activations),
                ("logits", self.logits), ("workspace", self.workspace),
                ("reserved", self.reserved), ("total", self.total)]


def padded_vocab(cfg: Config) -> int:
    """Vocabulary size after Megatron pads it to a multiple of divisible_by x TP."""
    multiple = cfg.model.make_vocab_size_divisible_by * cfg.parallel.tensor
    return math.ceil(cfg.model.vocab_size / multiple) * multiple


def layer_params(cfg: Config) -> int:
    """Parameters of one transformer layer on one TP rank (norm weights replicated)."""
    vectors = attention_params(cfg)[1]
    return layer_matmul_params(cfg) + vectors + 2 * cfg.model.hidden_size


def layer_matmul_params(cfg: Config) -> int:
    """The matrix weights of one layer on one TP rank: attention's projections (MLA's down
    and up ones) and the MLP's, what the matmuls' FLOPs count."""
    m = cfg.model
    mlp = (3 if m.activation == "swiglu" else 2) * m.hidden_size * m.ffn_hidden_size
    return attention_params(cfg)[0] + mlp // cfg.parallel.tensor


def stage_params(cfg: Config, stage: str) -> int:
    """Parameters on one GPU of pipeline stage 'only', 'first' or 'last'."""
    m, t = cfg.model, cfg.parallel.tensor
    layers = m.num_layers // cfg.parallel.pipeline
    vocab = padded_vocab(cfg) * m.hidden_size // t
    n = layers * layer_params(cfg)
    if stage in ("only", "first"):
        n += vocab  # input embedding
    if stage in ("only", "last"):
        n += m.hidden_size  # final norm
        # The output layer; tied embeddings share the input table when PP = 1, and the
        # last stage keeps its own copy when PP > 1 (Megatron syncs the two).
        if m.untie_embeddings or stage == "last":
            n += vocab
    return n


def _elem_bytes(cfg: Config) -> int:
    return 2 if cfg.training.precision == "bf16" else 4


def layer_activation_bytes(cfg: Config, recompute: str) -> int:
    """Bytes one transformer layer saves for backward for one microbatch.

    ``recompute``: 'none' keeps everything; 'selective' recomputes core attention (keeps
    Q, K, V and drops only the kernel's lse: with a flash-style kernel there is no s^2
    term left to save); 'full' keeps only the layer input.
    """
    m, p = cfg.model, cfg.parallel
    e, t = _elem_bytes(cfg), p.tensor
    tokens = cfg.training.micro_batch_size * m.seq_length // p.context
    t_sp = t if p.sequence_parallel else 1
    layer_input = e * tokens * m.hidden_size // t_sp
    if recompute == "full":
        return layer_input
    norms_and_linear_inputs = 4 * layer_input
    attention = attention_activation_bytes(cfg, tokens, keep_lse=recompute != "selective")
    mlp = e * tokens * ((3 if m.activation == "swiglu" else 2) * m.ffn_hidden_size) // t
    return norms_and_linear_inputs + attention + mlp


def remat_kept_bytes(cfg: Config) -> int:
    """What remat-aware recompute keeps per layer and microbatch: the attention output
    (e bytes per element) and its fp32 lse, this rank's tokens and heads."""
    m, p = cfg.model, cfg.parallel
    tokens = cfg.training.micro_batch_size * m.seq_length // p.context
    heads = m.num_attention_heads // p.tensor
    return tokens * heads * (m.v_dim * _elem_bytes(cfg) + 4)


def microbatches(cfg: Config) -> int:
    """Micro-batches per step on each data-parallel rank."""
    tr, p = cfg.training, cfg.parallel
    return max(1, tr.global_batch_size // (tr.micro_batch_size * p.data))


def _stage_activations(cfg: Config, stage: str) -> tuple[int, int]:
    """(saved activations, transient workspace) for one GPU of ``stage``."""
    tr, p = cfg.training, cfg.parallel
    layers = cfg.model.num_layers // p.pipeline
    full = layer_activation_bytes(cfg, "none")
    if tr.recompute == "full":
        ckpt = layer_activation_bytes(cfg, "full")
        if tr.recompute_method == "uniform":
            # One checkpoint per group of recompute_num_layers; backward rebuilds one group.
            group = min(tr.recompute_num_layers, layers)
            per_mb = math.ceil(layers / group) * ckpt
            workspace = group * full
        else:  # block: the first recompute_num_layers layers of the stage are recomputed
            recomputed = min(tr.recompute_num_layers, layers)
            per_mb = recomputed * ckpt + (layers - recomputed) * full
            workspace = full if recomputed else 0
    else:
        per_mb = layers * layer_activation_bytes(cfg, tr.recompute)
        workspace = 0
    if tr.recompute == "full" and cfg.burst.remat_aware and p.context > 1:
        per_mb += layers * remat_kept_bytes(cfg)  # each layer's kept attention output
    in_flight = min(p.pipeline, microbatches(cfg)) if stage == "first" else 1
    # Layer-gradient transient: one layer's input-sized gradients live at a time. The ring's
    # K/V double buffers and fp32 accumulators (the cost model's figure) live one layer at
    # a time too.
    workspace += 2 * layer_activation_bytes(cfg, "full")
    if p.context > 1:
        workspace += ring_buffer_bytes(cfg)
    return in_flight * per_mb, workspace


def ring_buffer_bytes(cfg: Config) -> int:
    """What one attention layer's ring holds per rank while it runs: the fp32 output and dQ
    accumulators, the K/V double buffer, and the fp32 dK/dV accumulators in flight."""
    topology = topology_of(cfg)
    hq, hkv = topology.ring_heads
    d, dv, e = topology.heads.head_dim, topology.heads.v_head_dim, topology.heads.elem_bytes
    tokens = cfg.training.micro_batch_size * cfg.model.seq_length // topology.ring_size
    return (tokens * hq * (dv + d) * 4              # fp32 out (V's dim) and dQ accumulators
            + 2 * tokens * hkv * (d + dv) * e       # K/V double buffer
            + tokens * hkv * (d + dv) * 4 * 2)      # dK/dV accumulators in flight


def _logits_bytes(cfg: Config) -> int:
    """Output layer and vocab-parallel cross-entropy of one microbatch (last stage).

    The cross-entropy keeps an fp32 softmax of the logits for backward; at its peak the
    bf16 logits are alive beside it. The final norm and output-layer inputs are counted too.
    """
    m, p = cfg.model, cfg.parallel
    e = _elem_bytes(cfg)
    tokens = cfg.training.micro_batch_size * m.seq_length // p.context
    t_sp = p.tensor if p.sequence_parallel else 1
    logits = (4 + e) * tokens * padded_vocab(cfg) // p.tensor
    return logits + 2 * e * tokens * m.hidden_size // t_sp


def estimate_stage(cfg: Config, stage: str) -> MemoryEstimate:
    """Memory of one GPU in pipeline stage 'only' (PP = 1), 'first' or 'last'."""
    p, tr = cfg.parallel, cfg.training
    n = stage_params(cfg, stage)
    bf16 = tr.precision == "bf16"
    # fp32 main grads always (Megatron forces fp32 grad accumulation with bf16).
    weights, grads = n * (2 if bf16 else 4), n * 4
    # fp32 master copy (bf16 only) + Adam exp_avg + exp_avg_sq.
    optim = n * ((4 if bf16 else 0) + 8)
    if tr.distributed_optimizer:
        optim = optim // (p.data * p.context)
    acts, workspace = _stage_activations(cfg, stage)
    logits = _logits_bytes(cfg) if stage in ("only", "last") else 0
    return MemoryEstimate(stage=stage, params=n, weights=weights, gradients=grads,
                          optimizer=optim, activations=acts, logits=logits,
                          workspace=workspace,
                          reserved=int(cfg.cluster.hardware.reserved_gib * GIB))


def estimate_memory(cfg: Config) -> MemoryEstimate:
    """The most loaded pipeline stage's memory per GPU."""
    if cfg.parallel.pipeline == 1:
        return estimate_stage(cfg, "only")
    return max((estimate_stage(cfg, s) for s in ("first", "last")), key=lambda m: m.total)
