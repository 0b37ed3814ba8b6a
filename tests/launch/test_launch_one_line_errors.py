"""Inputs that gave a traceback now give one line naming the key, and exit status 2: numbers
too large for their field, seeds numpy refuses, a profile the time model cannot divide by.
(A lone surrogate in a corpus: test_launch_data_safety; `tune --out` into a missing folder
and `slurm -o` a folder: test_launch_outputs.)"""
from __future__ import annotations

import json

import pytest
import yaml

from megatron_burst.cli.parser import main
from megatron_burst.decide.timing import PROFILES_DIR

from .conftest import REPO

GPU_CONFIG = REPO / "configs" / "llama2-7b-32k.yaml"


def _plan(write_config, raw: dict, capsys) -> str:
    assert main(["plan", str(write_config(raw))]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("section, key", [
    ("training", "lr"), ("training", "min_lr"), ("training", "weight_decay"),
    ("training", "clip_grad"), ("training", "adam_beta1"), ("model", "norm_epsilon"),
])
def test_an_integer_too_large_for_a_float_field(tiny_raw, write_config, capsys, section, key):
    tiny_raw[section][key] = 10**400
    err = _plan(write_config, tiny_raw, capsys)
    assert f"'{section}.{key}' must be a number a float can hold" in err
    assert "an integer of 401 digits" in err


@pytest.mark.parametrize("section, key", [("model", "vocab_size"), ("training", "train_iters"),
                                          ("model", "hidden_size")])
def test_an_integer_beyond_int64(tiny_raw, write_config, capsys, section, key):
    tiny_raw[section][key] = 2**63
    err = _plan(write_config, tiny_raw, capsys)
    assert f"'{section}.{key}' must be below 2^63 in size" in err


def test_an_integer_python_will_not_read(tiny_raw, write_config, capsys, tmp_path):
    text = yaml.safe_dump(tiny_raw).replace("lr: 0.003", "lr: " + "9" * 5000)
    (tmp_path / "huge.yaml").write_text(text)
    assert main(["plan", str(tmp_path / "huge.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "'training.lr' at line" in err, err
    assert "an integer of 5000 digits" in err


def test_an_infinite_float(tiny_raw, write_config, capsys):
    tiny_raw["training"]["lr"] = float("inf")
    assert "'training.lr' must be a finite number, got inf" in _plan(write_config, tiny_raw,
                                                                      capsys)


@pytest.mark.parametrize("seed, pipeline, ok", [
    (2**32 - 1, 1, True), (2**32, 1, False), (2**40, 1, False), (0, 1, False),
    (2**32 - 1, 2, False), (2**32 - 101, 2, True),
])
def test_seeds_numpy_refuses_are_refused(tiny_raw, write_config, capsys, seed, pipeline, ok):
    from megatron_burst.launch.config.schema import ConfigError, config_from_dict

    tiny_raw["training"]["seed"] = seed
    tiny_raw["parallel"]["pipeline"] = pipeline
    if ok:
        assert config_from_dict(tiny_raw).training.seed == seed
        return
    with pytest.raises(ConfigError, match="'training.seed'"):
        config_from_dict(tiny_raw)


@pytest.mark.parametrize("edit, named", [
    (lambda p: p["intra"].update(gbps=0, points=[]), "intra.gbps must be a number above 0"),
    (lambda p: p["inter"].update(gbps=-3), "inter.gbps must be a number above 0"),
    (lambda p: p["alltoall"].update(points=[[1048576, 0]]), "alltoall.points[0] (GB/s)"),
    (lambda p: p["dense"].update(peak_tflops="fast"), "dense.peak_tflops must be a number"),
    (lambda p: p.update(memory_gbps=0), "memory_gbps must be a number above 0"),
    (lambda p: p.pop("varlen"), "'varlen' must be an object"),
])
def test_a_profile_the_time_model_cannot_use(tmp_path, write_config, capsys, edit, named):
    profile = json.loads((PROFILES_DIR / "a100-ib.json").read_text())
    edit(profile)
    (tmp_path / "broken.json").write_text(json.dumps(profile))
    raw = yaml.safe_load(GPU_CONFIG.read_text())
    raw["cluster"]["profile"] = str(tmp_path / "broken.json")
    err = _plan(write_config, raw, capsys)
    assert "'cluster.profile': profile" in err and named in err, err


def test_a_missing_profile_is_named_by_its_key(tiny_raw, write_config, capsys, tmp_path):
    """The key is cluster.profile; it was reported as 'burst.profile'."""
    tiny_raw["cluster"]["profile"] = str(tmp_path / "none.json")
    err = _plan(write_config, tiny_raw, capsys)
    assert "'cluster.profile': profile" in err and "burst.profile" not in err, err
