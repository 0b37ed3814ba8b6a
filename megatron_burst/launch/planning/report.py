"""The text `megatron-burst plan` prints: shape, memory per GPU, the ring, the topologies ranked,
the step and the job.

Every time in it comes from one time model, ``megatron_burst.decide.timing`` with the cluster's
profile: the attention time of the chosen topology is the row the topology table marks, and the
step time (``step_time``) is built on that same number. Sizes are binary units (``units``).
"""
from __future__ import annotations

import dataclasses

from ...decide.topology import CPTopology
from ...decide.machine import measured_when
from ...decide.timing import PROFILES_DIR, load_profile
from ..config.schema import Config
from ..config.burst import max_intra_node_size_of, tokens_per_rank, topology_of
from .topology_candidates import tie_note, topology_rows, window_prediction
from .memory import GIB, estimate_memory, padded_vocab, remat_kept_bytes, ring_buffer_bytes
from .step_time import (ATTENTION_FORWARD_SHARE, STEP_MARGIN, StepTime, format_duration,
                        predict_step)
from .units import UNITS_NOTE, format_bytes, format_count
from .job_plan import job_plan


def ring_traffic(cfg: Config) -> dict[str, object]:
    """What one CP rank sends per attention layer and microbatch, from the run's topology."""
    topology = topology_of(cfg)
    other = dataclasses.replace(topology,
                                backward="ring" if topology.backward == "burst" else "burst")
    tokens = tokens_per_rank(cfg)
    fwd, bwd = topology.call_bytes(tokens)
    return {"topology": topology, "forward": fwd, "forward_hop": topology.hop_bytes(tokens),
            "backward": bwd, "other_backward": other.call_bytes(tokens)[1]}


def _shape_lines(cfg: Config) -> list[str]:
    m, p, tr, c = cfg.model, cfg.parallel, cfg.training, cfg.cluster
    hw, prof = c.hardware, load_profile(c.profile_name)
    gqa = (f"GQA {m.num_attention_heads}:{m.num_query_groups} in the whole model, "
           f"{m.num_attention_heads // p.tensor}:{m.num_query_groups // p.tensor} per TP rank"
           if m.num_query_groups != m.num_attention_heads else "MHA")
    where = (f"{prof.name}.json" if (PROFILES_DIR / f"{prof.name}.json").is_file()
             else c.profile_name)
    matmul = (f"; matmuls at {hw.matmul_tflops:g} TFLOP/s" if hw.matmul_tflops else "")
    heads = (f"{m.num_attention_heads} heads ({gqa}; d={m.head_dim})"
             if not m.multi_latent_attention else f"{m.num_attention_heads} heads (MLA)")
    return [
        f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, ffn {m.ffn_hidden_size}, "
        f"{heads}, vocab {m.vocab_size} (padded {padded_vocab(cfg)}), {m.seq_length:,} tokens",
        *attention_variant_lines(cfg),
        f"cluster: {c.nodes} node(s) x {c.gpus_per_node} {c.gpu} ({hw.memory_gib:g} GiB each)",
        f"time model: profile {prof.name} ({where}, {measured_when(prof)}; its 'source' says "
        f"how it was made): links "
        f"intra {prof.intra.gbps:g} GB/s, inter {prof.inter.gbps:g} GB/s, attention kernel "
        f"up to {prof.dense.peak_tflops:g} TFLOP/s{matmul}",
        f"parallel: TP={p.tensor} CP={p.context} PP={p.pipeline} DP={p.data}"
        f"{' +SP' if p.sequence_parallel and p.tensor > 1 else ''}; "
        f"{m.seq_length // p.context:,} tokens per CP rank; micro batch "
        f"{tr.micro_batch_size}, global batch {tr.global_batch_size}; recompute {tr.recompute}",
    ]


def attention_variant_lines(cfg: Config) -> list[str]:
    """What the model's attention is beyond Llama's: MLA's dims, sinks, windowed layers."""
    m, t = cfg.model, cfg.parallel.tensor
    out = []
    if m.multi_latent_attention:
        q = (f"Q from a {m.q_lora_rank}-dim latent" if m.q_lora_rank is not None
             else "Q projected at full rank")
        out.append(f"  multi-latent attention: Q/K heads of {m.head_dim} ({m.qk_head_dim} + "
                   f"RoPE {m.qk_pos_emb_head_dim}), V heads of {m.v_dim}; {q}, K/V from a "
                   f"{m.kv_lora_rank}-dim latent; the ring moves K and V at their own dims")
    if m.softmax_type != "vanilla":
        what = (f"learnable attention sinks: {m.num_attention_heads} logits per layer "
                f"({m.num_attention_heads // t} per TP rank)" if m.softmax_type == "learnable"
                else "softmax off by one (a zero sink logit)")
        out.append(f"  {what}; merged per row after the ring: no bytes, no measurable FLOPs")
    if m.window is not None:
        windowed = m.window_layers(1, m.num_layers)
        skip = (f"full attention on the layers numbered a multiple of "
                f"{m.window_attn_skip_freq}" if m.window_attn_skip_freq else "every layer")
        out.append(f"  sliding window of {m.window[0]} earlier keys on {windowed} of "
                   f"{m.num_layers} layers ({skip})")
    return out


def _memory_lines(cfg: Config) -> list[str]:
    hw = cfg.cluster.hardware
    mem = estimate_memory(cfg)
    out = ["", f"memory per GPU ({mem.stage} pipeline stage; {format_count(mem.params)} "
               f"parameters on each GPU):"]
    out += [f"  {label:<12}{format_bytes(n, width=8)}" for label, n in mem.rows()]
    out.append(f"  {'device':<12}{hw.memory_gib:8.2f} GiB  -> fits, "
               f"{100 * mem.total / (hw.memory_gib * GIB):.0f}% used")
    return out


def _topology(cfg: Config, topology: CPTopology) -> str:
    if topology.cp <= max_intra_node_size_of(cfg):
        return f"flat ring of {topology.ring_size} inside one node (intra-node links)"
    if topology.double:
        return (f"double ring: {topology.positions_per_node} positions per node on NVLink x "
                f"{topology.outer_ring} nodes over InfiniBand")
    return f"flat ring of {topology.ring_size} across nodes (every step waits on InfiniBand)"


def _attention_lines(cfg: Config) -> list[str]:
    b = cfg.burst
    t = ring_traffic(cfg)
    topology: CPTopology = t["topology"]
    other = "ring" if topology.backward == "burst" else "burst"
    h = topology.heads
    out = [
        "",
        f"burst attention: {topology.describe()}; {_topology(cfg, topology)}"
        + (f", Ulysses all-to-all over {topology.ulysses}" if topology.ulysses > 1 else ""),
        f"  per layer and microbatch, a rank sends at most: forward {format_bytes(t['forward'])} "
        f"({topology.ring_size - 1} hop(s) of {format_bytes(t['forward_hop'])} K/V)",
        f"  backward '{topology.backward}' {format_bytes(t['backward'])} "
        f"(the '{other}' backward would send {format_bytes(t['other_backward'])})"
        + (" [chosen by auto]" if b.backward == "auto" else ""),
        f"  (a bound for every rank: each row on every hop; under the causal mask the zigzag "
        f"schedule skips rows no later step uses, so most ranks send less, e.g. what `run` "
        f"counts on rank 0)",
        f"  ring buffers and fp32 accumulators: {format_bytes(ring_buffer_bytes(cfg))} per "
        f"rank (in the workspace above)",
    ]
    if h.hkv < h.hq and topology.backward == "ring":
        out.append(f"  GQA {h.hq}:{h.hkv} per TP rank: the ring backward moves fewer bytes "
                   f"than burst")
    out += _window_lines(cfg)
    if not cfg.cluster.hardware.timed:
        return out + [f"  topologies: not ranked for {cfg.cluster.gpu} ranks (the time model's "
                      f"profiles describe GPU clusters)"]
    rows = topology_rows(cfg)
    out.append("  topologies of the CP group, per full-attention layer and microbatch (fwd+bwd, "
               "time model; * chosen, x excluded):")
    out += [f"    {row.describe()}" for row in rows]
    tie = tie_note(rows)
    if tie:
        out.append(f"  {tie}")
    if b.remat_aware:
        chosen = next(r.prediction for r in rows if r.chosen)
        out.append(f"  remat-aware recompute: keeps {format_bytes(remat_kept_bytes(cfg))} per "
                   f"layer and microbatch; saves the recomputed attention forward, "
                   f"~{chosen.compute_s * ATTENTION_FORWARD_SHARE * 1e3:.1f} ms per layer and "
                   f"microbatch")
    return out


def window_ring_bytes(cfg: Config) -> tuple[int, int]:
    """(forward, backward) bytes the busiest CP rank sends in one sliding-window layer per
    microbatch, exactly as its schedule sends them (``CPTopology.rank_bytes``)."""
    topology, m = topology_of(cfg), cfg.model
    per_rank = [topology.rank_bytes(r, batch=cfg.training.micro_batch_size,
                                    s_local=m.seq_length // topology.cp, window=m.window)
                for r in range(topology.cp)]
    return max(per_rank, key=sum)


def window_figures(cfg: Config):
    """(time-model prediction, forward bytes, backward bytes) of one sliding-window layer
    on the busiest rank, or None without sliding-window layers."""
    pred = window_prediction(cfg)
    return None if pred is None else (pred, *window_ring_bytes(cfg))


def _window_lines(cfg: Config) -> list[str]:
    figures = window_figures(cfg)
    if figures is None:
        return []
    pred, fwd, bwd = figures
    line = (f"  sliding-window layers: the busiest rank sends {format_bytes(fwd)} forward and "
            f"{format_bytes(bwd)} backward (a hop carries the span of rows its receiver "
            f"uses)")
    if not cfg.cluster.hardware.timed:
        return [line]
    ms = 1e3
    return [line, f"  one sliding-window layer, step by step from its schedule (time model): "
                  f"{pred.total_s * ms:.2f} ms per call (compute {pred.compute_s * ms:.2f}, "
                  f"exposed ring {pred.exposed_comm_s * ms:.2f}, all-to-all "
                  f"{pred.alltoall_s * ms:.2f}, host {pred.host_s * ms:.2f})"]


def _step_lines(cfg: Config, step: StepTime | None) -> list[str]:
    if step is None:
        return ["", f"step time: not predicted for {cfg.cluster.gpu} ranks (the time model's "
                    f"profiles describe GPU clusters)"]
    tr = cfg.training
    parts = [("attention", step.attention_s), ("matmuls", step.matmul_s),
             ("TP collectives", step.tp_comm_s), ("recompute", step.recompute_s),
             ("logits", step.logits_s), ("rest of the layers (calibrated)", step.rest_s)]
    layers = (f"{step.layers} layers on the busiest stage" if not step.window_layers else
              f"{step.layers} layers on the busiest stage, {step.window_layers} of them "
              f"windowed at {step.window_attention.total_s * 1e3:.2f} ms of attention each, "
              f"the others {step.attention.total_s * 1e3:.2f} ms")
    out = ["", f"step time (time model; {layers}):",
           "  one microbatch: " + ", ".join(f"{name} {format_duration(s)}"
                                              for name, s in parts if s)
           + f" = {format_duration(step.stage_s)}"]
    bubble = (f" + pipeline fill and drain {format_duration(step.bubble_s)}"
              if step.pipeline > 1 else "")
    out.append(f"  step: {step.microbatches} microbatch(es){bubble} = "
               f"{format_duration(step.step_s)} for {step.tokens:,} tokens")
    mfu = (f"; MFU {100 * step.mfu:.0f}% of the {step.peak_tflops:g} TFLOP/s bf16 peak"
           if step.mfu is not None else "")
    out.append(f"  throughput: {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU{mfu}")
    total_tokens = tr.train_iters * step.tokens
    out.append(f"  training.train_iters {tr.train_iters:,} x {step.tokens:,} tokens = "
               f"{format_count(total_tokens)} tokens: "
               f"{format_duration(tr.train_iters * step.step_s)} on {step.gpus} GPUs")
    out.append(f"  calibrated: the rest of the layers (norms, RoPE, SwiGLU, residuals, the loss) "
               f"is fitted to measured H200 runs (`python -m megatron_burst.tools.calibration "
               f"benchmarks/results` prints each run's error); a job adds {STEP_MARGIN:.0%}, the "
               f"worst under-prediction there")
    out.append("  not counted: data-parallel gradient reduction (overlapped), the optimizer "
               "step; start-up and checkpoint saves are the job's (below)")
    out += ["", "as a SLURM job (`megatron-burst slurm`):"]
    out += [f"  {line}" for line in job_plan(cfg).lines()]
    return out


def report(cfg: Config, warnings: list[str] | None = None,
           notes: list[str] | None = None) -> str:
    """The human-readable plan: shape, memory per GPU, the ring, the topologies, step and job."""
    out = [f"note: {note}" for note in notes or []]
    out += _shape_lines(cfg) + _memory_lines(cfg)
    if cfg.parallel.context > 1:
        out += _attention_lines(cfg)
    out += _step_lines(cfg, predict_step(cfg))
    out += [f"warning: {w}" for w in warnings or []]
    out.append(f"units: {UNITS_NOTE}")
    return "\n".join(out)
