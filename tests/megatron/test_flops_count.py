"""The FLOPs count (``megatron_burst.decide.flops``) against a hand count, and the ways into it: a
Megatron run's arguments (``run_flops``), the printed line the benchmarks read back, and the
planner's model FLOPs (``launch.planning.step_time``)."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from megatron_burst.decide.flops import (ModelShape, Recompute, StepFlops, causal_pairs,
                                         flops_line, read_flops, training_flops)

# 2 layers, hidden 8, SwiGLU FFN 16, 4 query heads in 2 K/V groups of head dim 2, a padded
# vocabulary of 32; one sequence of two documents, 2 and 4 tokens.
SHAPE = ModelShape(layers=2, hidden=8, ffn_hidden=16, heads=4, query_groups=2, head_dim=2,
                   vocab=32, swiglu=True)
LENS = (2, 4)

# The hand count. Multiply-adds (MACs) per token and layer, forward; 1 MAC = 2 FLOPs:
#   Q  8 x (4 heads x 2)  = 64      K  8 x (2 groups x 2) = 32      V  likewise = 32
#   output projection (4 x 2) x 8 = 64
#   SwiGLU: gate and up 8 x (2 x 16) = 256, down 16 x 8 = 128
#   => 64 + 32 + 32 + 64 + 256 + 128 = 576 MACs = 1152 FLOPs per token and layer
LINEAR = 1152 * 6 * 2  # 6 tokens, 2 layers = 13824
# Attention: causal pairs inside each document: 2*3/2 + 4*5/2 = 3 + 10 = 13. Per pair and
# layer: QK^T 4 heads x 2 dims = 8 MACs, PV 8 MACs => 16 MACs = 32 FLOPs.
PAIRS = 13
ATTENTION = 32 * PAIRS * 2  # 2 layers = 832
# Logits: 8 x 32 = 256 MACs = 512 FLOPs per token, 6 tokens.
LOGITS = 512 * 6  # 3072
FORWARD = LINEAR + ATTENTION + LOGITS  # 17728
MODEL = 3 * FORWARD  # forward, data gradient, weight gradient: 53184


def test_the_count_is_the_hand_count():
    assert causal_pairs(LENS) == PAIRS
    assert FORWARD == 17728 and MODEL == 53184
    assert training_flops(SHAPE, 6, PAIRS) == StepFlops(model=MODEL, hardware=MODEL)


def test_recompute_adds_what_it_repeats_to_the_hardware_count_only():
    full = training_flops(SHAPE, 6, PAIRS, Recompute(layers=2))
    assert (full.model, full.hardware) == (MODEL, MODEL + LINEAR + ATTENTION)  # 67840
    kept = training_flops(SHAPE, 6, PAIRS, Recompute(layers=2, keeps_attention=True))
    assert kept.hardware == MODEL + LINEAR  # remat-aware: the attention is not rerun
    selective = training_flops(SHAPE, 6, PAIRS, Recompute(attention_layers=2))
    assert selective.hardware == MODEL + ATTENTION


def test_masks_and_windows_remove_pairs():
    # A window of one earlier key: each query sees at most 2 keys: 1+2 and 1+2+2+2.
    assert causal_pairs(LENS, window_left=1) == 3 + 7
    assert causal_pairs([6]) == 21 > causal_pairs(LENS)  # one document: more pairs
    assert causal_pairs([]) == 0


def test_the_printed_line_reads_back():
    log = "noise\n> " + flops_line(StepFlops(1.5e13, 2.25e13)) + "\n> " + flops_line(
        StepFlops(MODEL, MODEL + 1)) + "\niteration 3 ..."
    assert read_flops(log) == StepFlops(MODEL, MODEL + 1)  # the last, the running mean
    assert read_flops("no count here") is None


def _args(**change) -> argparse.Namespace:
    args = dict(num_layers=2, hidden_size=8, ffn_hidden_size=16, num_attention_heads=4,
                group_query_attention=True, num_query_groups=2, kv_channels=2,
                padded_vocab_size=32, vocab_size=30, swiglu=True, seq_length=6,
                recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
                window_size=None, window_attn_skip_freq=None, burst_remat_aware=False,
                pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None)
    args.update(change)
    return argparse.Namespace(**args)


def test_a_megatron_run_is_counted_from_its_own_arguments():
    pytest.importorskip("megatron.core")
    from megatron_burst.megatron.run_flops import FlopsCounter, recompute_from_args

    counted, share = FlopsCounter(_args()).count(LENS)
    assert counted == StepFlops(MODEL, MODEL) and share == pytest.approx(13 / 21)
    # The padded vocabulary is the one counted, not --vocab-size (a tokenizer's own size).
    bigger = FlopsCounter(_args(padded_vocab_size=64)).count(LENS)[0]
    assert bigger.model - MODEL == 3 * 2 * 8 * 32 * 6
    # Without --group-query-attention every head has its own K and V: 2 more groups.
    mha = FlopsCounter(_args(group_query_attention=False)).count(LENS)[0]
    assert mha.model - MODEL == 3 * 2 * (8 * 2 * 2 * 2) * 6 * 2
    assert recompute_from_args(_args(recompute_granularity="full", recompute_method="uniform",
                                     recompute_num_layers=1)) == Recompute(layers=2)
    assert recompute_from_args(_args(recompute_granularity="full", recompute_method="block",
                                     recompute_num_layers=1, burst_remat_aware=True)) == \
        Recompute(layers=1, keeps_attention=True)
    assert recompute_from_args(_args(recompute_granularity="selective")) == \
        Recompute(attention_layers=2)
    assert FlopsCounter(_args(num_experts=8)).count(LENS)[0] is None  # not modelled: no figure


def test_window_layers_are_counted_as_megatron_places_them():
    pytest.importorskip("megatron.core")
    from megatron_burst.megatron.run_flops import FlopsCounter, layer_windows

    args = _args(window_size=(1, 0), window_attn_skip_freq=2)  # layer 2 of 2 is full
    assert layer_windows(args) == ((1, 0), (-1, -1))
    counted = FlopsCounter(args).count(LENS)[0]
    mean_pairs = (10 + 13) / 2
    assert counted.model == MODEL - 3 * 2 * 32 * (PAIRS - mean_pairs)


def test_the_planner_counts_with_the_same_helper():
    from megatron_burst.launch.config.schema import load_config
    from megatron_burst.launch.planning.memory import padded_vocab
    from megatron_burst.launch.planning.step_time import model_flops_per_step

    cfg = load_config("configs/llama3.2-1b-128k-4gpu.yaml")
    m = cfg.model
    whole = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tensor=1))
    shape = ModelShape(m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
                       m.num_query_groups, m.head_dim, padded_vocab(whole))
    s = m.seq_length
    expected = training_flops(shape, s, s * (s + 1) // 2).model * cfg.training.global_batch_size
    assert model_flops_per_step(cfg) == expected


def test_the_benchmark_reads_the_count_the_run_printed():
    """What the entry point prints per pack is what benchmarks/megatron_documents.py turns
    into model TFLOP/s and MFU: the run's own count, not one made from the config."""
    pytest.importorskip("megatron.core")
    import sys

    from megatron_burst.megatron.run_flops import FlopsCounter, FlopsReport

    sys.path.insert(0, "benchmarks")
    try:
        import megatron_documents
    finally:
        sys.path.remove("benchmarks")
    printed = []
    report, counter = FlopsReport(), FlopsCounter(_args())
    report.EVERY = 2  # printed at the first pack and every EVERY-th: the running mean
    for lens in (LENS, (6,)):
        flops, share = counter.count(lens)
        report.add(flops, share, len(lens), sum(lens), printed.append)
    log = "\n".join(printed)
    one_document = training_flops(SHAPE, 6, 21).model  # 6 tokens, 21 causal pairs
    assert read_flops(log).model == pytest.approx((MODEL + one_document) / 2)
    assert "causal attention pairs done: 0.80952 of full causal" in log  # (13/21 + 1) / 2
    figures = megatron_documents.run_figures(log, gbs=4, ms=100.0, gpus=2, peak_tflops=989.0)
    per_gpu = 4 * (MODEL + one_document) / 2 / 0.1 / 2  # sequences x FLOPs / s / GPUs
    assert figures["model_tflops_per_gpu"] == pytest.approx(per_gpu / 1e12)
    assert figures["mfu"] == pytest.approx(per_gpu / 989e12)
    assert megatron_documents.run_figures("no count", 4, 100.0, 2, 989.0) == {}


# MLA on the same 2-layer model: 4 heads, Q/K head dim 3 (2 + 1 RoPE), V head dim 2, Q
# latent 4, K/V latent 5. Projection MACs per token and layer:
#   Q down 8 x 4 = 32, up 4 x (4 x 3) = 48; K/V down 8 x (5 + 1) = 48, up 5 x 4 x (2 + 2) = 80
#   output (4 x 2) x 8 = 64  => 272 MACs (GQA's Q/K/V/out above: 192)
# Attention per pair and layer: QK^T 4 x 3 = 12 MACs, PV 4 x 2 = 8 => 40 FLOPs.
MLA_ARGS = dict(multi_latent_attention=True, q_lora_rank=4, kv_lora_rank=5, qk_head_dim=2,
                qk_pos_emb_head_dim=1, v_head_dim=2)
MLA_MODEL = 3 * (2 * 6 * 2 * (272 + 256 + 128) + 2 * 40 * PAIRS + LOGITS)


def test_mla_is_counted_at_its_projections_and_head_dims_every_way_in():
    from megatron_burst.decide.flops import mla_projections

    assert mla_projections(8, 4, 4, 5, 3, 1, 2) == 272
    shape = dataclasses.replace(SHAPE, head_dim=3, v_head_dim=2, projections=272)
    assert shape.per_pair == 40
    assert training_flops(shape, 6, PAIRS).model == MLA_MODEL
    pytest.importorskip("megatron.core")
    from megatron_burst.megatron.run_flops import FlopsCounter

    assert FlopsCounter(_args(**MLA_ARGS)).count(LENS)[0].model == MLA_MODEL


def test_the_planner_counts_mla_and_windows_with_the_same_helper():
    from megatron_burst.decide.flops import mla_projections
    from megatron_burst.launch.config.schema import load_config
    from megatron_burst.launch.planning.memory import padded_vocab
    from megatron_burst.launch.planning.step_time import model_flops_per_step

    for name in ("deepseek-style-mla-dense-8b-128k", "gptoss-style-dense-7b-128k"):
        cfg = load_config(f"configs/{name}.yaml")
        m = cfg.model
        whole = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tensor=1))
        projections = (mla_projections(m.hidden_size, m.num_attention_heads, m.q_lora_rank,
                                       m.kv_lora_rank, m.head_dim, m.qk_pos_emb_head_dim,
                                       m.v_dim) if m.multi_latent_attention else 0)
        shape = ModelShape(m.num_layers, m.hidden_size, m.ffn_hidden_size,
                           m.num_attention_heads, m.num_query_groups, m.head_dim,
                           padded_vocab(whole), v_head_dim=m.v_dim, projections=projections)
        s, windowed = m.seq_length, m.window_layers(1, m.num_layers)
        left = m.window[0] if m.window else -1
        pairs = ((m.num_layers - windowed) * s * (s + 1) // 2
                 + windowed * causal_pairs([s], left)) / m.num_layers
        assert (windowed > 0) == (name.startswith("gptoss"))
        expected = training_flops(shape, s, pairs).model * cfg.training.global_batch_size
        assert model_flops_per_step(cfg) == pytest.approx(expected, rel=1e-12)
