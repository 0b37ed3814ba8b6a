"""The plan's parameter count is Megatron's: GPTModel built from the same shape, counted.

Megatron-core >= 0.17 (the wheel CI unpacks at MEGATRON_TRAINING_PATH) builds its local
layer spec on CPU; a subprocess builds GPTModel for small shapes of each attention variant
(GQA, learnable sinks, Q/K norms, MLA with and without a Q latent, MLA's latent norms) and
prints its parameter count, which must equal ``memory.stage_params`` for the config. Upstream
MLA cannot run Megatron's local core attention (it takes no k_channels), so there a core
attention without parameters stands in: MLA's own projections and norms are what is counted.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from megatron_burst.launch.config.schema import config_from_dict
from megatron_burst.launch.planning.memory import padded_vocab, stage_params

from .conftest import REPO

WHEEL = os.environ.get("MEGATRON_TRAINING_PATH")

BUILD = r"""
import json, os, sys, typing, warnings
warnings.filterwarnings("ignore")
import typing_extensions
typing.override = getattr(typing, "override", typing_extensions.override)
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist, torch.nn.functional as F
torch.cuda.current_device = lambda: "cpu"  # the learnable sinks' buffer asks for one
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel()
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig


class NoParameters(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()


out = []
for m in json.loads(sys.argv[3]):
    mla = m.pop("multi_latent_attention")
    vocab = m.pop("vocab")
    common = dict(normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                  add_bias_linear=False, use_cpu_initialization=True, **m)
    if mla:
        config = MLATransformerConfig(multi_latent_attention=True, rope_type="rope", **common)
    else:
        config = TransformerConfig(**common)
    spec = get_gpt_layer_local_spec(multi_latent_attention=mla, normalization="RMSNorm",
                                    qk_layernorm=m["qk_layernorm"])
    if mla:
        spec.submodules.self_attention.submodules.core_attention = NoParameters
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab,
                     max_sequence_length=64, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    out.append(sum(p.numel() for p in model.parameters()))
print(json.dumps(out))
"""

MLA = {"multi_latent_attention": True, "num_query_groups": 4, "kv_lora_rank": 32,
       "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 12}
VARIANTS = [{}, {"softmax_type": "learnable"}, {"qk_layernorm": True},
            {"softmax_type": "learnable", "qk_layernorm": True, "window_size": [8, 0]},
            MLA, {**MLA, "q_lora_rank": 24}, {**MLA, "q_lora_rank": 24, "qk_layernorm": True}]
KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
        "num_query_groups", "softmax_type", "qk_layernorm", "q_lora_rank", "kv_lora_rank",
        "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


@pytest.mark.skipif(not WHEEL, reason="set MEGATRON_TRAINING_PATH to an unpacked "
                                      "megatron-core >= 0.17 wheel (.ci/run does)")
def test_the_parameter_count_is_megatrons(tiny_raw):
    configs, shapes = [], []
    for variant in VARIANTS:
        raw = copy.deepcopy(tiny_raw)
        raw["model"].update(variant)
        raw["parallel"].update(tensor=1, context=1, data=4)  # one process builds it whole
        cfg = config_from_dict(raw)
        m = cfg.model
        shape = {key: getattr(m, key) for key in KEYS if getattr(m, key) is not None}
        if m.multi_latent_attention:  # None: Q at full rank (MLATransformerConfig's is 512)
            shape["q_lora_rank"] = m.q_lora_rank
        shape.update(multi_latent_attention=m.multi_latent_attention,
                     vocab=padded_vocab(cfg))
        configs.append(cfg)
        shapes.append(shape)
    port = str(29500 + os.getpid() % 400)
    proc = subprocess.run([sys.executable, "-c", BUILD, WHEEL, port, json.dumps(shapes)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counted = json.loads(proc.stdout.strip().splitlines()[-1])
    for variant, cfg, megatron in zip(VARIANTS, configs, counted):
        assert stage_params(cfg, "only") == megatron, variant
