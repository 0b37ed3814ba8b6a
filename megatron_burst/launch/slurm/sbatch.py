"""`megatron-burst slurm`: write an sbatch script for a config.

The script runs one `torchrun` per node under `srun`, with c10d rendezvous on the job's
first node, so every node runs the same command. The run has one folder for all its jobs
(RUN_ROOT/<run name>/ with checkpoints/ and logs/; RUN_ROOT is ``slurm.run_root``, else
$RUN_ROOT, else $SLURM_SUBMIT_DIR/runs), so a requeued or resubmitted job resumes through
`--load` (``lifecycle``: the folder, the signals that make Megatron save, retention, the
requeue). One allocation is a length real partitions take (``job_plan``): SLURM signals the
job (`--signal`) and Megatron saves and exits shortly before its limit (the margin sized by
the checkpoint's write time), and the script requeues the job while training is unfinished
and the allocation saved progress; one that saved none stops the chain instead of
repeating itself.

Before training the script sources the set-up file, imports what the run will, and checks
the resume path and the cluster's variables (``preflight``).

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

from ..config.schema import Config, ConfigError
from ..config.values import check_run_name, check_text, control_character
from ..run.flags import double_quoted, megatron_flags, shell_word
from ..planning.job_plan import JobPlan, job_plan
from ..config.owned_flags import check_megatron_args
from .preflight import (data_path_lines, import_lines, resume_lines, setup_lines,
                        variable_lines)
from .lifecycle import launch_lines, requeue_lines, run_folder_lines

# Flags the script sets itself, after the config's: megatron_args may not set them too.
SCRIPT_FLAGS = {
    "--save": "is set by the sbatch script to its run folder ($RUN_ROOT/<run name>/checkpoints)"
              "; set slurm.run_root or RUN_ROOT to move it",
    "--load": "is set by the sbatch script to its run folder, so a requeued or resubmitted job "
              "resumes; set slurm.run_root or RUN_ROOT to move it",
    "--exit-duration-in-mins": "is set by the sbatch script from the allocation's --time",
    "--exit-signal-handler": "is set by the sbatch script, which signals the training to save "
                             "and exit",
    "--exit-signal": "is SIGTERM, which the sbatch script's node tasks send the training",
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
    """The #SBATCH lines: nodes (whole ones, with their memory, where the run takes every
    GPU of a node), CPUs, one allocation's time and the warning signal before it."""
    c = cfg.cluster
    lines = [
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={c.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
    ]
    if cfg.slurm.cpus_per_task is not None:
        lines.append(f"#SBATCH --cpus-per-task={cfg.slurm.cpus_per_task}")
    if c.gpus_per_node >= c.hardware.node_gpus:  # whole nodes: all their memory too
        lines += ["#SBATCH --mem=0", "#SBATCH --exclusive"]
    lines += [
        f"#SBATCH --time={plan.limit}",
        f"#SBATCH --signal=B:USR1@{plan.signal_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=%x-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    return lines


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


def _job_name(config_path: str, job_name: str | None) -> str:
    if job_name is None:
        job_name = Path(config_path).stem
        if not re.fullmatch(SBATCH_NAME, job_name):
            raise ValueError(f"the job name {job_name!r} (the config file's name) cannot go "
                             f"into #SBATCH --job-name: pass --job-name with letters, digits "
                             f"and . _ + - only")
    return sbatch_value(job_name, "--job-name")


def run_name_of(cfg: Config, given: str | None, job_name: str) -> str:
    """The run's folder name: ``given`` (--run-name), else slurm.run_name, else the job's."""
    if given is not None:
        check_run_name(check_text(given, "--run-name"), "--run-name")
        return given
    return cfg.slurm.run_name or job_name


def sbatch_script(cfg: Config, config_path: str, *, partition: str | None = None,
                  time: str | None = None, account: str | None = None,
                  job_name: str | None = None, setup: str | None = None,
                  run_name: str | None = None, plan: JobPlan | None = None) -> str:
    """The sbatch script text for ``cfg`` (already resized to the wanted node count).

    ``time`` is one allocation's limit (default ``slurm.time_limit``, else the job plan's);
    ``setup`` a file the script sources first (default ``slurm.setup``);
    ``plan`` the ``job_plan`` made with it, if the caller has one. ``job_name`` defaults to
    the config file's name, ``run_name`` (the run's folder) to ``slurm.run_name``, else the
    job name. Raises ValueError naming the option or key whose value cannot be
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
    run = run_name_of(cfg, run_name, name)
    for option, value in (("--partition", partition), ("--account", account)):
        if value is not None:
            sbatch_value(value, option)
    options = {"--time": time, "--setup": setup, "--partition": partition, "--account": account,
               "--job-name": None if name == Path(config_path).stem else name,
               "--run-name": run_name}
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
        *run_folder_lines(cfg, run, "this script"),
        *NCCL_LINES,
        *_flag_lines(megatron_flags(cfg, expand=False)),
        *launch_lines(cfg, plan),
        *requeue_lines(cfg.training.train_iters, "this script"),
    ]
    return "\n".join(lines) + "\n"
