"""`megatron-burst plan`: check that a config can run, and say what it will cost.

``validate`` raises ConfigError naming the field for anything that would make Megatron or
BurstAttention fail at start-up (or, worse, run out of memory an hour in): sizes that do
not divide, a world size that does not add up, an inner ring that crosses nodes, memory
per GPU beyond the device, head dims the GPU kernels cannot run (MLA's Q/K and V dims each),
MLA latents that do not split over TP. ``plan_report.report``
renders what it costs: memory per GPU, the ring's bytes, the topologies the time model ranked,
and the step and job time (``step_time``), all from one time model
(``megatron_burst.decide.timing``).
"""
from __future__ import annotations

import re

from ...decide.topology import CPTopology, TopologyError
from ...decide.options import AUTO
from ...decide.timing import load_profile
from ...kernels.limits import FUSED_HEAD_DIM_MULTIPLE, FUSED_MAX_HEAD_DIM, fused_head_dim_ok
from ..config.schema import Config, ConfigError
from .topology_candidates import chosen_prediction
from ..config.burst import config_key, max_intra_node_size_of, run_problem, topology_of
from .memory import GIB, estimate_memory
from .report import report

# The share of an attention call spent waiting on links above which `plan` warns.
EXPOSED_WARNING = 0.05


# Head dims the GPU local kernels run (their own numbers, read without torch): anything
# else would fail at the first attention call, after queueing.
HEAD_DIM_MULTIPLE, MAX_HEAD_DIM = FUSED_HEAD_DIM_MULTIPLE, FUSED_MAX_HEAD_DIM


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"'{key}': {message}")


def _check_head_dims(cfg: Config) -> None:
    """Q/K's and V's head dims (MLA's differ) must be ones the GPU kernels run."""
    m = cfg.model
    if m.multi_latent_attention:
        dims = [("model.qk_head_dim", m.head_dim, f"Q/K head dim qk_head_dim + "
                 f"qk_pos_emb_head_dim = {m.qk_head_dim} + {m.qk_pos_emb_head_dim}"),
                ("model.v_head_dim", m.v_dim, "V head dim v_head_dim")]
    else:
        dims = [("model.num_attention_heads", m.head_dim, f"head dim hidden_size / "
                 f"num_attention_heads = {m.hidden_size} / {m.num_attention_heads}")]
    for key, d, what in dims:
        _require(fused_head_dim_ok(d), key,
                 f"{what} = {d}: PyTorch's flash and cuDNN attention kernels take a multiple "
                 f"of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}")


def _check_mla(cfg: Config) -> None:
    """MLA's down projections are column-parallel in Megatron's local spec: their outputs
    split over TP; and its RoPE runs inside attention, which document masks cannot move."""
    m, t = cfg.model, cfg.parallel.tensor
    if m.q_lora_rank is not None:
        _require(m.q_lora_rank % t == 0, "model.q_lora_rank",
                 f"{m.q_lora_rank} does not divide over tensor parallel {t} (the Q down "
                 f"projection's output is split over TP)")
    _require((m.kv_lora_rank + m.qk_pos_emb_head_dim) % t == 0, "model.kv_lora_rank",
             f"kv_lora_rank + qk_pos_emb_head_dim = {m.kv_lora_rank} + "
             f"{m.qk_pos_emb_head_dim} does not divide over tensor parallel {t} (the K/V down "
             f"projection's output is split over TP)")
    _require(not cfg.data.document_mask, "data.document_mask",
             "document masks do not support multi-latent attention (its RoPE is applied "
             "inside the attention, at positions 0..s-1)")


def validate(cfg: Config) -> list[str]:
    """Raise ConfigError naming the field if ``cfg`` cannot run; return warnings.

    Each number is already in its range (the loader's BOUNDS); here, how they combine. Each
    check names the key it is about, so the key blamed is the one the check reads.
    """
    _check_world(cfg)
    _check_model_shape(cfg)
    _check_sequence(cfg)
    _check_burst(cfg)
    _check_training(cfg)
    _check_data(cfg)
    warnings = _ring_warnings(cfg) + _window_warnings(cfg) + _exposed_warnings(cfg)
    _check_memory(cfg)
    return warnings


def _check_world(cfg: Config) -> None:
    """The parallel sizes multiply to the cluster's GPUs; TP stays in a node."""
    p, c = cfg.parallel, cfg.cluster
    world = p.tensor * p.context * p.pipeline * p.data
    _require(world == c.world_size, "parallel.data",
             f"tensor x context x pipeline x data = {p.tensor} x {p.context} x {p.pipeline} x "
             f"{p.data} = {world}, but the cluster has {c.nodes} x {c.gpus_per_node} = "
             f"{c.world_size} GPUs")
    _require(c.gpus_per_node % p.tensor == 0, "parallel.tensor",
             f"{p.tensor} must divide gpus_per_node {c.gpus_per_node} (TP stays in a node)")


def _check_model_shape(cfg: Config) -> None:
    """The model's shape against the parallel sizes (and the GPU kernels' head dims)."""
    m, p = cfg.model, cfg.parallel
    _require(m.hidden_size % m.num_attention_heads == 0, "model.num_attention_heads",
             f"{m.num_attention_heads} does not divide hidden_size {m.hidden_size}")
    if cfg.cluster.gpu != "cpu":  # the CPU kernel takes any head dim
        _check_head_dims(cfg)
    _require(m.num_attention_heads % m.num_query_groups == 0, "model.num_query_groups",
             f"{m.num_query_groups} does not divide num_attention_heads "
             f"{m.num_attention_heads}")
    _require(m.num_attention_heads % p.tensor == 0, "model.num_attention_heads",
             f"{m.num_attention_heads} heads do not divide over tensor parallel {p.tensor}")
    _require(m.num_query_groups % p.tensor == 0, "model.num_query_groups",
             f"{m.num_query_groups} KV heads do not divide over tensor parallel {p.tensor}")
    if m.multi_latent_attention:
        _check_mla(cfg)
    _require(m.ffn_hidden_size % p.tensor == 0, "model.ffn_hidden_size",
             f"{m.ffn_hidden_size} does not divide over tensor parallel {p.tensor}")
    _require(m.num_layers % p.pipeline == 0, "model.num_layers",
             f"{m.num_layers} layers do not divide over pipeline parallel {p.pipeline}")


def _check_sequence(cfg: Config) -> None:
    """The sequence splits over CP (zigzag: 2 x CP chunks) and, with SP, over TP."""
    m, p = cfg.model, cfg.parallel
    divisor = CPTopology.seq_len_divisor(p.context)
    _require(m.seq_length % divisor == 0, "model.seq_length",
             f"{m.seq_length} is not divisible by 2 x parallel.context = {divisor} "
             f"(zigzag cuts the sequence into 2 x CP chunks)")
    local = m.seq_length // p.context
    if p.sequence_parallel and p.tensor > 1:
        _require(local % p.tensor == 0, "model.seq_length",
                 f"the {local} tokens per CP rank do not divide over tensor parallel "
                 f"{p.tensor} (sequence parallelism splits them)")
    _require((m.max_position_embeddings or m.seq_length) >= m.seq_length,
             "model.max_position_embeddings",
             f"{m.max_position_embeddings} is shorter than seq_length {m.seq_length}")


# The config key of each setting a TopologyError can blame that is not a BurstOptions field.
_TOPOLOGY_KEYS = {"cp": "parallel.context", "num_attention_heads": "model.num_attention_heads",
                  "num_query_groups": "model.num_query_groups"}


def _check_burst(cfg: Config) -> None:
    """BurstAttention: the one resolver checks the Ulysses split against the heads and the
    double ring against the group (``options.resolve``, as every run resolves it)."""
    b, c, p = cfg.burst, cfg.cluster, cfg.parallel
    problem = run_problem(cfg)  # the schema's rules between options and the run
    if problem is not None:
        raise problem
    try:  # the time model's profile, read by 'auto' and by the step time
        load_profile(c.profile_name)
    except ValueError as e:
        raise ConfigError(f"'cluster.profile': {e}") from None
    try:
        topology_of(cfg)
    except TopologyError as e:
        key = _TOPOLOGY_KEYS.get(e.setting) or config_key(e.setting)
        raise ConfigError(f"'{key}': {e}") from None
    except ValueError as e:  # what else the resolver reads: the time model's profile
        raise ConfigError(f"'cluster.profile': {e}") from None
    most = max_intra_node_size_of(cfg)
    inner = b.intra_node_size if isinstance(b.intra_node_size, int) else None
    _require(inner is None or inner <= most, "burst.intra_node_size",
             f"{inner} CP ranks per node, but only {most} ranks of a CP group share a node "
             f"(gpus_per_node {c.gpus_per_node} / tensor {p.tensor}): the inner ring would "
             f"cross nodes")


def _check_training(cfg: Config) -> None:
    """Batch, learning-rate schedule and recompute."""
    tr, p = cfg.training, cfg.parallel
    _require(tr.global_batch_size % (tr.micro_batch_size * p.data) == 0,
             "training.global_batch_size",
             f"{tr.global_batch_size} is not a multiple of micro_batch_size x data = "
             f"{tr.micro_batch_size} x {p.data}")
    # Megatron's scheduler asserts warmup < decay iterations (= train_iters by default).
    _require(tr.lr_warmup_iters < tr.train_iters, "training.lr_warmup_iters",
             f"{tr.lr_warmup_iters} warmup iterations must be fewer than train_iters "
             f"{tr.train_iters}")
    _require(tr.min_lr <= tr.lr, "training.min_lr",
             f"{tr.min_lr:g} is above lr {tr.lr:g}: the schedule decays from lr to min_lr")
    if tr.recompute == "full":
        stage_layers = cfg.model.num_layers // p.pipeline
        _require(1 <= tr.recompute_num_layers <= stage_layers,
                 "training.recompute_num_layers",
                 f"{tr.recompute_num_layers} must be between 1 and the "
                 f"{stage_layers} layers of a pipeline stage")


def _check_data(cfg: Config) -> None:
    """Real data needs a path, and a tokenizer model unless it is the NullTokenizer; a mask
    builder is named as module:function, alone, with one sequence per micro batch."""
    d = cfg.data
    if d.mask_builder is not None:
        _check_mask_builder(cfg)
    if d.mock:
        return
    _require(bool(d.data_path), "data.data_path",
             "set it (a ${VARIABLE} is fine) or set data.mock: true")
    if d.tokenizer_type != "NullTokenizer":
        _require(bool(d.tokenizer_model), "data.tokenizer_model",
                 f"tokenizer_type {d.tokenizer_type} needs a tokenizer model")


def _check_mask_builder(cfg: Config) -> None:
    """--burst-mask-builder's rules, checked here so a job is not queued to fail at start-up
    (the run imports the function: `run --dry-run` imports its module by name)."""
    d = cfg.data
    module, _, function = d.mask_builder.partition(":")
    _require(bool(re.fullmatch(r"[A-Za-z_][\w.]*", module))
             and function.isidentifier(), "data.mask_builder",
             f"must be module:function (e.g. megatron_burst.megatron.mask_batches:prefix_lm), "
             f"got {d.mask_builder!r}")
    _require(not d.document_mask, "data.mask_builder",
             "cannot be combined with data.document_mask (the builder "
             "megatron_burst.megatron.mask_batches:documents is document masks as a slice "
             "mask)")
    _require(cfg.training.micro_batch_size == 1, "data.mask_builder",
             f"makes one mask per sequence: it needs training.micro_batch_size 1, got "
             f"{cfg.training.micro_batch_size}")
    _require(not cfg.model.multi_latent_attention, "data.mask_builder",
             "slice masks do not support multi-latent attention (its RoPE is applied inside "
             "the attention, at positions 0..s-1)")


def _check_memory(cfg: Config) -> None:
    """The estimated memory per GPU fits the device."""
    memory = estimate_memory(cfg)
    usable = cfg.cluster.hardware.memory_gib * GIB
    _require(memory.total <= usable, "cluster.gpu",
             f"needs {memory.total / GIB:.1f} GiB per GPU ({memory.stage} pipeline stage), "
             f"more than the {cfg.cluster.hardware.memory_gib:g} GiB of a {cfg.cluster.gpu}; "
             f"raise parallel.tensor/context/pipeline or use training.recompute: full")


def _ring_warnings(cfg: Config) -> list[str]:
    """A fixed inner ring smaller than the CP ranks that share a node."""
    b, p = cfg.burst, cfg.parallel
    most = max_intra_node_size_of(cfg)
    inner = b.intra_node_size if isinstance(b.intra_node_size, int) else None
    if b.intra_node_size != AUTO and most < p.context and (inner or 1) < most:
        return [f"burst.intra_node_size = {b.intra_node_size} but {most} CP ranks "
                f"share a node: set it to {most} to keep more hops on NVLink"]
    return []


def _window_warnings(cfg: Config) -> list[str]:
    """A sliding window that reaches over the whole sequence."""
    m = cfg.model
    if m.window is not None and m.window[0] >= m.seq_length - 1:
        return [f"model.window_size {list(m.window)} reaches back over the whole "
                f"{m.seq_length}-token sequence: its windowed layers attend fully"]
    return []


def _exposed_warnings(cfg: Config) -> list[str]:
    """The time model's ring waiting on its links for more than EXPOSED_WARNING of a call."""
    if not (cfg.parallel.context > 1 and cfg.cluster.hardware.timed):
        return []
    attention = chosen_prediction(cfg)
    if attention.exposed_comm_s > EXPOSED_WARNING * attention.total_s:
        return [f"the ring's communication is exposed: the time model predicts "
                f"{attention.exposed_comm_s * 1e3:.2f} ms of "
                f"{attention.total_s * 1e3:.2f} ms per layer waiting on links; "
                f"raise tokens per rank, use the double ring "
                f"(burst.intra_node_size) or Ulysses (burst.ulysses_size)"]
    return []


def make_plan(cfg: Config, notes: list[str] | None = None) -> str:
    """Validate ``cfg`` (raising ConfigError) and return its report; ``notes`` (what a
    command changed, e.g. --nodes) lead it."""
    return report(cfg, validate(cfg), notes)
