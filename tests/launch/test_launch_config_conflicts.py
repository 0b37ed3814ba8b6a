"""Configs that would contradict their own plan are refused when loaded or planned:
megatron_args that set what the plan decides, duplicate YAML keys, a malformed data.split,
head dims the attention kernels cannot run; and the rules launch/ checks have one owner."""
from __future__ import annotations

import copy
import dataclasses
import re

import pytest

from megatron_burst.launch.config.schema import ConfigError, config_from_dict, load_config
from megatron_burst.launch.run.flags import megatron_flags
from megatron_burst.launch.config.owned_flags import owner_of
from megatron_burst.launch.planning.plan import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, validate

from .conftest import CONFIGS, REPO

ENV = {"DATA_PATH": "/data/d", "TOKENIZER_MODEL": "/t"}


@pytest.mark.parametrize("args, key", [
    (["--context-parallel-size", "2"], "parallel.context"),
    (["--context-parallel-size=2"], "parallel.context"),
    (["--tensor-model-parallel-size", "1"], "parallel.tensor"),
    (["--pipeline-model-parallel-size=2"], "parallel.pipeline"),
    (["--seq-length", "4096"], "model.seq_length"),
    (["--max-position-embeddings=8192"], "model.max_position_embeddings"),
    (["--cp-comm-type", "p2p"], "burst.ulysses_size"),
    (["--hierarchical-context-parallel-sizes", "2", "1"], "burst.intra_node_size"),
    (["--micro-batch-size", "2"], "training.micro_batch_size"),
    (["--global-batch-size=8"], "training.global_batch_size"),
    (["--num-layers", "4"], "model.num_layers"),
    (["--hidden-size", "128"], "model.hidden_size"),
    (["--num-attention-heads=8"], "model.num_attention_heads"),
    (["--kv-channels", "32"], "model.hidden_size / model.num_attention_heads"),
    (["--fp16"], "training.precision"),
    (["--burst-backward", "ring"], "burst.backward"),
    (["--burst-ulysses-size=2"], "burst.ulysses_size"),
    (["--log-timers-to-tensorboard", "--split", "1,0,0"], "data.split"),
])
def test_megatron_args_that_set_the_plan_are_refused(tiny_raw, args, key):
    tiny_raw["megatron_args"] = args
    with pytest.raises(ConfigError, match=r"'megatron_args\[\d\]': --[a-z0-9-]+ is what the plan "
                                          rf"decides; set {key}"):
        config_from_dict(tiny_raw)


def test_other_megatron_args_pass(tiny_raw):
    tiny_raw["megatron_args"] = ["--log-timers-to-tensorboard", "--ckpt-format", "torch_dist",
                                 "--wandb-exp-name=x"]
    assert config_from_dict(tiny_raw).megatron_args[1] == "--ckpt-format"


def _variants():
    """Every shipped config, and the tiny one with each optional flag group switched on."""
    yield from (load_config(p) for p in CONFIGS)
    tiny = load_config(REPO / "configs" / "tiny-llama-cpu.yaml")
    t, d = tiny.training, tiny.data
    for training in (dict(recompute="full"), dict(recompute="selective"),
                     dict(precision="bf16", distributed_optimizer=True)):
        yield dataclasses.replace(tiny, training=dataclasses.replace(t, **training))
    yield dataclasses.replace(tiny, data=dataclasses.replace(
        d, mock=False, data_path="/d", tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model="/t", document_mask=True), training=dataclasses.replace(
        t, micro_batch_size=1, global_batch_size=1))
    yield dataclasses.replace(tiny, burst=dataclasses.replace(tiny.burst, remat_aware=True),
                              training=dataclasses.replace(t, recompute="full"))


def test_every_flag_the_config_emits_is_owned():
    """A flag `flags` writes but megatron_args could write again would let the two differ."""
    emitted = {word for cfg in _variants() for word in megatron_flags(cfg, env=ENV)
               if word.startswith("--")}
    assert {flag for flag in emitted if owner_of(flag) is None} == set()


def test_duplicate_yaml_keys_are_refused(tmp_path):
    text = (REPO / "configs" / "tiny-llama-cpu.yaml").read_text()
    dup_key = text.replace("  num_layers: 2\n", "  num_layers: 2\n  num_layers: 4\n")
    (tmp_path / "a.yaml").write_text(dup_key)
    with pytest.raises(ConfigError, match=r"duplicate key 'model.num_layers' at line \d+ "
                                          r"\(first at line \d+\)"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text(text + "training:\n  train_iters: 5\n")
    with pytest.raises(ConfigError, match="duplicate key 'training'"):
        load_config(tmp_path / "b.yaml")


@pytest.mark.parametrize("split, ok", [
    ("969,30,1", True), ("99,1,0", True), ("90/5/5", True), ("1", True), ("0.9, 0.1", True),
    ("abc", False), ("", False), ("0,0,0", False), ("0,1,0", False), ("-1,2,3", False),
    ("1,2,3,4", False), ("1;2;3", False), ("1,,2", False), ("1.2.3", False),
])
def test_data_split_follows_megatron(tiny_raw, split, ok):
    tiny_raw["data"]["split"] = split
    if ok:
        assert config_from_dict(tiny_raw).data.split == split
    else:
        with pytest.raises(ConfigError, match="'data.split'"):
            config_from_dict(tiny_raw)


@pytest.mark.parametrize("hidden, heads, runs", [
    (4096, 32, True),   # 128
    (4000, 32, False),  # 125: not a multiple of 8
    (3072, 24, True),   # 128
    (4096, 16, True),   # 256: the most flash and cuDNN take
    (10240, 32, False),  # 320: beyond 256
    (2304, 24, True),   # 96
])
def test_head_dims_the_kernels_cannot_run_are_refused(hidden, heads, runs):
    raw = copy.deepcopy(dataclasses.asdict(load_config(REPO / "configs" / "llama2-7b-32k.yaml")))
    raw["model"].update(hidden_size=hidden, num_attention_heads=heads, num_query_groups=heads)
    cfg = config_from_dict(raw)
    if runs:
        validate(cfg)
        return
    with pytest.raises(ConfigError, match="'model.num_attention_heads'.*head dim"):
        validate(cfg)


def test_cpu_configs_take_any_head_dim(tiny_raw):
    """The CPU kernel has no head-dim limit; the GPU rule does not apply there."""
    tiny_raw["model"].update(hidden_size=48, num_attention_heads=4, num_query_groups=2)
    validate(config_from_dict(tiny_raw))  # head dim 12


def test_the_plans_head_dims_are_the_gpu_kernels_capabilities():
    """`plan` copies the GPU kernels' head dims (it runs without torch): the same numbers."""
    from megatron_burst import kernels

    for kernel in (kernels.CudnnAttention, kernels.TorchFlashAttention, kernels.FlashAttnPackage):
        capabilities = kernel.capabilities
        assert (capabilities.head_dim_multiple, capabilities.max_head_dim) == (
            HEAD_DIM_MULTIPLE, MAX_HEAD_DIM), kernel.name


def test_launch_states_no_sequence_divisor_of_its_own():
    """`seq % 2cp` has one owner, ``CPTopology.seq_len_divisor``: launch/ asks it."""
    restated = [f"{path.relative_to(REPO)}:{number}"
                for path in sorted((REPO / "megatron_burst" / "launch").rglob("*.py"))
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(r"%\s*\(?2\s*\*|2 \* (p\.)?(context|cp)\b", line)]
    assert restated == []
