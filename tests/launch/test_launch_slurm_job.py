"""`slurm` as a user meets it: --time from the predicted job time, --nodes said when it changes
DP, the script under runs/ by default, and a job that cannot resume stopped before training."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest

from megatron_burst import environment
from megatron_burst.launch.cli import main
from megatron_burst.launch.config import ConfigError, load_config
from megatron_burst.launch.slurm import (SAVE_MARGIN_MIN, STARTUP_MIN, TIME_MARGIN,
                                         _time_minutes, predicted_time_limit, sbatch_script)
from megatron_burst.launch.step_time import predict_step

from .conftest import REPO, TINY

CONFIG = REPO / "configs" / "llama3-8b-32k.yaml"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_default_time_is_the_predicted_job_time_with_margins(in_tmp, capsys):
    assert main(["slurm", str(CONFIG)]) == 0
    out = capsys.readouterr().out
    script = (in_tmp / "runs" / "llama3-8b-32k-1n.sbatch").read_text()
    limit = re.search(r"^#SBATCH --time=(\S+)$", script, re.MULTILINE).group(1)
    cfg = load_config(CONFIG)
    job_min = cfg.training.train_iters * predict_step(cfg).step_s / 60
    minutes = _time_minutes(limit)
    low = job_min * TIME_MARGIN + STARTUP_MIN + SAVE_MARGIN_MIN
    assert low <= minutes < low + 15
    assert f"note: --time {limit}: plan predicts" in out
    assert limit == predicted_time_limit(cfg).limit
    # Megatron saves and exits SAVE_MARGIN_MIN before the limit.
    assert f"--exit-duration-in-mins {minutes - SAVE_MARGIN_MIN}" in script


def test_given_time_is_kept_and_cpu_configs_need_one(in_tmp, capsys):
    assert main(["slurm", str(CONFIG), "--time", "02:00:00"]) == 0
    assert "note: --time" not in capsys.readouterr().out
    assert "#SBATCH --time=02:00:00\n" in (in_tmp / "runs" / "llama3-8b-32k-1n.sbatch").read_text()
    assert main(["slurm", str(TINY)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--time is required" in err


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


def _run_script(tmp_path, text: str, fused_adam: bool) -> subprocess.CompletedProcess:
    """Run ``text`` with stand-ins for what a cluster provides; python3 imports
    megatron.training, and a fused Adam only if ``fused_adam``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = ('case "$2" in *megatron.training*) exit 0;; *FusedAdam*) exit '
              f'{0 if fused_adam else 1};; esac; exit 1')
    for name, body in {"python3": python, "scontrol": "echo node-1",
                       "srun": 'printf "%s\\0" "$@" > "$ARGS_FILE"'}.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGS_FILE": str(tmp_path / "args"),
           "RUN_ROOT": str(tmp_path / "runs"), "SLURM_JOB_NAME": "j", "SLURM_JOB_ID": "1",
           "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1", "DATA_PATH": "/d",
           "TOKENIZER_MODEL": "/t"}
    return subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("fused_adam", [False, True])
def test_script_stops_a_job_that_could_not_resume(tmp_path, fused_adam):
    text = sbatch_script(load_config(CONFIG), "configs/llama3-8b-32k.yaml", time="01:00:00")
    run = _run_script(tmp_path, text, fused_adam)
    if fused_adam:
        assert run.returncode == 0 and (tmp_path / "args").is_file(), run.stderr
        return
    assert run.returncode == 2 and not (tmp_path / "args").exists()
    assert len(run.stderr.splitlines()) == 1
    assert "TransformerEngine or apex" in run.stderr
    assert "configs/llama3-8b-32k.yaml: training.distributed_optimizer: false" in run.stderr


def test_script_without_the_distributed_optimizer_needs_no_fused_adam(tmp_path):
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(cfg, training=dataclasses.replace(
        cfg.training, distributed_optimizer=False))
    text = sbatch_script(cfg, "configs/llama3-8b-32k.yaml", time="01:00:00")
    assert "FusedAdam" not in text
    assert _run_script(tmp_path, text, fused_adam=False).returncode == 0


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
