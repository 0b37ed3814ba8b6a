"""Run a generated sbatch script as SLURM would, with stand-ins for what a cluster provides.

`srun` records its arguments. By default it plays the training run in one line: it writes
the iteration a save reached (``saves``) where Megatron would (``--save``'s folder) and
exits with ``status``. With ``train=True`` it runs its task as srun does (the command
after its options, in a process group of its own, USR1/USR2 forwarded to that group and
TERM turned into a kill, as real srun does), with `torchrun` standing in by starting
``FAKE_MEGATRON`` in a session of its own (as torch's agent starts workers), which trains
step by step, saves as Megatron does (folder, then tracker) and, with
``--exit-signal-handler``, saves and exits after the step in which a SIGTERM arrived.
`scontrol` names one node and records requeues. python3 is this interpreter without its
site-packages (``-S``), with ``modules`` (name -> source) and this checkout on PYTHONPATH
standing in for the cluster's packages, so the pre-flight imports exactly what the test
puts there.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRUN = r'''#!/bin/bash
printf "%s\0" "$@" > "$ARGS_FILE"
if [[ -z "${SIM_TRAIN:-}" ]]; then
    save="" prev=""
    for a in "$@"; do [[ "$prev" == "--save" ]] && save="$a"; prev="$a"; done
    [[ -n "${SIM_SAVED:-}" ]] && echo "$SIM_SAVED" > "$save/latest_checkpointed_iteration.txt"
    exit "${SIM_STATUS:-0}"
fi
while [[ "$1" == --* ]]; do shift; done
set -m
"$@" &
task=$!
set +m
trap 'kill -USR1 -- "-$task"' USR1
trap 'kill -USR2 -- "-$task"' USR2
trap 'echo "srun: forcing job termination" >&2; kill -KILL -- "-$task"' TERM
while kill -0 "$task" 2>/dev/null; do wait "$task" || true; done
wait "$task"
'''
SCONTROL = r'''#!/bin/bash
case "$1" in
    show) echo node-1 ;;
    requeue) echo "$2" >> "$REQUEUE_LOG" ;;
esac
'''
TORCHRUN = r'''#!{python}
import subprocess, sys
args = sys.argv[1:]
flags = args[args.index("-m") + 2:]
worker = subprocess.Popen([sys.executable, {megatron!r}, *flags], start_new_session=True)
sys.exit(worker.wait())
'''
# Megatron's training loop as the script meets it: resume from the tracker, a step at a
# time (SIM_STEP_S), a save each --save-interval (folder first, SIM_SAVE_S writing, then the
# tracker), and with --exit-signal-handler a save and exit after the step a SIGTERM came in.
FAKE_MEGATRON = r'''
import os, pathlib, signal, sys, time
args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1]
save, load = pathlib.Path(value("--save")), pathlib.Path(value("--load"))
interval, iters = int(value("--save-interval")), int(value("--train-iters"))
log = pathlib.Path(os.environ["SIM_LOG"])
tracker = load / "latest_checkpointed_iteration.txt"
start = int(tracker.read_text()) if tracker.is_file() else 0
with log.open("a") as out:
    out.write(f"loaded {start}\n")
stop = []
if "--exit-signal-handler" in args:
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
def checkpoint(it):
    folder = save / f"iter_{it:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pt").write_text("weights")
    time.sleep(float(os.environ.get("SIM_SAVE_S", "0")))
    if not (folder / "model.pt").is_file():
        sys.exit(f"iteration {it}: the checkpoint being written was deleted")
    (save / "latest_checkpointed_iteration.txt").write_text(f"{it}\n")
    with log.open("a") as out:
        out.write(f"saved {it}\n")
for it in range(start + 1, iters + 1):
    time.sleep(float(os.environ.get("SIM_STEP_S", "0.05")))
    pathlib.Path(os.environ["SIM_PROGRESS"]).write_text(str(it))
    if stop:
        checkpoint(it)
        with log.open("a") as out:
            out.write(f"exit on signal at {it}\n")
        sys.exit(0)
    if it % interval == 0:
        checkpoint(it)
if iters % interval:  # Megatron saves at the end of training too
    checkpoint(iters)
'''
# What a cluster that can run the shipped GPU configs has importable.
CLUSTER_MODULES = {
    "megatron/__init__.py": "",
    "megatron/core/__init__.py": "",
    "megatron/core/parallel_state.py": "",
    "megatron/training/__init__.py": "",
    "einops.py": "",
    "transformers.py": "",
    "transformer_engine/__init__.py": "",
    "transformer_engine/pytorch/__init__.py": "",
    "transformer_engine/pytorch/optimizers.py": "FusedAdam = object",
}


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_dir(tmp_path: Path, script: str) -> Path:
    """The run's folder the script uses under ``tmp_path`` (its RUN_DIR line)."""
    name = re.search(r'^RUN_DIR="\$RUN_ROOT/([^"]+)"$', script, re.MULTILINE).group(1)
    return tmp_path / "runs" / name


def _stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    python = f'#!/bin/bash\nexec "{sys.executable}" -S "$@"\n'
    megatron = tmp_path / "fake_megatron.py"
    megatron.write_text(FAKE_MEGATRON)
    write_tree(bin_dir, {"srun": SRUN, "scontrol": SCONTROL, "python3": python,
                         "torchrun": TORCHRUN.format(python=sys.executable,
                                                     megatron=str(megatron))})
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return bin_dir


def job_env(tmp_path: Path, *, job_id: str = "7", env: dict[str, str] | None = None,
            modules: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one job: the stand-ins first on PATH, SLURM's variables."""
    bin_dir, site = _stubs(tmp_path), tmp_path / "site"
    write_tree(site, CLUSTER_MODULES if modules is None else modules)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": f"{site}:{REPO}",
            "ARGS_FILE": str(tmp_path / "args"), "REQUEUE_LOG": str(tmp_path / "requeued"),
            "SIM_LOG": str(tmp_path / "megatron.log"),
            "SIM_PROGRESS": str(tmp_path / "progress"),
            "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NAME": "j",
            "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1",
            "SLURM_CPUS_ON_NODE": "64", "DATA_PATH": "/d", "TOKENIZER_MODEL": "/t",
            "HOME": os.environ.get("HOME", "/tmp"), **(env or {})}


def run_job(tmp_path: Path, script: str, *, modules: dict[str, str] | None = None,
            saves: int | None = None, status: int = 0, start_at: int | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` once as an allocation would, srun playing the run in one line;
    ``start_at``: the iteration an earlier allocation saved."""
    full_env = job_env(tmp_path, env=env, modules=modules)
    if start_at is not None:
        write_tree(run_dir(tmp_path, script) / "checkpoints",
                   {"latest_checkpointed_iteration.txt": f"{start_at}\n"})
    (tmp_path / "job.sbatch").write_text(script)
    if saves is not None:
        full_env["SIM_SAVED"] = str(saves)
    full_env["SIM_STATUS"] = str(status)
    return subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=120)


def start_training_job(tmp_path: Path, script: str, *, job_id: str = "7",
                       env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``script`` as an allocation whose srun runs the stand-in training."""
    full_env = job_env(tmp_path, job_id=job_id, env={"SIM_TRAIN": "1",
                                                     "RETENTION_POLL_S": "0.05", **(env or {})})
    (tmp_path / "job.sbatch").write_text(script)
    (tmp_path / "progress").unlink(missing_ok=True)
    return subprocess.Popen(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_iteration(tmp_path: Path, iteration: int, timeout: float = 60) -> None:
    """Return once the stand-in training has finished step ``iteration``."""
    progress, end = tmp_path / "progress", time.monotonic() + timeout
    while time.monotonic() < end:
        text = progress.read_text() if progress.is_file() else ""  # read once: the job
        if text.isdigit() and int(text) >= iteration:  # may rewrite it between two reads
            return
        time.sleep(0.02)
    raise AssertionError(f"training did not reach iteration {iteration}")


def finish(job: subprocess.Popen, sig: signal.Signals | None = None,
           timeout: float = 60) -> tuple[int, str, str]:
    """Send ``sig`` (if any) to the batch shell, as SLURM does, and wait for the job."""
    if sig is not None:
        job.send_signal(sig)
    out, err = job.communicate(timeout=timeout)
    return job.returncode, out, err


def megatron_log(tmp_path: Path) -> list[str]:
    path = tmp_path / "megatron.log"
    return path.read_text().splitlines() if path.is_file() else []


def srun_args(tmp_path: Path) -> list[str]:
    """What the script passed to srun (empty if it never got there)."""
    path = tmp_path / "args"
    return path.read_text().split("\0")[:-1] if path.is_file() else []


def requeues(tmp_path: Path) -> list[str]:
    path = tmp_path / "requeued"
    return path.read_text().split() if path.is_file() else []
