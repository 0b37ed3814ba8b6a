"""`plan`'s times come from one time model: the topology table, the chosen topology's
attention time and the step built on it agree with `megatron_burst.decide.timing`; excluded
topologies say why."""
from __future__ import annotations

import dataclasses
import re

import pytest

from megatron_burst.launch.config.burst import max_intra_node_size_of, tokens_per_rank, topology_of
from megatron_burst.launch.config.schema import load_config, resize_note, with_nodes
from megatron_burst.launch.planning.topology_candidates import chosen_prediction, topology_rows
from megatron_burst.launch.planning.plan import make_plan
from megatron_burst.launch.planning.step_time import (format_duration, predict_step,
                                                      stage_window_layers)
from megatron_burst.decide.timing import choose, load_profile, predict

from .conftest import CONFIGS, REPO

GPU_CONFIGS = [p for p in CONFIGS if "cpu" not in p.stem]
CP_CONFIGS = [p for p in GPU_CONFIGS if load_config(p).parallel.context > 1]


def _cfg(name: str):
    return load_config(REPO / "configs" / f"{name}.yaml")


@pytest.mark.parametrize("path", CP_CONFIGS, ids=lambda p: p.stem)
def test_every_time_in_the_topology_table_is_the_time_models(path):
    cfg = load_config(path)
    text = make_plan(cfg)
    prof = load_profile(cfg.cluster.profile_name)
    rows = topology_rows(cfg)
    for row in rows:
        if row.prediction is None:
            continue
        again = predict(row.prediction.topology, prof, tokens=tokens_per_rank(cfg), causal=True,
                        max_intra_node_size=max_intra_node_size_of(cfg))
        assert again == row.prediction
        assert row.prediction.describe() in text
    chosen = [r for r in rows if r.chosen]
    assert len(chosen) == 1 and chosen[0].prediction.topology == topology_of(cfg)
    # Attention per layer is printed once: the table's times are the only "ms fwd+bwd" ones.
    assert len(re.findall(r"ms fwd\+bwd", text)) == sum(r.prediction is not None for r in rows)


@pytest.mark.parametrize("path", CP_CONFIGS, ids=lambda p: p.stem)
def test_auto_chooses_what_the_table_ranks_first(path):
    cfg = load_config(path)
    b = cfg.burst
    fixed = {} if b.ulysses_size == "auto" else {"ulysses": b.ulysses_size}
    fixed["intra_node_size"] = None if b.intra_node_size in (None, 1) else b.intra_node_size
    if b.backward != "auto":
        fixed["backward"] = b.backward
    topology = topology_of(cfg)
    best = choose(cfg.parallel.context, topology.heads, tokens=tokens_per_rank(cfg),
                  prof=load_profile(cfg.cluster.profile_name),
                  max_intra_node_size=max_intra_node_size_of(cfg), **fixed)[0]
    considered = [r for r in topology_rows(cfg) if r.excluded is None]
    assert considered[0].chosen and considered[0].prediction == best
    assert chosen_prediction(cfg) == best


def test_excluded_topologies_say_why():
    text = make_plan(_cfg("llama3-8b-128k"))  # ulysses_size: 1 on a group that could split
    assert "excluded: burst.ulysses_size is 1 (auto would consider it)" in text
    # The burst and ring backward no longer tie (the burst's extra passes are priced), but a
    # tie, where there is one, is said, not hidden:
    from megatron_burst.launch.planning.topology_candidates import TopologyRow, tie_note

    rows = topology_rows(_cfg("llama3-8b-128k"))
    chosen = next(r for r in rows if r.chosen)
    twin = TopologyRow(chosen.ulysses + 1, chosen.prediction, None, False)
    assert "predict the chosen one's time" in tie_note([chosen, twin])
    assert tie_note([chosen]) is None
    text = make_plan(_cfg("llama2-70b-128k"))  # TP=8: one CP rank per node
    # Ulysses 2 would run its all-to-all across the nodes: priced on InfiniBand, shown.
    across = [line for line in text.splitlines() if "ulysses 2 x flat ring 1" in line]
    assert across and all("all-to-all 0.00" not in line for line in across), across


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_step_time_is_built_on_the_chosen_attention_time(path):
    cfg = load_config(path)
    step = predict_step(cfg)
    assert step.attention == chosen_prediction(cfg)
    assert step.window_layers == stage_window_layers(cfg)
    assert 0 < step.mfu < 1
    text = make_plan(cfg)
    assert f"{step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU" in text
    assert f"MFU {100 * step.mfu:.0f}%" in text
    assert format_duration(cfg.training.train_iters * step.step_s) in text


def test_step_time_scales_as_the_batch_and_recompute_say():
    cfg = _cfg("llama3-8b-128k")
    step = predict_step(cfg)
    doubled = predict_step(dataclasses.replace(cfg, training=dataclasses.replace(
        cfg.training, global_batch_size=2 * cfg.training.global_batch_size)))
    assert doubled.step_s == pytest.approx(2 * step.step_s)
    assert doubled.mfu == pytest.approx(step.mfu)
    none = predict_step(dataclasses.replace(cfg, training=dataclasses.replace(
        cfg.training, recompute="none")))
    assert none.recompute_s == 0 < step.recompute_s and none.step_s < step.step_s
    assert none.model_flops == step.model_flops  # recompute is no model FLOP


def test_cpu_configs_get_no_invented_times():
    text = make_plan(load_config(REPO / "configs" / "tiny-llama-cpu.yaml"))
    assert "step time: not predicted for cpu ranks" in text
    assert "ms fwd+bwd" not in text and "MFU" not in text


def test_nodes_note_says_what_changed():
    cfg = _cfg("llama3-8b-128k")
    note = resize_note(cfg, with_nodes(cfg, 2))
    assert "--nodes 2 instead of cluster.nodes 1: data parallelism 1 -> 2" in note
    assert "16 -> 8 microbatch(es) per step" in note
    assert resize_note(cfg, with_nodes(cfg, 1)) is None
    assert make_plan(with_nodes(cfg, 2), [note]).startswith(f"note: {note}\n")
