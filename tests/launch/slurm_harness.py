"""Run a generated sbatch script as SLURM would, with stand-ins for what a cluster provides.

`srun` records its arguments and plays the training run: it writes the iteration a save
reached (``saves``) where Megatron would (``--save``'s folder) and exits with ``status``;
`scontrol` names one node and records requeues. python3 is this interpreter without its
site-packages (``-S``), with ``modules`` (name -> source) on PYTHONPATH standing in for the
cluster's packages, so the pre-flight imports exactly what the test puts there.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRUN = r'''#!/bin/bash
printf "%s\0" "$@" > "$ARGS_FILE"
save="" prev=""
for a in "$@"; do [[ "$prev" == "--save" ]] && save="$a"; prev="$a"; done
[[ -n "${SIM_SAVED:-}" ]] && echo "$SIM_SAVED" > "$save/latest_checkpointed_iteration.txt"
exit "${SIM_STATUS:-0}"
'''
SCONTROL = r'''#!/bin/bash
case "$1" in
    show) echo node-1 ;;
    requeue) echo "$2" >> "$REQUEUE_LOG" ;;
esac
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


def run_job(tmp_path: Path, script: str, *, modules: dict[str, str] | None = None,
            saves: int | None = None, status: int = 0, start_at: int | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` once as an allocation would; ``start_at``: the iteration an earlier
    allocation saved."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    python = f'#!/bin/bash\nexec "{sys.executable}" -S "$@"\n'
    write_tree(bin_dir, {"srun": SRUN, "scontrol": SCONTROL, "python3": python})
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    write_tree(site, CLUSTER_MODULES if modules is None else modules)
    ckpt = tmp_path / "runs" / "j-7" / "checkpoints"
    if start_at is not None:
        write_tree(ckpt, {"latest_checkpointed_iteration.txt": f"{start_at}\n"})
    (tmp_path / "job.sbatch").write_text(script)
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(site),
                "ARGS_FILE": str(tmp_path / "args"), "REQUEUE_LOG": str(tmp_path / "requeued"),
                "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NAME": "j",
                "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1",
                "SLURM_CPUS_ON_NODE": "64", "DATA_PATH": "/d", "TOKENIZER_MODEL": "/t",
                "HOME": os.environ.get("HOME", "/tmp"), **(env or {})}
    if saves is not None:
        full_env["SIM_SAVED"] = str(saves)
    full_env["SIM_STATUS"] = str(status)
    return subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=120)


def srun_args(tmp_path: Path) -> list[str]:
    """What the script passed to srun (empty if it never got there)."""
    path = tmp_path / "args"
    return path.read_text().split("\0")[:-1] if path.is_file() else []


def requeues(tmp_path: Path) -> list[str]:
    path = tmp_path / "requeued"
    return path.read_text().split() if path.is_file() else []
