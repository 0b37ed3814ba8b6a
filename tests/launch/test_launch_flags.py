"""`flags`: the command line carries the config, and Megatron's own parser accepts it."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from megatron_burst.launch.config.schema import ConfigError, expand_vars, load_config
from megatron_burst.launch.run.flags import megatron_flags

from .conftest import CONFIGS, REPO as REPO_ROOT

ENV = {"DATA_PATH": "/data/llama/text_document", "TOKENIZER_MODEL": "/models/tokenizer"}


def _value(flags: list[str], name: str, n: int = 1):
    i = flags.index(name)
    return flags[i + 1] if n == 1 else flags[i + 1:i + 1 + n]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_flags_carry_the_config(path):
    cfg = load_config(path)
    f = megatron_flags(cfg, env=ENV)
    assert _value(f, "--tensor-model-parallel-size") == str(cfg.parallel.tensor)
    assert _value(f, "--context-parallel-size") == str(cfg.parallel.context)
    assert _value(f, "--pipeline-model-parallel-size") == str(cfg.parallel.pipeline)
    assert _value(f, "--seq-length") == str(cfg.model.seq_length)
    assert _value(f, "--spec", 2) == ["megatron_burst.megatron.spec", "get_llama_layer_burst_spec"]
    assert ("--group-query-attention" in f) == (
        cfg.model.num_query_groups < cfg.model.num_attention_heads)
    if cfg.parallel.context > 1:
        assert _value(f, "--cp-comm-type") == "burst"
        # The resolved mode: 'auto' is decided once, for plan and flags alike.
        from megatron_burst.launch.config.burst import topology_of
        assert _value(f, "--burst-backward") == topology_of(cfg).backward
    if "--hierarchical-context-parallel-sizes" in f:
        sizes = [int(x) for x in _value(f, "--hierarchical-context-parallel-sizes", 2)]
        assert math.prod(sizes) == cfg.parallel.context
        # The inner level is the NVLink ring, the same number the adapter is told.
        assert sizes[0] == int(_value(f, "--burst-intra-node-size")) == cfg.burst.intra_node_size
    else:
        assert "--burst-intra-node-size" not in f
    if not cfg.data.mock:
        assert _value(f, "--data-path") == expand_vars(cfg.data.data_path, "", ENV)
        assert _value(f, "--tokenizer-model") == expand_vars(cfg.data.tokenizer_model, "", ENV)


def test_unset_variable_fails_naming_key_and_variable():
    cfg = load_config([p for p in CONFIGS if p.stem == "llama2-7b-32k"][0])
    with pytest.raises(ConfigError, match=r"'data.data_path' uses \$\{DATA_PATH\}"):
        megatron_flags(cfg, env={})
    kept = megatron_flags(cfg, expand=False)
    assert _value(kept, "--data-path") == "${DATA_PATH}"


def _megatron_parser():
    """Megatron's parse_args/validate_args and the adapter's extra-args provider."""
    arguments = pytest.importorskip(
        "megatron.training.arguments",
        reason="megatron.training ships in the megatron-core wheel from 0.17 (Python 3.12) "
               "and with Megatron-LM; megatron-core 0.16.1 (Python 3.11) lacks it")
    adapter = pytest.importorskip("megatron_burst.megatron.arguments",
                                  reason="the adapter's --burst-* arguments are not there yet")
    return arguments, adapter.add_burst_args


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_megatron_parser_accepts_the_flags(path, monkeypatch):
    arguments, provider = _megatron_parser()
    cfg = load_config(path)
    flags = megatron_flags(cfg, env=ENV, save="/ckpt", load="/ckpt")
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt", *flags])
    monkeypatch.setenv("WORLD_SIZE", str(cfg.cluster.world_size))
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # `run` and the sbatch set it
    # validate_args asks the GPU generation; answer as the A100s the configs are for.
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: 8, raising=False)
    args = arguments.parse_args(extra_args_provider=provider)
    args.world_size = cfg.cluster.world_size
    arguments.validate_args(args, {})
    assert args.data_parallel_size == cfg.parallel.data
    assert args.context_parallel_size == cfg.parallel.context
    assert args.tensor_model_parallel_size == cfg.parallel.tensor


@pytest.mark.skipif(not os.environ.get("MEGATRON_TRAINING_PATH"),
                    reason="set MEGATRON_TRAINING_PATH to an unpacked megatron-core >= 0.17 "
                           "wheel (.ci/run does) to parse with it in a subprocess")
def test_newer_megatron_parser_accepts_every_config():
    """Where megatron.training is not installed (Python 3.11), parse with 0.17+'s."""
    script = REPO_ROOT / "tests" / "launch" / "megatron_parse.py"
    proc = subprocess.run([sys.executable, str(script), os.environ["MEGATRON_TRAINING_PATH"],
                           *map(str, CONFIGS)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok ") == len(CONFIGS)


@pytest.mark.parametrize("name, nodes", [("llama3.2-1b-128k-4gpu", 1), ("llama3-8b-1m", 4)])
def test_launcher_line_runs_as_printed(name, nodes, tmp_path, capsys):
    """`flags --launcher torchrun`, pasted into bash: torchrun gets the entry point and flags."""
    from megatron_burst.cli.parser import main

    assert main(["flags", str(REPO_ROOT / "configs" / f"{name}.yaml"), "--keep-vars",
                 "--launcher", "torchrun"]) == 0
    out, err = capsys.readouterr()
    assert ("on each of the 4 nodes" in err) == (nodes > 1)
    (tmp_path / "torchrun").write_text(
        '#!/bin/bash\necho "$CUDA_DEVICE_MAX_CONNECTIONS" > "$OUT"\nprintf "%s\\n" "$@" >> "$OUT"\n')
    (tmp_path / "torchrun").chmod(0o755)
    env = {**os.environ, **ENV, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "OUT": str(tmp_path / "out"), "MASTER_ADDR": "node-1", "MASTER_PORT": "29500"}
    subprocess.run(["bash", "-c", out], env=env, check=True, timeout=60)
    connections, *args = (tmp_path / "out").read_text().splitlines()
    cfg = load_config(REPO_ROOT / "configs" / f"{name}.yaml")
    assert connections == "1"
    assert args[args.index("-m") + 1] == "megatron_burst.megatron.pretrain_gpt"
    assert args[args.index("--nproc-per-node") + 1] == str(cfg.cluster.gpus_per_node)
    if nodes == 1:
        assert "--standalone" in args
    else:
        assert _value(args, "--nnodes") == "4" and _value(args, "--rdzv-endpoint") == "node-1:29500"
    assert args[args.index("-m") + 2:] == megatron_flags(cfg, env=ENV)
