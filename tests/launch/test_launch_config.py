"""The YAML schema: shipped configs load; bad ones fail with a message naming the key."""
from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing

import pytest

from megatron_burst.launch.config.schema import (BOUNDS, Config, ConfigError, config_from_dict,
                                                 expand_vars, load_config, variables, with_nodes)
from megatron_burst.launch.planning.plan import validate

from .conftest import CONFIGS, TINY


def test_configs_cover_models_and_lengths():
    names = {p.stem for p in CONFIGS}
    for model in ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b"):
        for length in ("32k", "128k", "512k"):
            assert f"{model}-{length}" in names
    assert {"llama2-7b-1m", "llama3-8b-1m", "tiny-llama-cpu"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_loads_with_a_why_header(path):
    cfg = load_config(path)
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), f"{path.name} must start with a header comment saying why it fits"
    if cfg.cluster.gpu != "cpu" and not cfg.data.mock:
        # Real runs take their data and tokenizer from variables, never a hard-coded path.
        assert variables(cfg) == ["DATA_PATH", "TOKENIZER_MODEL"]


@pytest.mark.parametrize("mutate, key", [
    (lambda r: r["model"].__setitem__("hiden_size", 64), "model.hiden_size"),
    (lambda r: r["model"].__setitem__("rope_scaling", 8.0), "model.rope_scaling"),
    (lambda r: r.__setitem__("optimiser", {"lr": 1}), "optimiser"),
    (lambda r: r["parallel"].__setitem__("tensr", 2), "parallel.tensr"),
    (lambda r: r["burst"].__setitem__("intra_node", 2), "burst.intra_node"),
])
def test_unknown_key_is_named(tiny_raw, write_config, mutate, key):
    mutate(tiny_raw)
    with pytest.raises(ConfigError, match=f"unknown key '{key}'"):
        load_config(write_config(tiny_raw))


@pytest.mark.parametrize("section, field, value, message", [
    ("model", "num_layers", "two", "'model.num_layers' must be an integer"),
    ("model", "num_layers", True, "'model.num_layers' must be an integer"),
    ("parallel", "sequence_parallel", "yes", "'parallel.sequence_parallel' must be true or false"),
    ("burst", "backward", "fast", "'burst.backward' must be one of auto, burst, ring"),
    ("training", "recompute", "some", "'training.recompute' must be one of"),
    ("cluster", "gpu", "a100-40gb", "'cluster.gpu' must be one of"),
    ("model", "normalization", "BatchNorm", "'model.normalization' must be one of"),
])
def test_bad_value_is_named(tiny_raw, section, field, value, message):
    tiny_raw[section][field] = value
    with pytest.raises(ConfigError, match=message):
        config_from_dict(tiny_raw)


@pytest.mark.parametrize("section, field, value, message", [
    ("model", "num_layers", -2, "'model.num_layers' must be at least 1, got -2"),
    ("model", "hidden_size", 0, "'model.hidden_size' must be at least 1, got 0"),
    ("model", "norm_epsilon", 0, "'model.norm_epsilon' must be greater than 0, got 0.0"),
    ("parallel", "context", 0, "'parallel.context' must be at least 1, got 0"),
    ("training", "lr", -1, "'training.lr' must be greater than 0, got -1.0"),
    ("training", "min_lr", -1e-5, "'training.min_lr' must be at least 0"),
    ("training", "lr_warmup_iters", -1, "'training.lr_warmup_iters' must be at least 0"),
    ("training", "adam_beta2", 1, "'training.adam_beta2' must be in [0, 1), got 1.0"),
    ("training", "train_iters", 0, "'training.train_iters' must be at least 1, got 0"),
])
def test_out_of_range_number_is_named(tiny_raw, section, field, value, message):
    tiny_raw[section][field] = value
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict(tiny_raw)


def _numeric_keys(cls: type, prefix: str = "") -> list[str]:
    """Dotted keys of every int or float field of the schema (optional ones included)."""
    keys = []
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            keys += _numeric_keys(hint, f"{prefix}{name}.")
            continue
        is_union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        kinds = set(typing.get_args(hint)) if is_union else {hint}
        if kinds & {int, float}:
            keys.append(f"{prefix}{name}")
    return keys


def test_every_number_has_a_range():
    # A new numeric field without a range would let `plan` compute with negative sizes.
    assert sorted(_numeric_keys(Config)) == sorted(BOUNDS)


def test_directory_or_missing_file_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("{}")
    with pytest.raises(ConfigError, match="is a directory; give one YAML config file, e.g."):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def test_missing_required_key_is_named(tiny_raw):
    del tiny_raw["model"]["seq_length"]
    with pytest.raises(ConfigError, match="missing required key 'model.seq_length'"):
        config_from_dict(tiny_raw)


def test_load_error_names_the_file(tiny_raw, write_config):
    tiny_raw["model"]["hiden_size"] = 1
    path = write_config(tiny_raw, "typo.yaml")
    with pytest.raises(ConfigError, match="typo.yaml"):
        load_config(path)


def test_dollar_outside_a_variable_is_refused(tiny_raw):
    tiny_raw["data"]["data_path"] = "$DATA_PATH/x"
    with pytest.raises(ConfigError, match="data.data_path"):
        config_from_dict(tiny_raw)


def test_variables_expand_from_env_and_unset_ones_are_named():
    assert expand_vars("${A}/b_${C}", "data.data_path", {"A": "/x", "C": "y"}) == "/x/b_y"
    with pytest.raises(ConfigError, match=r"'data.tokenizer_model' uses \$\{TOK\}"):
        expand_vars("${TOK}", "data.tokenizer_model", {})


# Arithmetic checks (plan.validate): each names the field to change.
@pytest.mark.parametrize("changes, key", [
    ({"model": {"seq_length": 250}}, "model.seq_length"),  # not a multiple of 2 x CP = 4
    ({"parallel": {"tensor": 4, "context": 1}, "model": {"num_query_groups": 4,
      "seq_length": 258}}, "model.seq_length"),  # 258 tokens do not split over SP x TP=4
    ({"model": {"hidden_size": 96, "num_attention_heads": 6, "num_query_groups": 4}},
     "model.num_query_groups"),
    ({"model": {"num_attention_heads": 2, "num_query_groups": 2, "hidden_size": 64}},
     None),  # 2 heads over TP 2: fine
    ({"model": {"num_layers": 3}, "parallel": {"pipeline": 2, "context": 1}},
     "model.num_layers"),
    ({"parallel": {"data": 2}}, "parallel.data"),  # world size 8 on a 4-rank host
    ({"burst": {"intra_node_size": 4}}, "burst.intra_node_size"),  # does not divide ring 2
    ({"burst": {"ulysses_size": 3}}, "burst.ulysses_size"),
    # One CP rank per node: a fixed Ulysses 2 runs its all-to-all across the nodes, priced
    # on the inter-node link (issue 41: on slow links it can be the fastest).
    ({"burst": {"ulysses_size": 2}, "cluster": {"gpus_per_node": 2, "nodes": 2}}, None),
    ({"training": {"global_batch_size": 3}}, "training.global_batch_size"),
    ({"training": {"min_lr": 0.01}}, "training.min_lr"),  # above lr 3e-3
    ({"training": {"lr_warmup_iters": 40}}, "training.lr_warmup_iters"),  # = train_iters
    ({"training": {"micro_batch_size": 4096, "global_batch_size": 4096},
      "model": {"seq_length": 65536}}, "cluster.gpu"),  # far beyond 4 GiB
])
def test_arithmetic_errors_are_named(tiny_raw, changes, key):
    raw = copy.deepcopy(tiny_raw)
    for section, values in changes.items():
        raw[section].update(values)
    cfg = config_from_dict(raw)
    if key is None:
        validate(cfg)
        return
    with pytest.raises(ConfigError, match=f"'{key}'"):
        validate(cfg)


def test_inner_ring_may_not_cross_nodes():
    # TP=4 leaves 2 CP ranks per 8-GPU node: an inner ring of 4 would cross InfiniBand.
    cfg = load_config([p for p in CONFIGS if p.stem == "llama2-7b-1m"][0])
    assert cfg.parallel.tensor == 4 and cfg.burst.intra_node_size == 2
    validate(cfg)
    bad = config_from_dict({**_as_dict(cfg), "burst": {"intra_node_size": 4}})
    with pytest.raises(ConfigError, match="'burst.intra_node_size'.*cross nodes"):
        validate(bad)


def test_with_nodes_scales_data_parallelism():
    cfg = load_config([p for p in CONFIGS if p.stem == "llama2-7b-32k"][0])
    bigger = with_nodes(cfg, 4)
    assert bigger.cluster.nodes == 4
    assert bigger.parallel.data == cfg.parallel.data * 4 // cfg.cluster.nodes
    tiny = load_config(TINY)
    with pytest.raises(ConfigError, match="'cluster.nodes'"):
        with_nodes(tiny, 0)


def _as_dict(cfg) -> dict:
    import dataclasses
    return dataclasses.asdict(cfg)
