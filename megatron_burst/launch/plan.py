"""`megatron-burst plan`: check that a config can run, and say what it will cost.

``validate`` raises ConfigError naming the field for anything that would make Megatron or
BurstAttention fail at start-up (or, worse, run out of memory an hour in): sizes that do
not divide, a world size that does not add up, an inner ring that crosses nodes, memory
per GPU beyond the device. ``report`` renders the memory breakdown and the ring's
communication per step: the run's ``CPLayout`` (topology, resolved backward mode, bytes per
call) and ``attention_plan`` (whether the communication hides under the attention compute).
"""
from __future__ import annotations

import dataclasses

from ..cp_layout import CPLayout
from ..timing import choose, load_profile
from .attention_plan import attention_plan
from .config import Config, ConfigError
from .memory import GIB, estimate_memory, padded_vocab, remat_kept_bytes
from .units import UNITS_NOTE, format_bytes, format_count


# Head dims PyTorch's flash and cuDNN SDPA kernels (the GPU local kernels) run: a multiple
# of 8, at most 256. Anything else would fail at the first attention call, after queueing.
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 256


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"'{key}': {message}")


def cp_ranks_per_node(cfg: Config) -> int:
    """Ranks of one CP group that share a node.

    Megatron orders ranks tp-cp-dp-pp (TP innermost), so the CP group of a node's first
    GPU holds gpus_per_node / TP consecutive CP ranks there.
    """
    p = cfg.parallel
    return max(1, min(p.context, cfg.cluster.gpus_per_node // p.tensor))


def validate(cfg: Config) -> list[str]:
    """Raise ConfigError naming the field if ``cfg`` cannot run; return warnings."""
    m, p, tr, b, c = cfg.model, cfg.parallel, cfg.training, cfg.burst, cfg.cluster
    warnings: list[str] = []
    # Each number is already in its range (the loader's BOUNDS); here, how they combine.
    world = p.tensor * p.context * p.pipeline * p.data
    _require(world == c.world_size, "parallel.data",
             f"tensor x context x pipeline x data = {p.tensor} x {p.context} x {p.pipeline} x "
             f"{p.data} = {world}, but the cluster has {c.nodes} x {c.gpus_per_node} = "
             f"{c.world_size} GPUs")
    _require(c.gpus_per_node % p.tensor == 0, "parallel.tensor",
             f"{p.tensor} must divide gpus_per_node {c.gpus_per_node} (TP stays in a node)")

    # Model shape against the parallel sizes.
    _require(m.hidden_size % m.num_attention_heads == 0, "model.num_attention_heads",
             f"{m.num_attention_heads} does not divide hidden_size {m.hidden_size}")
    if c.gpu != "cpu":  # the CPU kernel takes any head dim
        d = m.hidden_size // m.num_attention_heads
        _require(d % HEAD_DIM_MULTIPLE == 0 and d <= MAX_HEAD_DIM, "model.num_attention_heads",
                 f"head dim hidden_size / num_attention_heads = {m.hidden_size} / "
                 f"{m.num_attention_heads} = {d}: PyTorch's flash and cuDNN attention kernels "
                 f"take a multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}")
    _require(m.num_attention_heads % m.num_query_groups == 0, "model.num_query_groups",
             f"{m.num_query_groups} does not divide num_attention_heads "
             f"{m.num_attention_heads}")
    _require(m.num_attention_heads % p.tensor == 0, "model.num_attention_heads",
             f"{m.num_attention_heads} heads do not divide over tensor parallel {p.tensor}")
    _require(m.num_query_groups % p.tensor == 0, "model.num_query_groups",
             f"{m.num_query_groups} KV heads do not divide over tensor parallel {p.tensor}")
    _require(m.ffn_hidden_size % p.tensor == 0, "model.ffn_hidden_size",
             f"{m.ffn_hidden_size} does not divide over tensor parallel {p.tensor}")
    _require(m.num_layers % p.pipeline == 0, "model.num_layers",
             f"{m.num_layers} layers do not divide over pipeline parallel {p.pipeline}")
    # The zigzag split cuts every sequence into 2 x CP equal chunks.
    _require(m.seq_length % (2 * p.context) == 0, "model.seq_length",
             f"{m.seq_length} is not divisible by 2 x parallel.context = {2 * p.context} "
             f"(zigzag cuts the sequence into 2 x CP chunks)")
    local = m.seq_length // p.context
    if p.sequence_parallel and p.tensor > 1:
        _require(local % p.tensor == 0, "model.seq_length",
                 f"the {local} tokens per CP rank do not divide over tensor parallel "
                 f"{p.tensor} (sequence parallelism splits them)")
    _require((m.max_position_embeddings or m.seq_length) >= m.seq_length,
             "model.max_position_embeddings",
             f"{m.max_position_embeddings} is shorter than seq_length {m.seq_length}")

    # BurstAttention: Ulysses splits heads, the double ring's inner ring must stay in a node.
    hq_local, hkv_local = m.num_attention_heads // p.tensor, m.num_query_groups // p.tensor
    # 'auto' picks a split that divides all of these (timing.candidates).
    u = 1 if b.ulysses_size == "auto" else b.ulysses_size
    _require(p.context % u == 0, "burst.ulysses_size",
             f"{u} does not divide parallel.context {p.context}")
    _require(hq_local % u == 0, "burst.ulysses_size",
             f"{u} does not divide the {hq_local} query heads per TP rank")
    _require(hkv_local % u == 0 or u % hkv_local == 0, "burst.ulysses_size",
             f"{u} and the {hkv_local} KV heads per TP rank: one must divide the other")
    _require(not b.remat_aware or tr.recompute == "full", "burst.remat_aware",
             "keeps attention's output for the full recompute: it needs training.recompute: "
             "full")
    per_node = cp_ranks_per_node(cfg)
    _require(b.intra_node_size == 1 or (p.context % b.intra_node_size == 0
                                        and b.intra_node_size % u == 0),
             "burst.intra_node_size",
             f"{b.intra_node_size} CP ranks per node must divide parallel.context {p.context} "
             f"and be a multiple of burst.ulysses_size {u}")
    _require(b.intra_node_size <= per_node, "burst.intra_node_size",
             f"{b.intra_node_size} CP ranks per node, but only {per_node} ranks of a CP group "
             f"share a node (gpus_per_node {c.gpus_per_node} / tensor {p.tensor}): the inner "
             f"ring would cross nodes")
    if per_node < p.context and b.intra_node_size < per_node:
        warnings.append(f"burst.intra_node_size = {b.intra_node_size} but {per_node} CP ranks "
                        f"share a node: set it to {per_node} to keep more hops on NVLink")

    # Batch.
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
        _require(1 <= tr.recompute_num_layers <= m.num_layers // p.pipeline,
                 "training.recompute_num_layers",
                 f"{tr.recompute_num_layers} must be between 1 and the "
                 f"{m.num_layers // p.pipeline} layers of a pipeline stage")

    if not cfg.data.mock:
        _require(bool(cfg.data.data_path), "data.data_path",
                 "set it (a ${VARIABLE} is fine) or set data.mock: true")
        if cfg.data.tokenizer_type != "NullTokenizer":
            _require(bool(cfg.data.tokenizer_model), "data.tokenizer_model",
                     f"tokenizer_type {cfg.data.tokenizer_type} needs a tokenizer model")

    if p.context > 1:
        attn = attention_plan(cfg)
        if not attn.comm_hidden:
            warnings.append("the ring's communication does not hide under attention compute "
                            "(see the per-step times): " + "; ".join(attn.notes))

    memory = estimate_memory(cfg)
    usable = cfg.cluster.hardware.memory_gib * GIB
    _require(memory.total <= usable, "cluster.gpu",
             f"needs {memory.total / GIB:.1f} GiB per GPU ({memory.stage} pipeline stage), "
             f"more than the {cfg.cluster.hardware.memory_gib:g} GiB of a {cfg.cluster.gpu}; "
             f"raise parallel.tensor/context/pipeline or use training.recompute: full")
    return warnings


def ring_traffic(cfg: Config) -> dict[str, object]:
    """What one CP rank sends per attention layer and microbatch, from the run's layout."""
    layout = CPLayout.from_run_config(cfg)
    other = dataclasses.replace(layout, backward="ring" if layout.backward == "burst" else "burst")
    tokens = cfg.training.micro_batch_size * cfg.model.seq_length // cfg.parallel.context
    fwd, bwd = layout.call_bytes(tokens)
    return {"layout": layout, "forward": fwd, "forward_hop": layout.hop_bytes(tokens),
            "backward": bwd, "other_backward": other.call_bytes(tokens)[1]}


def _ranked_layouts(cfg: Config, chosen: CPLayout) -> list[str]:
    """The time model's ranking of the layouts this run allows (the chosen one starred),
    and what remat-aware recompute keeps and saves."""
    m, p, b = cfg.model, cfg.parallel, cfg.burst
    tokens = cfg.training.micro_batch_size * m.seq_length // p.context
    prof = load_profile(cfg.cluster.profile_name)
    fixed = {} if b.ulysses_size == "auto" else dict(ulysses=b.ulysses_size)
    if b.intra_node_size != 1:
        fixed["ranks_per_node"] = b.intra_node_size
    ranked = choose(p.context, chosen.heads, tokens=tokens, causal=True, prof=prof,
                    cp_ranks_per_node=cp_ranks_per_node(cfg), **fixed)
    lines = [f"  time model (profile {prof.name}), per layer and microbatch, fastest first:"]
    lines += [f"    {'*' if r.layout == chosen else ' '} {r.describe()}" for r in ranked[:6]]
    if b.remat_aware:
        pred = next((r for r in ranked if r.layout == chosen), ranked[0])
        lines.append(f"  remat-aware recompute: keeps {format_bytes(remat_kept_bytes(cfg))} per "
                     f"layer and microbatch; saves the recomputed attention forward, "
                     f"~{pred.compute_s / 3.5 * 1e3:.1f} ms per layer and microbatch")
    return lines


def report(cfg: Config, warnings: list[str] | None = None) -> str:
    """The human-readable plan: shape, parallel layout, memory per GPU, ring traffic."""
    m, p, tr, b, c = cfg.model, cfg.parallel, cfg.training, cfg.burst, cfg.cluster
    hw = c.hardware
    mem = estimate_memory(cfg)
    gqa = (f"GQA {m.num_attention_heads}:{m.num_query_groups} in the whole model, "
           f"{m.num_attention_heads // p.tensor}:{m.num_query_groups // p.tensor} per TP rank"
           if m.num_query_groups != m.num_attention_heads else "MHA")
    out = [
        f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, ffn {m.ffn_hidden_size}, "
        f"{m.num_attention_heads} heads ({gqa}; d={m.head_dim}), vocab {m.vocab_size} "
        f"(padded {padded_vocab(cfg)}), {m.seq_length:,} tokens",
        f"cluster: {c.nodes} node(s) x {c.gpus_per_node} {c.gpu} "
        f"({hw.memory_gib:g} GiB, intra {hw.intra_node_gbps:g} GB/s, "
        f"inter {hw.inter_node_gbps:g} GB/s)",
        f"parallel: TP={p.tensor} CP={p.context} PP={p.pipeline} DP={p.data}"
        f"{' +SP' if p.sequence_parallel and p.tensor > 1 else ''}; "
        f"{m.seq_length // p.context:,} tokens per CP rank; micro batch "
        f"{tr.micro_batch_size}, global batch {tr.global_batch_size}; recompute {tr.recompute}",
        "",
        f"memory per GPU ({mem.stage} pipeline stage; {format_count(mem.params)} parameters "
        f"on each GPU):",
    ]
    out += [f"  {label:<12}{format_bytes(n, width=8)}" for label, n in mem.rows()]
    out.append(f"  {'device':<12}{hw.memory_gib:8.2f} GiB  -> fits, "
               f"{100 * mem.total / (hw.memory_gib * GIB):.0f}% used")
    if p.context > 1:
        t = ring_traffic(cfg)
        layout: CPLayout = t["layout"]
        if layout.cp <= cp_ranks_per_node(cfg):
            topo = f"flat ring of {layout.ring_size} inside one node (intra-node links)"
        elif layout.double:
            topo = (f"double ring: {layout.inner_ring} positions per node on NVLink x "
                    f"{layout.outer_ring} nodes over InfiniBand")
        else:
            topo = (f"flat ring of {layout.ring_size} across nodes (every step waits on "
                    f"InfiniBand)")
        other = "ring" if layout.backward == "burst" else "burst"
        out += [
            "",
            f"burst attention: {topo}"
            + (f", Ulysses all-to-all over {layout.ulysses}" if layout.ulysses > 1 else ""),
            f"  per layer and microbatch, each rank sends: forward {format_bytes(t['forward'])} "
            f"({layout.ring_size - 1} hop(s) of {format_bytes(t['forward_hop'])} K/V)",
            f"  backward '{layout.backward}' {format_bytes(t['backward'])} "
            f"(the '{other}' backward would send {format_bytes(t['other_backward'])})"
            + (" [chosen by auto]" if b.backward == "auto" else ""),
        ]
        out += [f"  {line}" for line in attention_plan(cfg).explain()]
        out += _ranked_layouts(cfg, layout)
    for w in warnings or []:
        out.append(f"warning: {w}")
    out.append(f"units: {UNITS_NOTE}")
    return "\n".join(out)


def make_plan(cfg: Config) -> str:
    """Validate ``cfg`` (raising ConfigError) and return its report."""
    return report(cfg, validate(cfg))
