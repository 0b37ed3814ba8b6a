"""`megatron-burst slurm`: write an sbatch script for a config.

The script runs one `torchrun` per node under `srun`, with c10d rendezvous on the job's
first node, so every node runs the same command. Each job gets its own folder
(RUN_ROOT/<job name>-<job id>/ with checkpoints/ and logs/; RUN_ROOT is ``slurm.run_root``,
else $RUN_ROOT, else $SLURM_SUBMIT_DIR/runs); the job id survives a requeue, so a requeued
job finds its own checkpoints and resumes through `--load`. One allocation is a length real
partitions take (``job_plan``): Megatron saves and exits shortly before its limit
(`--exit-duration-in-mins`, the margin sized by the checkpoint's write time), and the script
requeues the job while training is unfinished and the allocation saved progress; one that
saved none stops the chain instead of repeating itself.

Before training the script sources the set-up file, imports what the run will, and checks
the resume path and the cluster's variables (``slurm_preflight``).

Paths in the config stay `${VARIABLES}`: the script checks they are set and lets the
shell expand them on the cluster, where the data lives.

No value from a config or the command line is ever read as shell: every word of a command
is quoted (single quotes, or double quotes with every '$' but a ${NAME} escaped), and the
values of #SBATCH lines, which SLURM reads unquoted, must match a plain character set.
Control characters (a newline would start a new command, or end the #SBATCH block) are
refused everywhere, naming the key or option.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from .config import Config, ConfigError
from .config_values import check_text, control_character
from .flags import double_quoted, megatron_flags, shell_word
from .job_plan import JobPlan, job_plan
from .owned_flags import check_megatron_args
from .slurm_preflight import (data_path_lines, import_lines, resume_lines, setup_lines,
                              variable_lines)

# Flags the script sets itself, after the config's: megatron_args may not set them too.
SCRIPT_FLAGS = {
    "--save": "is set by the sbatch script to its run folder ($RUN_ROOT/<job>-<id>/checkpoints)"
              "; set slurm.run_root or RUN_ROOT to move it",
    "--load": "is set by the sbatch script to its run folder, so a requeued job resumes; set "
              "slurm.run_root or RUN_ROOT to move it",
    "--exit-duration-in-mins": "is set by the sbatch script from the allocation's --time",
    "--tensorboard-dir": "is set by the sbatch script to its run folder's logs/tensorboard",
}
# What SLURM reads after "#SBATCH --option=": no quoting is possible there, so the values
# are held to characters that need none. A partition may be a comma-separated list.
SBATCH_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
SBATCH_VALUES = {"--job-name": SBATCH_NAME, "--account": SBATCH_NAME,
                 "--partition": rf"{SBATCH_NAME}(,{SBATCH_NAME})*"}


def sbatch_value(value: str, option: str) -> str:
    """``value`` for an ``#SBATCH option=`` line; ValueError naming the option if unsafe."""
    if not re.fullmatch(SBATCH_VALUES[option], value):
        raise ValueError(f"{option} {value!r}: an #SBATCH value cannot be quoted, so it may "
                         f"hold only letters, digits and . _ + - (a partition list: commas)")
    return value


def one_line(text: str, what: str) -> str:
    """``text`` for a comment or a command; ValueError naming ``what`` if it holds a
    control character (a newline would end the comment and start a command)."""
    found = control_character(text)
    if found is not None:
        raise ValueError(f"{what} holds a control character ({found[1]!r} at position "
                         f"{found[0]}): it cannot go into a script line")
    return text


def _array_word(word: str) -> str:
    """``word`` quoted for a bash array; a bare word with a comma is quoted too, as
    shellcheck takes "a,b" in an array for a mistaken separator (SC2054)."""
    quoted = shell_word(word)
    return f"'{word}'" if "," in quoted and quoted == word else quoted


def _flag_lines(flags: list[str]) -> list[str]:
    """The FLAGS=( ... ) array: one flag and its values per line, every word quoted.

    A data path may be a blend ("0.7 a 0.3 b"): the script splits it into words with
    ``read -a`` (each word then taken literally), so it enters the array as one expansion.
    """
    lines: list[str] = []
    data_at = flags.index("--data-path") + 1 if "--data-path" in flags else None
    if data_at is not None:
        lines += data_path_lines(flags[data_at])
    lines.append("FLAGS=(")
    group: list[str] = []
    for at, word in enumerate(flags):
        one_line(word, f"the Megatron flag word {word!r}")
        if word.startswith("--") and group:
            lines.append("    " + " ".join(group))
            group = []
        group.append('"${DATA_PATH_WORDS[@]}"' if at == data_at else _array_word(word))
    lines += ["    " + " ".join(group), ")"]
    return lines


def _command_line(cfg: Config, config_path: str, options: dict[str, str | None]) -> str:
    """The `megatron-burst slurm` command that writes this script, for its first comment."""
    words = ["megatron-burst", "slurm", config_path, "--nodes", str(cfg.cluster.nodes)]
    for option, value in options.items():
        if value is not None:
            words += [option, value]
    return " ".join(shlex.quote(word) for word in words)


def _directives(cfg: Config, job_name: str, plan: JobPlan, partition: str | None,
                account: str | None) -> list[str]:
    """The #SBATCH lines: whole nodes, their memory and CPUs, one allocation's time."""
    c = cfg.cluster
    lines = [
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={c.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
    ]
    if cfg.slurm.cpus_per_task is not None:
        lines.append(f"#SBATCH --cpus-per-task={cfg.slurm.cpus_per_task}")
    lines += [
        "#SBATCH --mem=0",  # all of each node's memory: the data loaders and pinned buffers
        "#SBATCH --exclusive",
        f"#SBATCH --time={plan.limit}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=%x-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    return lines


def _run_folder_lines(cfg: Config) -> list[str]:
    root = (double_quoted(cfg.slurm.run_root) if cfg.slurm.run_root is not None
            else '"${RUN_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}/runs}"')
    return [
        "",
        "# One folder per job; a requeued job keeps its id, so it finds its checkpoints.",
        f"RUN_ROOT={root}",
        'RUN_DIR="$RUN_ROOT/${SLURM_JOB_NAME}-${SLURM_JOB_ID}"',
        'CKPT_DIR="$RUN_DIR/checkpoints"',
        'LOG_DIR="$RUN_DIR/logs"',
        'mkdir -p "$CKPT_DIR" "$LOG_DIR"',
        "",
        "# The last iteration saved (Megatron writes it beside the checkpoints; 0 before any).",
        'ITER_FILE="$CKPT_DIR/latest_checkpointed_iteration.txt"',
        "saved_iteration() {",
        '    local it=0',
        '    [[ -f "$ITER_FILE" ]] && it="$(cat "$ITER_FILE")"',
        '    [[ "$it" =~ ^[0-9]+$ ]] || it=0',
        '    echo "$it"',
        "}",
        'START_ITER="$(saved_iteration)"',
    ]


NCCL_LINES = [
    "",
    "# Rendezvous on the first node of the allocation.",
    'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
    'MASTER_PORT="${MASTER_PORT:-29500}"',
    "",
    "# Megatron orders TP/SP communication on one CUDA stream connection.",
    "export CUDA_DEVICE_MAX_CONNECTIONS=1",
    "# InfiniBand between nodes; override the HCA/interface names for your site.",
    'export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}"',
    'export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5}"',
    'export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-^lo,docker}"',
    'export NCCL_IB_TIMEOUT="${NCCL_IB_TIMEOUT:-22}"',
    "# A failed collective aborts the job instead of hanging until the time limit.",
    "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
    "export PYTHONUNBUFFERED=1",
    "",
]


def _launch_lines(cfg: Config, plan: JobPlan) -> list[str]:
    """srun + torchrun, the status kept (not fatal) for the requeue decision after it."""
    c = cfg.cluster
    cpus = cfg.slurm.cpus_per_task
    exit_after = ([f"    --exit-duration-in-mins {plan.exit_after_min} \\"]
                  if plan.exit_after_min is not None else [])
    return [
        "",
        f'echo "job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}): {c.nodes} node(s), '
        'rendezvous $MASTER_ADDR:$MASTER_PORT, run dir $RUN_DIR, from iteration $START_ITER"',
        "STATUS=0",
        "srun --kill-on-bad-exit=1 "
        + (f"--cpus-per-task={cpus} " if cpus else '--cpus-per-task="$SLURM_CPUS_ON_NODE" ')
        + "torchrun \\",
        '    --nnodes "$SLURM_NNODES" \\',
        f"    --nproc-per-node {c.gpus_per_node} \\",
        "    --rdzv-backend c10d \\",
        '    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\',
        '    --rdzv-id "$SLURM_JOB_ID" \\',
        "    -m megatron_burst.megatron.pretrain_gpt \\",
        '    "${FLAGS[@]}" \\',
        '    --save "$CKPT_DIR" --load "$CKPT_DIR" \\',
        f"    --save-interval {plan.save_interval} \\",
        *exit_after,
        '    --tensorboard-dir "$LOG_DIR/tensorboard" \\',
        '    2>&1 | tee -a "$LOG_DIR/train.log" || STATUS=$?',
    ]


def _requeue_lines(train_iters: int) -> list[str]:
    """Done, requeue, or stop: requeue only an allocation that saved progress, so a job that
    cannot advance (a crash at start-up, a limit too short to save) ends instead of looping."""
    return [
        "",
        'LAST_ITER="$(saved_iteration)"',
        f"if (( LAST_ITER >= {train_iters} )); then",
        f'    echo "training done: iteration $LAST_ITER of {train_iters} saved in $CKPT_DIR"',
        "    exit 0",
        "fi",
        "if (( LAST_ITER <= START_ITER )); then",
        '    echo "error: this allocation saved no progress (iteration $LAST_ITER, as at its '
        'start; training exited with status $STATUS): not requeueing, as the next allocation '
        'would repeat it; see $LOG_DIR/train.log" >&2',
        '    exit $(( STATUS == 0 ? 1 : STATUS ))',
        "fi",
        f'echo "saved iteration $LAST_ITER of {train_iters} (training exited with status '
        '$STATUS); requeueing $SLURM_JOB_ID"',
        'scontrol requeue "$SLURM_JOB_ID"',
    ]


def _job_name(config_path: str, job_name: str | None) -> str:
    if job_name is None:
        job_name = Path(config_path).stem
        if not re.fullmatch(SBATCH_NAME, job_name):
            raise ValueError(f"the job name {job_name!r} (the config file's name) cannot go "
                             f"into #SBATCH --job-name: pass --job-name with letters, digits "
                             f"and . _ + - only")
    return sbatch_value(job_name, "--job-name")


def sbatch_script(cfg: Config, config_path: str, *, partition: str | None = None,
                  time: str | None = None, account: str | None = None,
                  job_name: str | None = None, setup: str | None = None,
                  plan: JobPlan | None = None) -> str:
    """The sbatch script text for ``cfg`` (already resized to the wanted node count).

    ``time`` is one allocation's limit (default ``slurm.time_limit``, else the job plan's);
    ``setup`` a file the script sources first (default ``slurm.setup``);
    ``plan`` the ``job_plan`` made with it, if the caller has one. ``job_name`` defaults to
    the config file's name. Raises ValueError naming the option or key whose value cannot be
    put safely into the script, or a megatron_args flag the script sets; ConfigError for a
    CPU config (`megatron-burst run` trains those on one machine).
    """
    if not cfg.cluster.hardware.timed:
        raise ConfigError(f"'cluster.gpu' is {cfg.cluster.gpu}: a CPU config trains on one "
                          f"machine with `megatron-burst run {config_path}`; `slurm` writes "
                          f"GPU jobs")
    check_megatron_args(cfg.megatron_args, owned=SCRIPT_FLAGS)
    if setup is not None:
        cfg = dataclasses.replace(cfg, slurm=dataclasses.replace(
            cfg.slurm, setup=check_text(setup, "--setup")))
    plan = plan or job_plan(cfg, time)
    one_line(config_path, f"the config path {config_path!r}")
    one_line(cfg.model.name, "'model.name'")
    name = _job_name(config_path, job_name)
    for option, value in (("--partition", partition), ("--account", account)):
        if value is not None:
            sbatch_value(value, option)
    options = {"--time": time, "--setup": setup, "--partition": partition, "--account": account,
               "--job-name": None if name == Path(config_path).stem else name}
    p, c = cfg.parallel, cfg.cluster
    lines = [
        "#!/bin/bash",
        "# Generated by: " + _command_line(cfg, config_path, options),
        f"# {cfg.model.name}, {cfg.model.seq_length} tokens: TP={p.tensor} CP={p.context} "
        f"PP={p.pipeline} DP={p.data} on {c.nodes} x {c.gpus_per_node} {c.gpu}.",
        *(f"# {line}" for line in plan.lines()),
        *_directives(cfg, name, plan, partition, account),
        "",
        "set -euo pipefail",
        *setup_lines(cfg.slurm.setup, config_path),
        *import_lines(cfg),
        *resume_lines(cfg, config_path),
        *variable_lines(cfg, config_path),
        *_run_folder_lines(cfg),
        *NCCL_LINES,
        *_flag_lines(megatron_flags(cfg, expand=False)),
        *_launch_lines(cfg, plan),
        *_requeue_lines(cfg.training.train_iters),
    ]
    return "\n".join(lines) + "\n"
