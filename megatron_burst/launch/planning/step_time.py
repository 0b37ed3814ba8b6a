"""What one training step takes, and what that makes of the job: the numbers `plan` and `slurm` use.

Attention is the time model's (``megatron_burst.decide.timing.predict``): the same prediction, for
the same topology, tokens and profile, that ranked the topologies and that `auto` chose by, so the
plan shows one time per layer, not two. Sliding-window layers (``model.window_size``) are
timed apart, step by step from their schedule (``scheduled_time``), and counted as many
times as the busiest stage has them. The rest of a layer is its matrix multiplies, FLOPs
at the GPU's achieved matmul rate (``Hardware.matmul_tflops``), and with TP > 1 its four
collectives per pass, timed on the profile's intra-node link (``timing.Link``). Recompute
repeats the forward (attention's too, unless remat-aware); selective recompute repeats
attention's forward. The logits cost the last stage; the 1F1B pipeline runs
(microbatches + PP - 1) stage times per step.

The rest of each layer (norms, RoPE, SwiGLU, residuals, the loss, launches) is calibrated:
``REST_PASSES`` passes over each token's row at the profile's memory rate, fitted to the
measured end-to-end runs (``tools.calibration``). Not counted: the data-parallel gradient reduction
(overlapped with the backward by --overlap-grad-reduce), the optimizer step, start-up and
checkpoint saves (``job_plan`` adds those for a job). MFU counts the
model's FLOPs (no recompute; causal attention as half the score matrix) against the
datasheet bf16 peak.
"""
from __future__ import annotations

import dataclasses
import math

from ...decide.flops import ModelShape, causal_pairs, training_flops
from ...decide.timing import Prediction, Profile, load_profile
from .attention_params import attention_params
from ..config.schema import Config
from .topology_candidates import chosen_prediction, window_prediction
from ..config.burst import tokens_per_rank
from .memory import layer_matmul_params, microbatches, padded_vocab

# The rest of a layer beyond its matmuls, attention and TP collectives (norms, RoPE, SwiGLU,
# residual adds, the loss, launches: Megatron's local, unfused layers), as passes over each
# token's (hidden + ffn) row in the training precision at the profile's memory rate, forward
# and backward. Fitted to the end-to-end runs on file by `python -m
# megatron_burst.tools.calibration benchmarks/results`, which prints every run's error.
REST_PASSES = 114.0
# What a job's time allows beyond the predicted steps: the calibrated model's worst
# under-prediction on those runs, rounded up to 5% (the same tool derives it).
STEP_MARGIN = 0.35

# The forward's share of a fwd+bwd attention call, by the time model's own convention
# (timing.predict counts fwd+bwd as 3.5x the forward's FLOPs).
ATTENTION_FORWARD_SHARE = 1 / 3.5


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds of one training step, by part, on the busiest pipeline stage."""

    attention: Prediction  # one full-attention layer, one microbatch, fwd+bwd
    window_attention: Prediction | None  # one sliding-window layer (None: the model has none)
    window_layers: int  # of the busiest stage's layers, those with a sliding window
    layers: int  # on the busiest stage
    microbatches: int
    pipeline: int
    attention_s: float  # per microbatch, all layers of the stage (recompute apart)
    matmul_s: float
    tp_comm_s: float
    recompute_s: float
    logits_s: float
    rest_pass_s: float  # one pass of REST_PASSES over the stage's layers (recompute included)
    rest_passes: float
    model_flops: float  # per step, whole job, no recompute
    tokens: int  # per step
    gpus: int
    peak_tflops: float | None

    @property
    def stage_s(self) -> float:
        """One microbatch through the busiest stage, forward and backward."""
        return (self.attention_s + self.matmul_s + self.tp_comm_s + self.recompute_s
                + self.logits_s + self.rest_s)

    @property
    def rest_s(self) -> float:
        """The calibrated rest of the layers, per microbatch."""
        return self.rest_passes * self.rest_pass_s

    @property
    def bubble_s(self) -> float:
        """The 1F1B pipeline's fill and drain: PP - 1 stage times."""
        return (self.pipeline - 1) * self.stage_s

    @property
    def step_s(self) -> float:
        return self.microbatches * self.stage_s + self.bubble_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.step_s / self.gpus

    @property
    def mfu(self) -> float | None:
        if self.peak_tflops is None:
            return None
        return self.model_flops / (self.step_s * self.gpus * self.peak_tflops * 1e12)


def _tp_collectives_s(cfg: Config, prof: Profile, tokens: int) -> float:
    """One layer's TP collectives, forward or backward: four (SP: two all-gathers and two
    reduce-scatters; without SP two all-reduces, as much traffic), each rank sending
    (t-1)/t of the layer's activations of its tokens, on the intra-node link."""
    t = cfg.parallel.tensor
    if t == 1:
        return 0.0
    elem = 2 if cfg.training.precision == "bf16" else 4
    return 4 * prof.intra.seconds(tokens * cfg.model.hidden_size * elem * (t - 1) / t)


def _rest_pass_s(cfg: Config, prof: Profile, tokens: int) -> float:
    """One pass over a layer's per-token rows (hidden, sequence-parallel with TP + SP; ffn
    split by TP) at the memory rate; full recompute repeats the forward's third."""
    m, p = cfg.model, cfg.parallel
    elem = 2 if cfg.training.precision == "bf16" else 4
    t_sp = p.tensor if p.sequence_parallel else 1
    row = m.hidden_size / t_sp + m.ffn_hidden_size / p.tensor
    repeat = 1 + (1 / 3 if cfg.training.recompute == "full" else 0)
    return repeat * tokens * row * elem / (prof.memory_gbps * 1e9)


def model_flops_per_step(cfg: Config) -> float:
    """Model FLOPs of one step of the whole model (``megatron_burst.decide.flops``, the count the
    entry point prints): linears (MLA's projections as they are), causal attention over each
    whole sequence (QK^T at Q/K's head dim, PV at V's; a windowed layer's band only), logits
    over the padded vocabulary; fwd+bwd, no recompute."""
    m = cfg.model
    whole = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tensor=1))
    shape = ModelShape(layers=m.num_layers, hidden=m.hidden_size, ffn_hidden=m.ffn_hidden_size,
                       heads=m.num_attention_heads, query_groups=m.num_query_groups,
                       head_dim=m.head_dim, vocab=padded_vocab(whole),
                       swiglu=m.activation == "swiglu", v_head_dim=m.v_dim,
                       projections=attention_params(whole)[0])
    s = m.seq_length
    windowed = m.window_layers(1, m.num_layers)
    pairs = ((m.num_layers - windowed) * causal_pairs([s])
             + windowed * causal_pairs([s], m.window[0] if m.window else -1)) / m.num_layers
    return training_flops(shape, s, pairs).model * cfg.training.global_batch_size


def stage_window_layers(cfg: Config) -> int:
    """Windowed layers of the busiest pipeline stage: the one with the most full-attention
    layers (Megatron numbers layers from 1 across the stages)."""
    layers = cfg.model.num_layers // cfg.parallel.pipeline
    return min(cfg.model.window_layers(k * layers + 1, layers)
               for k in range(cfg.parallel.pipeline))


def predict_step(cfg: Config) -> StepTime | None:
    """The step time of ``cfg``, or None where the time model has no profile (CPU ranks)."""
    hw = cfg.cluster.hardware
    if not hw.timed:
        return None
    m, p, tr = cfg.model, cfg.parallel, cfg.training
    prof = load_profile(cfg.cluster.profile_name)
    tokens = tokens_per_rank(cfg)
    attention = chosen_prediction(cfg)  # the row `plan` marks chosen: one time per layer
    window = window_prediction(cfg)
    layers = m.num_layers // p.pipeline
    windowed = stage_window_layers(cfg)
    rate = hw.matmul_tflops * 1e12
    matmul_fwd = 2 * tokens * layer_matmul_params(cfg) / rate
    tp_pass = _tp_collectives_s(cfg, prof, tokens)
    # Per layer, on average over the stage: windowed layers cost their band and hops.
    mix = [(layers - windowed, attention)] + ([(windowed, window)] if windowed else [])
    attention_s = sum(n * pred.serial_s for n, pred in mix)
    compute = (attention.compute_s if not windowed
               else sum(n * pred.compute_s for n, pred in mix) / layers)
    attention_fwd = compute * ATTENTION_FORWARD_SHARE
    if tr.recompute == "full":
        skip_attention = cfg.burst.remat_aware and p.context > 1
        recompute = matmul_fwd + tp_pass + (0.0 if skip_attention else attention_fwd)
    elif tr.recompute == "selective":
        recompute = attention_fwd
    else:
        recompute = 0.0
    logits = 3 * 2 * tokens * m.hidden_size * padded_vocab(cfg) / p.tensor / rate
    return StepTime(
        rest_pass_s=layers * _rest_pass_s(cfg, prof, tokens), rest_passes=REST_PASSES,
        attention=attention, window_attention=window, window_layers=windowed,
        layers=layers, microbatches=microbatches(cfg),
        pipeline=p.pipeline, attention_s=attention_s,
        matmul_s=layers * 3 * matmul_fwd, tp_comm_s=layers * 2 * tp_pass,
        recompute_s=layers * recompute, logits_s=logits,
        model_flops=model_flops_per_step(cfg), tokens=tr.global_batch_size * m.seq_length,
        gpus=cfg.cluster.world_size, peak_tflops=hw.peak_tflops)


def format_duration(seconds: float) -> str:
    """'2 d 15 h 12 min', '3 h 05 min', '4 min 50 s', '12.3 s' or '850 ms'."""
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    minutes = math.ceil(seconds / 60)
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    return f"{days} d {hours} h {minutes:02d} min" if days else f"{hours} h {minutes:02d} min"
