"""Configs with today's attention: sinks, sliding-window layers and MLA (issue 35).

Each key is validated like every other (a bad value is one line naming it), reaches Megatron
as its own flag and cannot be set again in megatron_args; the plan's parameters, memory,
bytes and times know MLA's projections and head dims, the sinks and the windowed layers;
the CPU trainer, which builds plain Llama attention, refuses them instead of ignoring them.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest

from megatron_burst.decide import cost
from megatron_burst.launch.config.schema import ConfigError, config_from_dict, load_config
from megatron_burst.launch.run.flags import megatron_flags
from megatron_burst.launch.planning.memory import layer_params, ring_buffer_bytes
from megatron_burst.launch.planning.plan import validate
from megatron_burst.launch.planning.report import ring_traffic, window_ring_bytes
from megatron_burst.cli.run_command import check_cpu_attention
from megatron_burst.decide.flops import causal_pairs
from megatron_burst.launch.planning.step_time import (model_flops_per_step, predict_step,
                                                      stage_window_layers)
from megatron_burst.launch.config.burst import topology_of

from .conftest import REPO

GPTOSS = REPO / "configs" / "gptoss-style-dense-7b-128k.yaml"
DEEPSEEK = REPO / "configs" / "deepseek-style-mla-dense-8b-128k.yaml"
MLA = {"multi_latent_attention": True, "num_query_groups": 4, "kv_lora_rank": 32,
       "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16}


def _with(raw: dict, **model) -> dict:
    raw = copy.deepcopy(raw)
    raw["model"].update(model)
    return raw


@pytest.mark.parametrize("model, message", [
    ({"softmax_type": "sink"}, "'model.softmax_type' must be one of vanilla, off-by-one, "
                               "learnable"),
    ({"window_size": 128}, "'model.window_size' must be a list"),
    ({"window_size": [128]}, "'model.window_size' must be [left, right]"),
    ({"window_size": [128, 0, 0]}, "'model.window_size' must be [left, right]"),
    ({"window_size": [0, 0]}, "'model.window_size' [0, 0]: left is how many"),
    ({"window_size": [-1, 0]}, "'model.window_size' [-1, 0]: left is how many"),
    ({"window_size": [64, 3]}, "right must be 0"),
    ({"window_size": [64, "0"]}, "'model.window_size[1]' must be an integer"),
    ({"window_attn_skip_freq": 2}, "'model.window_attn_skip_freq' says which layers skip"),
    ({"window_size": [64, 0], "window_attn_skip_freq": 1},
     "'model.window_attn_skip_freq' must be at least 2"),
    ({"kv_lora_rank": 32}, "'model.kv_lora_rank' is a multi-latent attention dimension"),
    ({"q_lora_rank": 32}, "'model.q_lora_rank' is a multi-latent attention dimension"),
    ({**MLA, "v_head_dim": None}, "'model.v_head_dim' is required with "
                                  "model.multi_latent_attention"),
    ({**MLA, "num_query_groups": 2}, "'model.num_query_groups' is 2, but multi-latent"),
    ({**MLA, "qk_pos_emb_head_dim": 7}, "'model.qk_pos_emb_head_dim' is 7: RoPE"),
    ({**MLA, "kv_lora_rank": 0}, "'model.kv_lora_rank' must be at least 1"),
    ({"multi_latent_attention": "yes"}, "'model.multi_latent_attention' must be true or false"),
])
def test_a_bad_attention_key_is_named(tiny_raw, model, message):
    with pytest.raises(ConfigError) as error:
        config_from_dict(_with(tiny_raw, **model))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("model, parallel, key", [
    ({**MLA, "q_lora_rank": 33}, {}, "model.q_lora_rank"),  # over TP 2
    ({**MLA, "kv_lora_rank": 31}, {}, "model.kv_lora_rank"),  # + 8 over TP 2
])
def test_mla_latents_must_split_over_tp(tiny_raw, model, parallel, key):
    cfg = config_from_dict(_with(tiny_raw, **model))
    with pytest.raises(ConfigError, match=f"'{key}'"):
        validate(cfg)


def test_mla_head_dims_must_suit_the_gpu_kernels_and_document_masks_are_refused():
    cfg = load_config(DEEPSEEK)
    validate(cfg)
    for key, value in (("qk_pos_emb_head_dim", 68), ("v_head_dim", 260)):
        bad = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **{key: value}))
        name = "model.qk_head_dim" if key == "qk_pos_emb_head_dim" else "model.v_head_dim"
        with pytest.raises(ConfigError, match=f"'{name}'.*multiple of 8 up to 256"):
            validate(bad)
    docs = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, document_mask=True))
    with pytest.raises(ConfigError, match="'data.document_mask': document masks do not "
                                          "support multi-latent attention"):
        validate(docs)


def _value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_the_flags_carry_the_attention_variant():
    gptoss = megatron_flags(load_config(GPTOSS), expand=False)
    assert _value(gptoss, "--softmax-type") == "learnable"
    assert _value(gptoss, "--window-size") == "128,0"
    assert _value(gptoss, "--window-attn-skip-freq") == "2"
    assert "--multi-latent-attention" not in gptoss
    deepseek = megatron_flags(load_config(DEEPSEEK), expand=False)
    assert "--multi-latent-attention" in deepseek and "--qk-layernorm" in deepseek
    assert [_value(deepseek, f) for f in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                                          "--qk-pos-emb-head-dim", "--v-head-dim",
                                          "--rope-type")] == ["1536", "512", "128", "64",
                                                              "128", "rope"]
    assert "--group-query-attention" not in deepseek and "--softmax-type" not in deepseek
    plain = megatron_flags(load_config(REPO / "configs" / "llama3-8b-128k.yaml"), expand=False)
    assert not {"--softmax-type", "--window-size", "--multi-latent-attention",
                "--qk-layernorm"} & set(plain)


@pytest.mark.parametrize("args, key", [
    (["--softmax-type", "vanilla"], "model.softmax_type"),
    (["--window-size=64,0"], "model.window_size"),
    (["--window-attn-skip-freq", "4"], "model.window_attn_skip_freq"),
    (["--v-head-dim", "64"], "model.v_head_dim"),
    (["--multi-latent-attention"], "model.multi_latent_attention"),
    (["--qk-layernorm"], "model.qk_layernorm"),
    (["--rope-type", "yarn"], "model.position_embedding"),
    # Megatron sets multi_latent_attention from a hybrid pattern after parsing.
    (["--hybrid-layer-pattern", "M*"], "model.multi_latent_attention"),
])
def test_megatron_args_cannot_set_the_attention_again(tiny_raw, args, key):
    raw = copy.deepcopy(tiny_raw)
    raw["megatron_args"] = args
    with pytest.raises(ConfigError, match=f"set {key}"):
        config_from_dict(raw)


def test_windowed_layers_are_megatrons():
    utils = pytest.importorskip("megatron.core.transformer.utils")
    cfg = load_config(GPTOSS)
    m = cfg.model
    for freq in (None, 2, 3):
        m2 = dataclasses.replace(m, window_attn_skip_freq=freq)
        for n in range(1, m.num_layers + 1):
            assert m2.is_window_layer(n) == utils.is_layer_window_attention(
                m.window, freq, n), (freq, n)
    assert m.window_layers(1, m.num_layers) == m.num_layers // 2
    # Pipeline stages of 3 layers: the busiest stage is the one with the most full layers.
    piped = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, pipeline=8))
    assert stage_window_layers(piped) == 1


def test_the_plan_times_windowed_layers_apart():
    cfg = load_config(GPTOSS)
    step = predict_step(cfg)
    assert step.window_layers == 12 and step.window_attention is not None
    assert step.attention_s == pytest.approx(12 * step.attention.serial_s
                                             + 12 * step.window_attention.serial_s)
    assert step.window_attention.total_s < step.attention.total_s / 10
    # Without windows every layer would cost a full one.
    full = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, window_size=None, window_attn_skip_freq=None))
    assert predict_step(full).attention_s == pytest.approx(24 * step.attention.serial_s)
    assert model_flops_per_step(full) > model_flops_per_step(cfg)
    # The windowed layers' bytes are the schedule's, under the full layer's bound.
    fwd, bwd = window_ring_bytes(cfg)
    bound = ring_traffic(cfg)
    assert 0 < fwd <= bound["forward"] and 0 < bwd <= bound["backward"]
    assert causal_pairs([10], 3) == 1 + 2 + 3 + 4 * 7 and causal_pairs([4], 9) == 10


def test_the_plan_counts_mla_at_its_own_head_dims():
    cfg = load_config(DEEPSEEK)
    m, p = cfg.model, cfg.parallel
    heads = topology_of(cfg).heads
    assert (heads.hq, heads.hkv, heads.head_dim, heads.v_head_dim) == (16, 16, 192, 128)
    tokens = m.seq_length // p.context
    t = ring_traffic(cfg)
    assert t["forward_hop"] == tokens * 16 * (192 + 128) * 2
    assert t["forward"] == cost.forward_bytes(p.context, tokens, 16, 192, 2, v_head_dim=128)
    # K/V double buffer and fp32 accumulators at (192 + 128), out at V's dim, dQ at Q's.
    assert ring_buffer_bytes(cfg) == (tokens * 16 * (128 + 192) * 4
                                      + 2 * tokens * 16 * 320 * 2 + tokens * 16 * 320 * 8)
    # One layer per TP rank: Megatron's MLA projections (the local spec splits all of them
    # over TP), the latent norms, the MLP and the two layer norms.
    h, t_ = m.hidden_size, p.tensor
    attention = (h * 1536 + 1536 * 32 * 192 + h * (512 + 64) + 512 * 32 * (128 + 128)
                 + 32 * 128 * h) // t_
    assert layer_params(cfg) == attention + (1536 + 512) + 3 * h * 14336 // t_ + 2 * h


def test_learnable_sinks_are_parameters_split_over_tp():
    cfg = load_config(GPTOSS)
    vanilla = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                                 softmax_type="vanilla"))
    off_by_one = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                                    softmax_type="off-by-one"))
    assert layer_params(cfg) - layer_params(vanilla) == 64 // cfg.parallel.tensor
    assert layer_params(off_by_one) == layer_params(vanilla)  # a constant, not a parameter
    assert ring_traffic(cfg)["forward"] == ring_traffic(vanilla)["forward"]  # no bytes


@pytest.mark.parametrize("model, key", [
    ({"softmax_type": "learnable"}, "model.softmax_type"),
    ({"window_size": [16, 0]}, "model.window_size"),
    ({**MLA}, "model.multi_latent_attention"),
    ({"qk_layernorm": True}, "model.qk_layernorm"),
])
def test_the_cpu_run_refuses_what_it_does_not_build(tiny_raw, model, key):
    with pytest.raises(ConfigError, match=f"'{key}': the CPU run builds plain Llama"):
        check_cpu_attention(config_from_dict(_with(tiny_raw, **model)))
    check_cpu_attention(config_from_dict(tiny_raw))
