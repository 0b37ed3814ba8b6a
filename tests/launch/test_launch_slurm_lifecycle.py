"""A job a user can leave running (issue 43), under stand-ins for srun, torchrun and Megatron
(``slurm_harness``): a signal mid-step saves and the resubmitted job resumes from it; the run's
folder follows the run, not the job; retention keeps the newest N checkpoints, never deletes
one being written or one the run did not write."""
from __future__ import annotations

import dataclasses
import signal

import pytest

from megatron_burst.cli.parser import main
from megatron_burst.launch.slurm.checkpoint_retention import Retention, kept
from megatron_burst.launch.config.schema import ConfigError, load_config
from megatron_burst.launch.planning.job_plan import job_plan
from megatron_burst.launch.slurm.sbatch import sbatch_script
from megatron_burst.launch.planning.units import format_bytes

from .conftest import REPO
from .slurm_harness import (finish, megatron_log, requeues, run_dir, start_training_job,
                            wait_for_iteration)

CONFIG = REPO / "configs" / "llama3-8b-32k.yaml"


def _script(iters: int = 30, interval: int = 4, keep: int = 2, every: int | None = None,
            **kw) -> str:
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(
        cfg, training=dataclasses.replace(cfg.training, train_iters=iters, save_interval=interval),
        slurm=dataclasses.replace(cfg.slurm, keep_checkpoints=keep, keep_every=every))
    return sbatch_script(cfg, "configs/x.yaml", time="04:00:00", **kw)


def _checkpoints(tmp_path, text) -> list[int]:
    folder = run_dir(tmp_path, text) / "checkpoints"
    return sorted(int(p.name[5:]) for p in folder.iterdir() if p.name.startswith("iter_"))


# ------------------------------------------------------------------ signals and resubmission

@pytest.mark.parametrize("sig, reason, requeued", [
    (signal.SIGTERM, "term", False),  # preemption or scancel: SLURM decides what follows
    (signal.SIGUSR2, "stop", False),  # scancel --batch --signal=USR2: save and stop
    (signal.SIGUSR1, None, True),  # --signal before the time limit: save and requeue
])
def test_a_signal_mid_run_saves_and_the_resubmitted_job_resumes(tmp_path, sig, reason,
                                                                 requeued):
    text = _script()
    job = start_training_job(tmp_path, text, env={"SIM_STEP_S": "0.1"})
    wait_for_iteration(tmp_path, 6)
    rc, out, err = finish(job, sig)
    assert rc == 0, err
    log = megatron_log(tmp_path)
    stopped = int(log[-1].split()[-1])
    assert log[-1] == f"exit on signal at {stopped}" and 6 <= stopped < 30
    assert f"saved {stopped}" in log  # the step it was in, not the last periodic save
    assert f"received {sig.name.replace('SIG', '')}" in err
    assert requeues(tmp_path) == (["7"] if requeued else [])
    if reason:
        assert f"stopped by {reason} at saved iteration {stopped}" in out
    # A new sbatch of the same script (a new job id) resumes from that save, and finishes.
    rc, out, err = finish(start_training_job(tmp_path, text, job_id="8"))
    assert rc == 0, err
    assert f"loaded {stopped}" in megatron_log(tmp_path)
    assert "training done: iteration 30 of 30" in out
    assert f"run dir {run_dir(tmp_path, text)}, from iteration {stopped}" in out


def test_a_node_task_passes_the_signal_to_the_training_not_to_torchrun(tmp_path):
    """srun forwards USR1 to the task's process group (torchrun and the shell around it);
    torch's workers run in sessions of their own. Without the node task, torchrun would die
    of the signal and the workers would never hear it."""
    text = _script().replace('bash -c "$NODE_TASK" node-task torchrun', "torchrun")
    job = start_training_job(tmp_path, text, env={"SIM_STEP_S": "0.1"})
    wait_for_iteration(tmp_path, 3)
    _, out, _ = finish(job, signal.SIGUSR2)
    assert "training exited with status 138" in out  # torchrun died of USR1, srun with it
    wait_for_iteration(tmp_path, 30)  # the orphaned worker never heard it, and trained on
    assert not any(line.startswith("exit on signal") for line in megatron_log(tmp_path))


def test_start_over_is_a_choice_and_moves_the_run_aside(tmp_path):
    text = _script(iters=8)
    assert finish(start_training_job(tmp_path, text))[0] == 0
    rc, out, _ = finish(start_training_job(tmp_path, text, job_id="8"))
    assert "loaded 8" in megatron_log(tmp_path) and "training done" in out
    rc, out, _ = finish(start_training_job(tmp_path, text, job_id="9",
                                           env={"START_OVER": "1"}))
    assert rc == 0 and "START_OVER=1: moved the earlier run" in out
    assert [line for line in megatron_log(tmp_path) if line.startswith("loaded")][-1] == "loaded 0"
    aside = run_dir(tmp_path, text).parent / "x.before-9"
    assert (aside / "checkpoints" / "iter_0000008").is_dir()


def test_a_folder_of_another_model_stops_the_job(tmp_path):
    text = _script(iters=4)
    assert finish(start_training_job(tmp_path, text))[0] == 0
    cfg = load_config(CONFIG)
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers=2))
    rc, _, err = finish(start_training_job(tmp_path, sbatch_script(other, "configs/x.yaml",
                                                                   time="04:00:00"), job_id="8"))
    assert rc == 2 and "holds checkpoints of another model" in err and "--run-name" in err


def test_the_run_folder_is_named_by_the_run_not_the_job():
    text = _script(run_name="long-ctx-a")
    assert 'RUN_DIR="$RUN_ROOT/long-ctx-a"' in text and "SLURM_JOB_ID}\"" not in text
    with pytest.raises(ValueError, match="--run-name"):
        _script(run_name="a b")


def test_a_run_root_under_home_is_warned_about(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RUN_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["slurm", str(CONFIG), "--time", "04:00:00", "-o", "job.sbatch"]) == 0
    out = capsys.readouterr().out
    plan = job_plan(load_config(CONFIG), "04:00:00")
    disk = format_bytes(3 * plan.checkpoint_bytes)
    assert plan.checkpoints_on_disk == 3  # the newest 2, and one being written
    assert f"inside $HOME, whose quota is small: up to 3 checkpoints, {disk}" in out
    rc, _, err = finish(start_training_job(tmp_path, (tmp_path / "job.sbatch").read_text(),
                                           env={"HOME": str(tmp_path), "SIM_STEP_S": "0"}))
    assert "is under $HOME" in err


# ------------------------------------------------------------------ retention

def test_retention_keeps_the_newest_and_never_what_it_did_not_write(tmp_path):
    text = _script(iters=30, interval=4, keep=2)
    folder = run_dir(tmp_path, text) / "checkpoints"
    # Another run's checkpoint, which this one resumes from: never the run's to delete.
    (folder / "iter_0000002").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("2\n")
    # SIM_SAVE_S: each save stays half-written for a while; the stand-in fails if its
    # checkpoint disappears meanwhile.
    rc, out, err = finish(start_training_job(tmp_path, text, env={"SIM_SAVE_S": "0.3"}))
    assert rc == 0, err
    assert _checkpoints(tmp_path, text) == [2, 28, 30]
    assert "retention: deleted checkpoint(s) of iteration" in out


def test_retention_keeps_every_mth_and_refuses_one_no_save_lands_on(tmp_path):
    text = _script(iters=30, interval=4, keep=1, every=12)
    assert finish(start_training_job(tmp_path, text))[0] == 0
    assert _checkpoints(tmp_path, text) == [12, 24, 30]
    cfg = load_config(CONFIG)
    cfg = dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, keep_every=10),
                              training=dataclasses.replace(cfg.training, save_interval=4))
    with pytest.raises(ValueError, match="'slurm.keep_every' 10 is not a multiple of the save "
                                         "interval 4"):
        job_plan(cfg, "04:00:00")


def _folder(ckpt, it):
    (ckpt / f"iter_{it:07d}").mkdir(parents=True)


def test_retention_never_deletes_one_being_written(tmp_path):
    ckpt, ledger = tmp_path / "checkpoints", tmp_path / "ledger"
    ckpt.mkdir()
    retention = Retention.begin(ckpt, ledger, keep_last=1)
    for it in (10, 20, 30):
        _folder(ckpt, it)
        assert retention.prune() == []  # no tracker yet: nothing is known complete
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20\n")
    _folder(ckpt, 40)  # being written: above the tracker
    assert retention.prune() == [10]  # 20 complete and kept; 30 and 40 above the tracker
    assert sorted(p.name for p in ckpt.glob("iter_*")) == [
        "iter_0000020", "iter_0000030", "iter_0000040"]
    (ckpt / "latest_checkpointed_iteration.txt").write_text("40\n")
    assert retention.prune() == [20, 30]


def test_a_save_cut_off_by_an_allocation_is_never_counted_as_kept(tmp_path):
    ckpt, ledger = tmp_path / "checkpoints", tmp_path / "ledger"
    ckpt.mkdir()
    first = Retention.begin(ckpt, ledger, keep_last=2)
    _folder(ckpt, 10)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("10\n")
    _folder(ckpt, 15)  # the allocation ended while this was written
    first.prune()
    second = Retention.begin(ckpt, ledger, keep_last=2)  # resumes from 10
    _folder(ckpt, 20)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20\n")
    assert second.prune() == [15]  # keeps 10 and 20, the two complete ones
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000010", "iter_0000020"]


def test_kept_is_the_newest_every_mth_and_the_tracker():
    assert kept({4, 8, 12, 16}, 16, 2, None) == {12, 16}
    assert kept({4, 8, 12, 16}, 16, 1, 8) == {8, 16}
    assert kept(set(), 5, 3, None) == {5}


def test_keep_checkpoints_is_a_count(tiny_raw, write_config):
    tiny_raw["slurm"] = {"keep_checkpoints": 0}
    with pytest.raises(ConfigError, match="'slurm.keep_checkpoints' must be at least 1"):
        load_config(write_config(tiny_raw))
