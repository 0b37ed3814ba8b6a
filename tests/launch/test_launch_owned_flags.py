"""megatron_args are checked by what they set, not by how they are spelt: argparse
destinations (aliases) and what Megatron sets after parsing (validate_args), from the table
generated from the pinned megatron-core, which a test regenerates where that wheel is at hand
and checks against Megatron's own parser and validate_args."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from megatron_burst.launch.config.schema import ConfigError, config_from_dict, load_config
from megatron_burst.launch.config.megatron_options import PINNED, TABLE_FILE, pinned_table

from .conftest import REPO, TINY

WHEEL = os.environ.get("MEGATRON_TRAINING_PATH")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="set MEGATRON_TRAINING_PATH to an unpacked "
                                                   "megatron-core wheel (.ci/run does)")


@pytest.mark.parametrize("args, key, says", [
    # an alias of --save-interval, both spellings of the value
    (["--persistent-save-interval", "7"], "training.save_interval", "which sets save_interval"),
    (["--persistent-save-interval=7"], "training.save_interval", "which sets save_interval"),
    # validate_args: recompute_activations -> recompute_granularity = 'selective'
    (["--recompute-activations"], "training.recompute", "Megatron sets recompute_granularity"),
    (["--encoder-seq-length", "512"], "model.seq_length", "Megatron sets seq_length"),
    (["--use-megatron-fsdp"], "training.distributed_optimizer", "use_distributed_optimizer"),
    (["--tensor-parallel-num-weight-shards", "2"], "cluster.nodes", "data_parallel_size"),
])
def test_what_an_entry_sets_is_checked_not_its_spelling(tiny_raw, args, key, says):
    tiny_raw["megatron_args"] = ["--log-timers-to-tensorboard", *args]
    with pytest.raises(ConfigError) as error:
        config_from_dict(tiny_raw)
    message = str(error.value)
    assert message.startswith("'megatron_args[1]': " + args[0].split("=")[0]), message
    assert says in message and f"set {key}" in message, message


@pytest.mark.parametrize("flag", ["--yaml-cfg", "--use-checkpoint-args"])
def test_entries_that_replace_every_argument(tiny_raw, flag):
    tiny_raw["megatron_args"] = [flag, "x"] if flag == "--yaml-cfg" else [flag]
    with pytest.raises(ConfigError, match="replace any argument after parsing"):
        config_from_dict(tiny_raw)


@pytest.mark.parametrize("args", [
    ["--log-timers-to-tensorboard", "--ckpt-format", "torch_dist", "--wandb-exp-name=x"],
    ["--no-load-optim", "--no-load-rng", "--manual-gc", "--num-workers", "4"],
    ["--cuda-graph-impl", "local", "--exit-interval", "100", "--tensorboard-log-interval", "5"],
    ["--num-layers-per-virtual-pipeline-stage", "2", "--use-flash-attn"],
])
def test_entries_the_plan_does_not_decide_pass(tiny_raw, args):
    tiny_raw["megatron_args"] = args
    assert config_from_dict(tiny_raw).megatron_args == args


def test_every_owned_flag_is_a_megatron_option():
    """An owned flag missing from the table could only be matched by spelling."""
    from megatron_burst.launch.config.owned_flags import FIXED, OWNED_FLAGS

    table = pinned_table()
    # Megatron-LM's patch adds this one (upstream has only the --no- form in 0.19).
    missing = [f for f in OWNED_FLAGS if table.dest(f) is None]
    assert missing == ["--create-attention-mask-in-dataloader"]
    assert OWNED_FLAGS[missing[0]] == FIXED


def test_the_table_is_the_pinned_megatron_cores():
    table = pinned_table()
    assert table.megatron_core == PINNED
    ci = (REPO / ".ci" / "run").read_text()
    assert re.findall(r"megatron-core==([\d.]+)", ci) == [PINNED], "CI unpacks another version"
    assert table.dest("--persistent-save-interval") == table.dest("--save-interval")


@needs_wheel
def test_the_committed_table_is_what_the_generator_makes():
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m",
                           "megatron_burst.launch.config.megatron_options", "--megatron", WHEEL],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == json.loads(TABLE_FILE.read_text()), (
        "regenerate it: python -m megatron_burst.launch.config.megatron_options --megatron "
        "$MEGATRON_TRAINING_PATH --write")


# Megatron's own parse_args and validate_args on the tiny config's flags, with and without
# the entries: what each destination ends up holding.
PROBE = """
import json, os, sys, typing, typing_extensions
typing.override = getattr(typing, "override", typing_extensions.override)
sys.path.insert(0, sys.argv[1])
import megatron.training.arguments as arguments
from megatron_burst.launch.config.schema import load_config
from megatron_burst.launch.run.flags import megatron_flags
from megatron_burst.megatron.arguments import add_burst_args
arguments.get_device_arch_version = lambda: 8
os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
cfg = load_config(sys.argv[2])
extra, dest = json.loads(sys.argv[3]), sys.argv[4]
values = []
for words in ([], extra):
    sys.argv = ["pretrain_gpt", *megatron_flags(cfg, save="/c", load="/c"), *words]
    args = arguments.parse_args(extra_args_provider=add_burst_args)
    args.world_size = cfg.cluster.world_size
    arguments.validate_args(args, {})
    values.append(getattr(args, dest))
print(json.dumps(values))
"""


@needs_wheel
@pytest.mark.parametrize("extra, dest, planned, run", [
    (["--recompute-activations"], "recompute_granularity", None, "selective"),
    # The tiny CPU config sets no interval and has no step time: one save, at the end.
    (["--persistent-save-interval", "7"], "save_interval",
     load_config(TINY).training.train_iters, 7),
])
def test_megatron_does_set_what_the_table_says(extra, dest, planned, run):
    """The issue's two cases, run through Megatron's parser: the plan would be wrong."""
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", PROBE, WHEEL, str(TINY),
                           json.dumps(extra), dest], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "WORLD_SIZE": "4"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [planned, run]


def test_run_on_a_gpu_host_checks_with_the_installed_megatron(tiny_raw, monkeypatch):
    """An option the pinned table does not know (a newer Megatron's alias, say) is caught by
    `run` with the installed Megatron's table."""
    import dataclasses

    from megatron_burst.launch.config import megatron_options
    from megatron_burst.cli import run_command

    pinned = pinned_table()
    newer = dataclasses.replace(pinned, dests={**pinned.dests,
                                               "--cp-size": "context_parallel_size"})
    # Unknown to the pinned table, so the loader refuses it; a config built in Python has
    # not been through the loader.
    cfg = dataclasses.replace(config_from_dict(tiny_raw), megatron_args=["--cp-size", "2"])
    monkeypatch.setattr(megatron_options, "live_table", lambda: newer)
    with pytest.raises(ConfigError, match=r"--cp-size \(which sets context_parallel_size, as "
                                          r"--context-parallel-size does\).*parallel.context"):
        run_command._check_with_installed_megatron(cfg)


LIVE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from megatron_burst.launch.config.megatron_options import live_table
print(json.dumps(live_table().to_json()))
"""


@needs_wheel
def test_the_live_table_reads_the_installed_megatron_alike():
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", LIVE, WHEEL],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == json.loads(TABLE_FILE.read_text())


@pytest.mark.parametrize("args, message", [
    (["--no-such-flag"], r"'megatron_args\[0\]': --no-such-flag is not an option of Megatron's "
                         r"parser \(megatron-core 0\.19\.2"),
    (["--log-timers-to-tensorboard", "--save-intervl", "5"],
     r"'megatron_args\[1\]': --save-intervl is not an option.*did you mean --save-interval\?"),
    (["--wandb-exp-name=x", "--no-such-flag=3"], r"'megatron_args\[1\]': --no-such-flag is not"),
])
def test_unknown_megatron_flags_are_refused_when_the_config_loads(tiny_raw, args, message):
    """Issue 43: they passed plan, flags and slurm and failed at the front of the queue."""
    tiny_raw["megatron_args"] = args
    with pytest.raises(ConfigError, match=message):
        config_from_dict(tiny_raw)


def test_plan_refuses_an_unknown_flag_in_one_line(tiny_raw, write_config, capsys):
    from megatron_burst.cli.parser import main

    tiny_raw["megatron_args"] = ["--no-such-flag"]
    assert main(["plan", str(write_config(tiny_raw))]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--no-such-flag is not an option" in err
