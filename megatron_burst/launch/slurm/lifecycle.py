"""The lines of an sbatch script that carry the run through its jobs: its folder, training
under srun with the signals that make it save, checkpoint retention, and the requeue.

- **The run's folder follows the run**: ``RUN_ROOT/<run name>`` (``slurm.run_name`` or
  ``slurm --run-name``, else the job's name), the same for a requeued job, a new ``sbatch``
  of the same script, or one written again with another ``--time``, so each resumes the
  newest complete checkpoint (Megatron's tracker). Starting over is a choice:
  ``START_OVER=1 sbatch ...`` moves the folder aside (it deletes nothing), or another run
  name. A folder holding another model's checkpoints stops the job. A root under ``$HOME``
  is warned about (home file systems are small and backed up).
- **Signals**: SLURM warns the batch shell with USR1 as long before the limit as the exit
  margin (``#SBATCH --signal=B:USR1@S``); ``scancel --batch --signal=USR2 JOB`` asks the
  job to save and stop; TERM comes with preemption and ``scancel``. The shell passes each
  to srun as USR1, which srun forwards to every node's task (srun turns a TERM into a
  kill, so never TERM), and each node's task, a small shell around torchrun, sends the
  training processes (torchrun's children) the SIGTERM Megatron's ``--exit-signal-handler``
  waits for: they finish the step, save, and exit. torchrun itself ignores these signals
  (inherited; ``TORCHELASTIC_SIGNALS_TO_HANDLE`` keeps it from taking TERM back), or it
  would stop its workers mid-save.
- **Retention** (``checkpoint_retention``) watches the checkpoints while training runs.
- **Requeue**: done, stop (USR2, or TERM: SLURM requeues a preempted job itself where the
  partition says so), no progress (stop with an error), or requeue.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Mapping

from ..config.schema import Config, expand_vars
from ..run.flags import double_quoted
from ..planning.job_plan import JobPlan
from ..planning.units import format_bytes

RETENTION = "megatron_burst.launch.slurm.checkpoint_retention"
# Each node's task: torchrun with TERM and USR1 ignored (its workers inherit that until
# Megatron's handler takes TERM), and a trap that passes either on to the workers as TERM.
NODE_TASK = ('trap "" TERM USR1; "$@" & TRAIN=$!; '
             'trap "pkill -TERM -P $TRAIN || true" TERM USR1; '
             'while kill -0 "$TRAIN" 2>/dev/null; do wait "$TRAIN" || true; done; '
             'wait "$TRAIN"')


def model_identity(cfg: Config) -> str:
    """The shapes a run's checkpoints hold: another model cannot resume from them."""
    m = cfg.model
    return (f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, ffn "
            f"{m.ffn_hidden_size}, {m.num_attention_heads} heads, {m.num_query_groups} "
            f"query groups, vocabulary {m.vocab_size}")


def home_warning(cfg: Config, plan: JobPlan, env: Mapping[str, str], cwd: Path
                 ) -> str | None:
    """A warning if the run's root, as the script will find it when submitted from ``cwd``
    with ``env``, is under $HOME (None if not, or if it cannot be told here)."""
    home = env.get("HOME")
    try:
        root = (expand_vars(cfg.slurm.run_root, "slurm.run_root", env)
                if cfg.slurm.run_root is not None else env.get("RUN_ROOT") or str(cwd / "runs"))
    except ValueError:  # a ${VARIABLE} set only on the cluster
        return None
    if not home or not Path(root).resolve().is_relative_to(Path(home).resolve()):
        return None
    disk = format_bytes(plan.checkpoints_on_disk * plan.checkpoint_bytes)
    return (f"warning: the run's checkpoints go under {root}, inside $HOME, whose quota is "
            f"small: up to {plan.checkpoints_on_disk} checkpoints, {disk}; set slurm.run_root "
            f"or RUN_ROOT to a scratch or project file system")


def run_folder_lines(cfg: Config, run_name: str, script_hint: str) -> list[str]:
    """RUN_DIR for every job of the run; START_OVER; the $HOME warning; the model check."""
    root = (double_quoted(cfg.slurm.run_root) if cfg.slurm.run_root is not None
            else '"${RUN_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}/runs}"')
    identity = model_identity(cfg)
    return [
        "",
        "# The run's folder, the same for every job of this run, so a requeued or resubmitted",
        "# job resumes from its newest complete checkpoint. START_OVER=1 sbatch ... moves it",
        "# aside (deleting nothing) and starts from iteration 0.",
        f"RUN_ROOT={root}",
        f"RUN_DIR=\"$RUN_ROOT/{run_name}\"",
        'CKPT_DIR="$RUN_DIR/checkpoints"',
        'LOG_DIR="$RUN_DIR/logs"',
        'case "$RUN_ROOT/" in "${HOME:-/nonexistent}"/*)',
        '    echo "warning: the run folder $RUN_DIR is under \\$HOME, whose quota is small: '
        'set slurm.run_root or RUN_ROOT to a scratch or project file system" >&2 ;;',
        "esac",
        'if [[ "${START_OVER:-0}" == 1 && "${SLURM_RESTART_COUNT:-0}" == 0 && -d "$RUN_DIR" ]]; '
        'then',
        '    mv "$RUN_DIR" "$RUN_DIR.before-$SLURM_JOB_ID"',
        '    echo "START_OVER=1: moved the earlier run to $RUN_DIR.before-$SLURM_JOB_ID"',
        "fi",
        'mkdir -p "$CKPT_DIR" "$LOG_DIR"',
        f"MODEL={shlex.quote(identity)}",
        'if [[ -f "$RUN_DIR/model.txt" && "$(cat "$RUN_DIR/model.txt")" != "$MODEL" ]]; then',
        '    echo "error: $RUN_DIR holds checkpoints of another model ($(cat "$RUN_DIR/model.txt"))'
        f'; this job trains $MODEL: give it another run name (slurm --run-name), or start '
        f'over: START_OVER=1 sbatch {script_hint}" >&2',
        "    exit 2",
        "fi",
        'echo "$MODEL" > "$RUN_DIR/model.txt"',
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


SIGNAL_LINES = [
    "",
    "# USR1: the time limit is near (--signal); USR2: scancel --batch --signal=USR2 asks to",
    "# save and stop; TERM: preemption or scancel. Each reaches the training as the SIGTERM",
    "# its --exit-signal-handler waits for, through srun (USR1: srun turns TERM into a kill).",
    'STOP_REASON=""',
    "on_signal() {",
    '    STOP_REASON="$1"',
    '    echo "received $2: asking training to save and exit" >&2',
    '    if [[ -n "${SRUN_PID:-}" ]]; then kill -USR1 "$SRUN_PID" 2>/dev/null || true; fi',
    "}",
    "trap 'on_signal limit USR1' USR1",
    "trap 'on_signal stop USR2' USR2",
    "trap 'on_signal term TERM' TERM",
    "export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT",
    "# shellcheck disable=SC2016  # each node's bash expands it",
    f"NODE_TASK={shlex.quote(NODE_TASK)}",
]


def launch_lines(cfg: Config, plan: JobPlan) -> list[str]:
    """srun + torchrun in the background, the retention watcher beside it, and the wait."""
    c, cpus = cfg.cluster, cfg.slurm.cpus_per_task
    exit_after = ([f"    --exit-duration-in-mins {plan.exit_after_min} \\"]
                  if plan.exit_after_min is not None else [])
    every = f" --keep-every {plan.keep_every}" if plan.keep_every else ""
    return [
        *SIGNAL_LINES,
        "",
        f'echo "job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}): {c.nodes} node(s), '
        'rendezvous $MASTER_ADDR:$MASTER_PORT, run dir $RUN_DIR, from iteration $START_ITER"',
        "srun --kill-on-bad-exit=1 "
        + (f"--cpus-per-task={cpus} " if cpus else '--cpus-per-task="$SLURM_CPUS_ON_NODE" ')
        + 'bash -c "$NODE_TASK" node-task torchrun \\',
        '    --nnodes "$SLURM_NNODES" \\',
        f"    --nproc-per-node {c.gpus_per_node} \\",
        "    --rdzv-backend c10d \\",
        '    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\',
        '    --rdzv-id "$SLURM_JOB_ID" \\',
        "    -m megatron_burst.megatron.pretrain_gpt \\",
        '    "${FLAGS[@]}" \\',
        '    --save "$CKPT_DIR" --load "$CKPT_DIR" \\',
        f"    --save-interval {plan.save_interval} \\",
        "    --exit-signal-handler \\",
        *exit_after,
        '    --tensorboard-dir "$LOG_DIR/tensorboard" \\',
        '    > >(tee -a "$LOG_DIR/train.log") 2>&1 &',
        "SRUN_PID=$!",
        "# Keep the newest checkpoints this run saved; delete its older ones once a newer is",
        "# complete (never one being written, never one it did not write).",
        f'python3 -m {RETENTION} --ckpt-dir "$CKPT_DIR" --ledger "$RUN_DIR/checkpoints.ledger" '
        f'--keep-last {plan.keep_checkpoints}{every} --while-pid "$SRUN_PID" '
        '--poll-s "${RETENTION_POLL_S:-30}" &',
        "WATCH_PID=$!",
        'while kill -0 "$SRUN_PID" 2>/dev/null; do wait "$SRUN_PID" || true; done',
        'STATUS=0',
        'wait "$SRUN_PID" || STATUS=$?',
        'wait "$WATCH_PID" || echo "warning: checkpoint retention failed; see above" >&2',
    ]


def requeue_lines(train_iters: int, script_hint: str) -> list[str]:
    """Done, stopped by a signal, no progress (stop, do not loop), or requeue."""
    resubmit = f"sbatch {script_hint} resumes from it"
    return [
        "",
        'LAST_ITER="$(saved_iteration)"',
        f"if (( LAST_ITER >= {train_iters} )); then",
        f'    echo "training done: iteration $LAST_ITER of {train_iters} saved in $CKPT_DIR"',
        "    exit 0",
        "fi",
        'if [[ "$STOP_REASON" == stop || "$STOP_REASON" == term ]]; then',
        f'    echo "stopped by $STOP_REASON at saved iteration $LAST_ITER (training exited with '
        f'status $STATUS): not requeueing; {resubmit}"',
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
