"""`slurm` as a user meets it: allocations a partition takes, chained by requeues that stop when
an allocation saves nothing; saves and the exit margin sized by the checkpoint; the script's
environment set-up and pre-flight (imports, resume) run before training, under stand-ins for
srun and scontrol (``slurm_harness``)."""
from __future__ import annotations

import dataclasses
import math
import re

import pytest

from megatron_burst.megatron import environment
from megatron_burst.cli.parser import main
from megatron_burst.launch.config.schema import ConfigError, load_config
from megatron_burst.launch.planning.job_plan import (DEFAULT_ALLOCATION_MIN, SAVE_SHARE,
                                                     checkpoint_bytes, job_plan)
from megatron_burst.launch.run.runtime_deps import run_needs
from megatron_burst.launch.slurm.sbatch import sbatch_script
from megatron_burst.launch.config.slurm_time import parse_time_limit

from .conftest import CONFIGS, REPO, TINY
from .slurm_harness import CLUSTER_MODULES, requeues, run_job, srun_args

CONFIG = REPO / "configs" / "llama3-8b-32k.yaml"
GPU_CONFIGS = [p for p in CONFIGS if "cpu" not in p.stem]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _sbatch(text: str, option: str) -> str:
    return re.search(rf"^#SBATCH --{option}=(\S+)$", text, re.MULTILINE).group(1)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_gets_a_limit_partitions_take(path, in_tmp, capsys):
    assert main(["slurm", str(path), "-o", "job.sbatch"]) == 0
    out = capsys.readouterr().out
    text = (in_tmp / "job.sbatch").read_text()
    plan = job_plan(load_config(path))
    minutes = parse_time_limit(_sbatch(text, "time"))
    assert minutes == plan.limit_min <= DEFAULT_ALLOCATION_MIN
    # The job is a chain of such allocations, and says how long.
    assert f"allocations: {plan.allocations} expected" in out
    assert plan.allocations == math.ceil(plan.train_iters / plan.steps_per_allocation)
    assert f"--exit-duration-in-mins {minutes - plan.exit_margin_min} " in text
    assert f"--save-interval {plan.save_interval} " in text
    assert f"save interval: {plan.save_interval:,} iterations" in out
    # Whole nodes, with all their memory, only where the run takes every GPU of a node.
    whole = load_config(path).cluster.gpus_per_node == 8
    assert ("#SBATCH --mem=0" in text) == ("#SBATCH --exclusive" in text) == whole
    assert '--cpus-per-task="$SLURM_CPUS_ON_NODE"' in text
    # The pre-flight imports what the run will, in the run's order.
    modules = [need.module for need in run_needs(load_config(path))]
    assert f"# What the run imports ({', '.join(modules)})" in text


def test_saves_and_the_exit_margin_follow_the_checkpoint():
    cfg = load_config(REPO / "configs" / "llama2-70b-128k.yaml")
    plan = job_plan(cfg)
    # bf16 weights and fp32 master weights and moments: 14 bytes a parameter, ~1 TB at 70B.
    assert 0.9e12 < checkpoint_bytes(cfg) < 1.0e12
    assert plan.save_s == pytest.approx(checkpoint_bytes(cfg) / 2e9 + 60)
    # Saves cost at most SAVE_SHARE of training; the exit margin holds a step and two saves.
    assert plan.save_s / (plan.save_interval * plan.step_s) <= SAVE_SHARE * 1.01
    assert plan.exit_margin_min * 60 >= plan.step_s + 2 * plan.save_s
    slower = dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, checkpoint_write_gbps=0.5))
    assert job_plan(slower).exit_margin_min > plan.exit_margin_min
    assert job_plan(slower).save_interval > plan.save_interval
    given = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, save_interval=3))
    assert job_plan(given).save_interval == 3


def test_a_short_job_asks_for_itself_and_the_key_and_flag_override(in_tmp, capsys):
    short = REPO / "configs" / "llama3.2-1b-128k-4gpu.yaml"
    plan = job_plan(load_config(short))
    assert plan.limit_min < DEFAULT_ALLOCATION_MIN and plan.allocations == 1
    assert main(["slurm", str(CONFIG), "--time", "1-12", "-o", "a.sbatch"]) == 0
    assert "#SBATCH --time=1-12:00:00\n" in (in_tmp / "a.sbatch").read_text()
    assert "--time 1-12:00:00 (given)" in capsys.readouterr().out
    cfg = load_config(CONFIG)
    keyed = dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, time_limit="12:00:00"))
    assert _sbatch(sbatch_script(keyed, "configs/x.yaml"), "time") == "12:00:00"
    assert _sbatch(sbatch_script(keyed, "configs/x.yaml", time="30:00:00"), "time") == "1-06:00:00"


def test_cpu_configs_are_refused(in_tmp, capsys):
    assert main(["slurm", str(TINY)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "'cluster.gpu' is cpu" in err and "run" in err


def test_script_goes_under_runs_unless_told(in_tmp, capsys):
    assert main(["slurm", str(CONFIG), "--nodes", "2", "--time", "01:00:00"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in in_tmp.iterdir()) == ["runs"]
    assert "wrote runs/llama3-8b-32k-2n.sbatch (the default place" in out
    assert "note: --nodes 2 instead of cluster.nodes 1: data parallelism 1 -> 2" in out
    assert main(["slurm", str(CONFIG), "--time", "01:00:00", "-o", "job.sh"]) == 0
    assert (in_tmp / "job.sh").is_file()
    gitignore = (REPO / ".gitignore").read_text().split()
    assert "/runs/" in gitignore or "runs/" in gitignore


@pytest.mark.parametrize("flag", ["--save", "--load=/ckpt", "--exit-duration-in-mins",
                                  "--tensorboard-dir"])
def test_megatron_args_the_script_sets_are_refused(flag):
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(cfg, megatron_args=[flag, "/x"] if "=" not in flag else [flag])
    with pytest.raises(ConfigError, match=f"'megatron_args\\[0\\]': {flag.split('=')[0]} is "
                                          f"set by the sbatch script"):
        sbatch_script(cfg, "configs/llama3-8b-32k.yaml", time="01:00:00")


# ------------------------------------------------------------------ the requeue chain

TRAIN_ITERS = load_config(CONFIG).training.train_iters


@pytest.mark.parametrize("start_at, saves, status, requeued, rc", [
    (None, 120, 0, True, 0),  # saved progress before the limit: next allocation
    (120, 250, 0, True, 0),  # a later allocation, progress again
    (120, TRAIN_ITERS, 0, False, 0),  # finished: the chain ends
    (120, None, 0, False, 1),  # nothing saved since the start: stop, do not loop
    (None, None, 1, False, 1),  # crashed before any save: stop with its status
    (120, None, 3, False, 3),  # crashed, nothing new saved: stop with its status
    (120, 140, 1, True, 0),  # crashed after a save: resume from it
])
def test_requeue_guard_under_stub_srun_and_scontrol(tmp_path, start_at, saves, status,
                                                    requeued, rc):
    text = sbatch_script(load_config(CONFIG), "configs/llama3-8b-32k.yaml", time="04:00:00")
    run = run_job(tmp_path, text, start_at=start_at, saves=saves, status=status)
    assert run.returncode == rc, run.stderr
    assert requeues(tmp_path) == (["7"] if requeued else [])
    assert srun_args(tmp_path), "training never started"
    if rc and not requeued:
        assert "saved no progress" in run.stderr and "not requeueing" in run.stderr
    if saves == TRAIN_ITERS:
        assert "training done" in run.stdout


def test_script_passes_the_plan_to_megatron(tmp_path):
    cfg = load_config(CONFIG)
    plan = job_plan(cfg, "04:00:00")
    run = run_job(tmp_path, sbatch_script(cfg, "configs/x.yaml", time="04:00:00"), saves=1)
    args = srun_args(tmp_path)
    assert run.returncode == 0, run.stderr
    assert args[:2] == ["--kill-on-bad-exit=1", "--cpus-per-task=64"]
    assert args[args.index("--exit-duration-in-mins") + 1] == str(plan.exit_after_min)
    assert args[args.index("--save-interval") + 1] == str(plan.save_interval)
    assert args[args.index("--save") + 1] == str(tmp_path / "runs" / "x" / "checkpoints")


# ------------------------------------------------------------------ set-up and pre-flight

def test_setup_file_is_sourced_first_and_a_missing_one_stops_the_job(tmp_path):
    cfg = load_config(CONFIG)
    setup = tmp_path / "env.sh"
    # What a module load or venv activation does: put what the run needs in reach.
    setup.write_text(f'export PYTHONPATH="{tmp_path / "site"}:{REPO}"\nexport MY_SETUP=done\n')
    text = sbatch_script(cfg, "configs/x.yaml", time="04:00:00", setup="${SETUP_DIR}/env.sh")
    assert text.index('source "$SETUP_FILE"') < text.index("python3 -c")
    run = run_job(tmp_path, text, saves=1, env={"SETUP_DIR": str(tmp_path), "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr
    again = tmp_path / "again"
    again.mkdir()
    run = run_job(again, text, env={"SETUP_DIR": "/nowhere"})
    assert run.returncode == 2 and "set-up file /nowhere/env.sh" in run.stderr
    assert not srun_args(again)


@pytest.mark.parametrize("config, missing, named", [
    ("llama3-8b-1m.yaml", "einops.py", "einops"),  # the double ring's hierarchical groups
    ("llama3-8b-32k.yaml", "megatron/training/__init__.py", "megatron.training"),
    ("llama3-8b-32k.yaml", "transformers.py", "transformers"),
])
def test_preflight_imports_what_the_run_will(tmp_path, config, missing, named):
    cfg = load_config(REPO / "configs" / config)
    text = sbatch_script(cfg, f"configs/{config}", time="1-00:00:00")
    modules = {k: v for k, v in CLUSTER_MODULES.items() if k != missing}
    run = run_job(tmp_path, text, modules=modules, saves=1)
    assert run.returncode == 2 and not srun_args(tmp_path), run.stderr
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith(f"error: {named} ")
    assert "pip install -e '.[" in run.stderr
    with_it = tmp_path / "with"
    with_it.mkdir()
    assert run_job(with_it, text, saves=1).returncode == 0


@pytest.mark.parametrize("fused_adam", [False, True])
def test_script_stops_a_job_that_could_not_resume(tmp_path, fused_adam):
    text = sbatch_script(load_config(CONFIG), "configs/llama3-8b-32k.yaml", time="01:00:00")
    modules = {k: v for k, v in CLUSTER_MODULES.items()
               if fused_adam or not k.startswith("transformer_engine")}
    run = run_job(tmp_path, text, modules=modules, saves=1)
    if fused_adam:
        assert run.returncode == 0 and srun_args(tmp_path), run.stderr
        return
    assert run.returncode == 2 and not srun_args(tmp_path)
    assert len(run.stderr.splitlines()) == 1
    assert "TransformerEngine or apex" in run.stderr
    assert "configs/llama3-8b-32k.yaml: training.distributed_optimizer: false" in run.stderr


def test_script_without_the_distributed_optimizer_needs_no_fused_adam(tmp_path):
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(cfg, training=dataclasses.replace(
        cfg.training, distributed_optimizer=False))
    text = sbatch_script(cfg, "configs/llama3-8b-32k.yaml", time="01:00:00")
    assert "FusedAdam" not in text
    modules = {k: v for k, v in CLUSTER_MODULES.items() if not k.startswith("transformer_")}
    modules["transformers.py"] = ""
    assert run_job(tmp_path, text, modules=modules, saves=1).returncode == 0


@pytest.mark.parametrize("data_path, ok", [("/d", True), ("0.7 /a 0.3 /b", True),
                                           ("   ", False), ("0.7 /a 0.3", False)])
def test_script_splits_a_blend_and_refuses_an_empty_data_path(tmp_path, data_path, ok):
    text = sbatch_script(load_config(CONFIG), "configs/x.yaml", time="04:00:00")
    run = run_job(tmp_path, text, saves=1, env={"DATA_PATH": data_path})
    if not ok:
        assert run.returncode == 2 and "data.data_path" in run.stderr and not srun_args(
            tmp_path)
        return
    args = srun_args(tmp_path)
    start = args.index("--data-path") + 1
    assert args[start:args.index("--split")] == data_path.split()


def test_entry_point_resume_check(monkeypatch):
    monkeypatch.setattr(environment, "fused_adam_source", lambda: None)
    problem = environment.distributed_optimizer_resume_problem(True, "/ckpt")
    assert problem is not None and "\n" not in problem
    assert "--use-distributed-optimizer" in problem and "transformer-engine or apex" in problem
    assert "training.distributed_optimizer: false" in problem
    assert environment.distributed_optimizer_resume_problem(True, None) is None
    assert environment.distributed_optimizer_resume_problem(False, "/ckpt") is None
    monkeypatch.setattr(environment, "fused_adam_source", lambda: "apex")
    assert environment.distributed_optimizer_resume_problem(True, "/ckpt") is None


def test_fused_adam_source_follows_megatron_order(monkeypatch):
    import importlib
    import types

    found = {"apex.optimizers": types.SimpleNamespace(FusedAdam=object)}

    def fake_import(name):
        if name in found:
            return found[name]
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    assert environment.fused_adam_source() == "apex"
    found["transformer_engine.pytorch.optimizers"] = types.SimpleNamespace(FusedAdam=object)
    assert environment.fused_adam_source() == "TransformerEngine"
    found.clear()
    assert environment.fused_adam_source() is None


def test_setup_file_runs_without_set_u(tmp_path):
    """conda's activation and many module files read variables that may be unset: the
    script sources them without `set -u` (issue 43), and keeps it for its own lines."""
    setup = tmp_path / "env.sh"
    setup.write_text('if [ -n "$SOME_UNSET_VARIABLE" ]; then echo never; fi\n'
                     'export MY_SETUP="${ANOTHER_UNSET:-done}"\n')
    text = sbatch_script(load_config(CONFIG), "configs/x.yaml", time="04:00:00",
                         setup=str(setup))
    assert text.index("set +u") < text.index('source "$SETUP_FILE"') < text.index("\nset -u\n")
    run = run_job(tmp_path, text, saves=1)
    assert run.returncode == 0, run.stderr
    assert "unbound variable" not in run.stderr and srun_args(tmp_path)
