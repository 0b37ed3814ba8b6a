"""`megatron-burst slurm`: write an sbatch script for a config.

The script runs one `torchrun` per node under `srun`, with c10d rendezvous on the job's
first node, so every node runs the same command. Each job gets its own folder
(RUN_ROOT/<job name>-<job id>/ with checkpoints/ and logs/); the job id survives a requeue,
so a requeued job finds its own checkpoints and resumes through `--load`. Megatron saves
and exits shortly before the time limit (`--exit-duration-in-mins`), and the script
requeues itself while training is unfinished.

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
import math
import re
import shlex
from pathlib import Path

from .config import Config, variables
from .config_values import control_character
from ..environment import FUSED_ADAM_IMPORTS, RESUME_WAY_OUT, TRAINING_NEEDS
from .flags import double_quoted, megatron_flags, shell_word
from .owned_flags import check_megatron_args
from .step_time import format_duration, predict_step

# Minutes before the SLURM time limit at which Megatron checkpoints and exits, so the save
# finishes before SLURM kills the job (a 70B distributed checkpoint takes minutes).
SAVE_MARGIN_MIN = 15
# The default --time: the predicted training time, this much more for what the time model
# leaves out (on the one end-to-end measurement, README's 8-GPU table, steps took 1.26-1.39x
# the predicted time), and minutes for start-up (imports, rendezvous, data indexing) and the
# last save.
TIME_MARGIN = 1.5
STARTUP_MIN = 10
# Flags the script sets itself, after the config's: megatron_args may not set them too.
SCRIPT_FLAGS = {
    "--save": "is set by the sbatch script to its run folder ($RUN_ROOT/<job>-<id>/checkpoints)"
              "; set RUN_ROOT to move it",
    "--load": "is set by the sbatch script to its run folder, so a requeued job resumes; set "
              "RUN_ROOT to move it",
    "--exit-duration-in-mins": "is set by the sbatch script from --time",
    "--tensorboard-dir": "is set by the sbatch script to its run folder's logs/tensorboard",
}


@dataclasses.dataclass(frozen=True)
class TimeLimit:
    """A SLURM --time and how it was arrived at."""

    limit: str
    explanation: str


def predicted_time_limit(cfg: Config) -> TimeLimit:
    """--time from the plan's predicted job time, with margins; ValueError where no time is
    predicted (CPU ranks)."""
    step = predict_step(cfg)
    if step is None:
        raise ValueError(f"--time is required: plan predicts no step time for "
                         f"{cfg.cluster.gpu} ranks")
    iters = cfg.training.train_iters
    job_s = iters * step.step_s
    minutes = math.ceil(job_s * TIME_MARGIN / 60) + STARTUP_MIN + SAVE_MARGIN_MIN
    minutes = math.ceil(minutes / 15) * 15
    days, rest = divmod(minutes, 1440)
    limit = f"{days}-{rest // 60:02d}:{rest % 60:02d}:00" if days else (
        f"{rest // 60:02d}:{rest % 60:02d}:00")
    return TimeLimit(limit, (
        f"--time {limit}: plan predicts {format_duration(job_s)} for training.train_iters "
        f"{iters:,} ({format_duration(step.step_s)} per step), +{TIME_MARGIN - 1:.0%} for what "
        f"the time model leaves out, +{STARTUP_MIN} min start-up, +{SAVE_MARGIN_MIN} min for "
        f"the last save; pass --time to choose (a shorter limit is fine: the job saves and "
        f"requeues itself until done)"))


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


def _time_minutes(limit: str) -> int:
    """SLURM time limit ('[D-]HH:MM[:SS]' or 'MM') in minutes."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not m:
        raise ValueError(f"--time {limit!r} is not a SLURM time limit like 04:00:00 or 2-00:00:00")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if b is None:  # plain minutes
        hours, minutes = 0, a
    else:
        hours, minutes = a, b
    return (days or 0) * 1440 + hours * 60 + minutes


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
        lines += [f"read -r -a DATA_PATH_WORDS <<< {double_quoted(flags[data_at])}", ""]
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


def _resume_check(cfg: Config, config_path: str) -> list[str]:
    """Lines that stop the job before training if a requeue could not resume it."""
    if not cfg.training.distributed_optimizer:
        return []
    imports = " || ".join(f"python3 -c {shlex.quote(f'from {module} import FusedAdam')} "
                          f"2>/dev/null" for module, _ in FUSED_ADAM_IMPORTS)
    message = (f"error: a requeued job resumes with --use-distributed-optimizer, which needs "
               f"TransformerEngine or apex (neither imports here; with torch.optim.Adam "
               f"megatron-core cannot load the distributed optimizer state): "
               f"{RESUME_WAY_OUT.replace('config ', f'{config_path}: ')}, then regenerate "
               f"this script")
    return [
        "",
        "# A requeue resumes the optimizer state: with the distributed optimizer that needs",
        "# Megatron's fused Adam (TransformerEngine or apex), checked before training starts.",
        f"{imports} || {{",
        f"    echo {shlex.quote(message)} >&2",
        "    exit 2",
        "}",
    ]


def sbatch_script(cfg: Config, config_path: str, *, partition: str | None = None,
                  time: str | None = None, account: str | None = None,
                  job_name: str | None = None) -> str:
    """The sbatch script text for ``cfg`` (already resized to the wanted node count).

    ``time`` defaults to the predicted job time with margins (``predicted_time_limit``);
    ``job_name`` to the config file's name. Raises ValueError naming the option or key whose
    value cannot be put safely into the script, or a megatron_args flag the script sets.
    """
    c = cfg.cluster
    check_megatron_args(cfg.megatron_args, owned=SCRIPT_FLAGS)
    if time is None:
        time = predicted_time_limit(cfg).limit
    one_line(config_path, f"the config path {config_path!r}")
    one_line(cfg.model.name, "'model.name'")
    if job_name is None:
        job_name = Path(config_path).stem
        if not re.fullmatch(SBATCH_NAME, job_name):
            raise ValueError(f"the job name {job_name!r} (the config file's name) cannot go "
                             f"into #SBATCH --job-name: pass --job-name with letters, digits "
                             f"and . _ + - only")
    sbatch_value(job_name, "--job-name")
    exit_after = max(1, _time_minutes(time) - SAVE_MARGIN_MIN)
    command = ["megatron-burst", "slurm", config_path, "--nodes", str(c.nodes), "--time", time]
    for option, value in (("--partition", partition), ("--account", account)):
        if value is not None:
            command += [option, sbatch_value(value, option)]
    if job_name != Path(config_path).stem:
        command += ["--job-name", job_name]
    flags = megatron_flags(cfg, expand=False)
    lines = [
        "#!/bin/bash",
        "# Generated by: " + " ".join(shlex.quote(word) for word in command),
        f"# {cfg.model.name}, {cfg.model.seq_length} tokens: TP={cfg.parallel.tensor} "
        f"CP={cfg.parallel.context} PP={cfg.parallel.pipeline} DP={cfg.parallel.data} "
        f"on {c.nodes} x {c.gpus_per_node} {c.gpu}.",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={c.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=%x-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += [
        "",
        "set -euo pipefail",
        "",
        "# The entry point's training loop: megatron-core >= 0.17 (Python >= 3.12) or Megatron-LM.",
        "python3 -c 'import megatron.training' 2>/dev/null || {",
        f"    echo {double_quoted('error: ' + TRAINING_NEEDS)} >&2",
        "    exit 2",
        "}",
    ]
    lines += _resume_check(cfg, config_path)
    lines += [
        "",
        "# Paths the config leaves to the cluster.",
    ]
    for name in variables(cfg):  # names match [A-Za-z_][A-Za-z0-9_]*: safe in a script
        message = shlex.quote(f"error: set {name} before sbatch (see {config_path})")
        lines.append(f'[[ -n "${{{name}:-}}" ]] || {{ echo {message} >&2; exit 2; }}')
    lines += [
        "",
        "# One folder per job; a requeued job keeps its id, so it finds its checkpoints.",
        'RUN_ROOT="${RUN_ROOT:-$PWD/runs}"',
        'RUN_DIR="$RUN_ROOT/${SLURM_JOB_NAME}-${SLURM_JOB_ID}"',
        'CKPT_DIR="$RUN_DIR/checkpoints"',
        'LOG_DIR="$RUN_DIR/logs"',
        'mkdir -p "$CKPT_DIR" "$LOG_DIR"',
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
    lines += _flag_lines(flags)
    lines += [
        "",
        f'echo "job $SLURM_JOB_ID: {c.nodes} node(s), rendezvous $MASTER_ADDR:$MASTER_PORT, '
        'run dir $RUN_DIR"',
        "srun --kill-on-bad-exit=1 torchrun \\",
        '    --nnodes "$SLURM_NNODES" \\',
        f"    --nproc-per-node {c.gpus_per_node} \\",
        "    --rdzv-backend c10d \\",
        '    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\',
        '    --rdzv-id "$SLURM_JOB_ID" \\',
        "    -m megatron_burst.megatron.pretrain_gpt \\",
        '    "${FLAGS[@]}" \\',
        '    --save "$CKPT_DIR" --load "$CKPT_DIR" \\',
        f"    --save-interval {cfg.training.save_interval} \\",
        f"    --exit-duration-in-mins {exit_after} \\",
        '    --tensorboard-dir "$LOG_DIR/tensorboard" \\',
        '    2>&1 | tee -a "$LOG_DIR/train.log"',
        "",
        "# Megatron exited before the last iteration (time limit): requeue; the next run",
        "# resumes from the latest checkpoint in $CKPT_DIR.",
        'ITER_FILE="$CKPT_DIR/latest_checkpointed_iteration.txt"',
        'if [[ -f "$ITER_FILE" ]]; then',
        '    LAST_ITER="$(cat "$ITER_FILE")"',
        f'    if [[ "$LAST_ITER" =~ ^[0-9]+$ ]] && (( LAST_ITER < {cfg.training.train_iters} )); '
        'then',
        '        echo "stopped at iteration $LAST_ITER; requeueing $SLURM_JOB_ID"',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "    fi",
        "fi",
    ]
    return "\n".join(lines) + "\n"
