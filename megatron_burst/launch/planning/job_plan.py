"""A training job as SLURM runs it: allocations of a length partitions take, saves that fit them.

A job longer than one allocation is a chain: each allocation starts (srun, imports,
rendezvous, loading the checkpoint), trains, and shortly before its time limit Megatron
saves and exits (``--exit-duration-in-mins``), and the script requeues the job. What this
needs, all from the predicted step time (``step_time``, with ``STEP_MARGIN`` for the time
model's error on measured runs) and the checkpoint's size over the cluster's stated write
rate (``cluster.checkpoint_write_gbps``):

- the save's duration: the whole model's bf16 weights and fp32 optimizer state, written by
  the job at that rate, plus a fixed cost (metadata, barriers);
- the exit margin: Megatron checks the duration after each step, so the exit starts up to a
  step after the mark; then the save (allowed twice its predicted time), then tear-down;
- the save interval (unless ``training.save_interval`` is given): periodic saves take at
  most ``SAVE_SHARE`` of the training time, and come no more often than every
  ``MIN_SAVE_EVERY_MIN``;
- the allocation: ``slurm.time_limit``/``--time``, else the shortest of
  ``DEFAULT_ALLOCATION_MIN``, the partition's maximum and the whole job; refused if it is
  longer than the partition's maximum (``slurm.max_time``; no limit only where that is
  UNLIMITED) or cannot fit start-up, one step and the save, saying what to change;
- the warning before the limit: SLURM signals the job (``--signal``) as long before it as
  the exit margin, and Megatron saves and exits on it (``--exit-signal-handler``);
- how many allocations the chain takes, and the disk its checkpoints hold at most.
"""
from __future__ import annotations

import dataclasses
import math

from ..config.schema import Config, ConfigError
from .memory import stage_params
from ..config.slurm_time import UNLIMITED, format_time_limit, parse_time_limit
from .step_time import STEP_MARGIN, format_duration, predict_step
from .units import format_bytes

DEFAULT_ALLOCATION_MIN = 24 * 60  # what most GPU partitions' MaxTime admits
STARTUP_MIN = 10  # srun, imports, rendezvous, dataset indexing, loading the checkpoint
TEARDOWN_MIN = 5  # before Megatron's clock starts, and after the save, to the exit
SAVE_FIXED_S = 60  # per save, beyond the bytes: metadata, barriers, the file system's open
SAVE_SAFETY = 2  # the exit margin allows the last save twice its predicted time
SAVE_SHARE = 0.05  # periodic saves take at most this share of training
MIN_SAVE_EVERY_MIN = 30  # and come no more often than this
WASTE_WARNING = 0.5  # warn when less than this share of an allocation trains
SIGNAL_MOST_S = 65535  # the longest warning sbatch --signal takes (16 bits of seconds)


def checkpoint_bytes(cfg: Config) -> int:
    """Bytes of one checkpoint: every parameter's weight (2 bytes in bf16, 4 in fp32) and its
    fp32 optimizer state (a master copy in bf16 training, Adam's two moments)."""
    whole = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tensor=1,
                                                                  pipeline=1))
    params = stage_params(whole, "only")
    bf16 = cfg.training.precision == "bf16"
    return params * ((2 + 4) if bf16 else 4) + params * 8


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """What one job of ``cfg`` takes, as SLURM will run it."""

    step_s: float  # predicted, with STEP_MARGIN
    train_iters: int
    checkpoint_bytes: int
    write_gbps: float
    save_s: float
    save_interval: int
    save_interval_given: bool
    exit_margin_min: int
    limit_min: int | None  # None: no time limit
    limit_given: bool
    keep_checkpoints: int = 2
    keep_every: int | None = None

    @property
    def limit(self) -> str:
        return format_time_limit(self.limit_min)

    @property
    def exit_after_min(self) -> int | None:
        """Megatron's --exit-duration-in-mins (None: no limit, no exit)."""
        return None if self.limit_min is None else self.limit_min - self.exit_margin_min

    @property
    def signal_s(self) -> int:
        """Seconds before the limit SLURM signals the job to save and exit (``--signal``)."""
        return min(SIGNAL_MOST_S, self.exit_margin_min * 60)

    @property
    def checkpoints_on_disk(self) -> int:
        """The most checkpoints retention leaves on disk: those kept, and one being written."""
        saves = self.train_iters // self.save_interval
        every = self.train_iters // self.keep_every if self.keep_every else 0
        return min(saves, self.keep_checkpoints + every) + 1

    @property
    def train_s(self) -> float:
        """Training and its periodic saves, start-up and exits apart."""
        return self.train_iters * (self.step_s + self.save_s / self.save_interval)

    @property
    def steps_per_allocation(self) -> int | None:
        if self.limit_min is None:
            return None
        work_s = (self.limit_min - STARTUP_MIN - self.exit_margin_min) * 60
        return max(1, int(work_s // (self.step_s + self.save_s / self.save_interval)))

    @property
    def allocations(self) -> int:
        per = self.steps_per_allocation
        return 1 if per is None else math.ceil(self.train_iters / per)

    def lines(self) -> list[str]:
        """What `plan` and `slurm` print about checkpoints and allocations."""
        every = self.save_interval * self.step_s
        if self.save_interval_given:
            how = "training.save_interval"
        elif self.save_interval == self.train_iters:
            how = "derived: the job is shorter than the interval, so once, at its end"
        else:
            how = (f"derived: saves take at most {SAVE_SHARE:.0%} of training, at most one "
                   f"per {MIN_SAVE_EVERY_MIN} min")
        out = [f"checkpoint: {format_bytes(self.checkpoint_bytes)} (bf16 weights and fp32 "
               f"optimizer state) at "
               f"cluster.checkpoint_write_gbps {self.write_gbps:g} GB/s: "
               f"{format_duration(self.save_s)} per save",
               f"save interval: {self.save_interval:,} iterations, one save per "
               f"{format_duration(every)} ({how})",
               f"retention: the newest {self.keep_checkpoints} checkpoint(s) "
               f"(slurm.keep_checkpoints)"
               + (f" and every iteration a multiple of {self.keep_every:,} (slurm.keep_every)"
                  if self.keep_every else "")
               + f": at most {self.checkpoints_on_disk} on disk, "
               f"{format_bytes(self.checkpoints_on_disk * self.checkpoint_bytes)}"]
        if self.limit_min is None:
            out.append(f"allocation: --time {self.limit} (no limit): one allocation runs the "
                       f"whole job, {format_duration(self.train_s)} of training")
            return out
        source = "given" if self.limit_given else (
            f"the shortest of {DEFAULT_ALLOCATION_MIN // 60} hours, slurm.max_time and the "
            f"whole job")
        out.append(f"allocation: --time {self.limit} ({source}); Megatron saves and exits "
                   f"{self.exit_margin_min} min before it (one step, twice the save, "
                   f"{TEARDOWN_MIN} min tear-down): --signal B:USR1@{self.signal_s}, "
                   f"--exit-duration-in-mins {self.exit_after_min}")
        out.append(f"allocations: {self.allocations} expected ({self.steps_per_allocation:,} "
                   f"iterations each after {STARTUP_MIN} min start-up; the job requeues "
                   f"itself until training.train_iters {self.train_iters:,}, and stops if an "
                   f"allocation saves no progress)")
        busy = self.steps_per_allocation * self.step_s / (self.limit_min * 60)
        if busy < WASTE_WARNING and self.allocations > 1:
            out.append(f"warning: only {busy:.0%} of each allocation trains (the rest starts "
                       f"up and saves): a longer --time wastes less")
        return out


def _save_interval(cfg: Config, step_s: float, save_s: float) -> int:
    given = cfg.training.save_interval
    if given is not None:
        return given
    every_s = max(save_s / SAVE_SHARE, MIN_SAVE_EVERY_MIN * 60)
    return max(1, min(cfg.training.train_iters, math.ceil(every_s / step_s)))


def _exit_margin_min(step_s: float, save_s: float) -> int:
    return math.ceil((step_s + SAVE_SAFETY * save_s) / 60) + TEARDOWN_MIN


def _whole_job_min(plan_without_limit: JobPlan) -> int:
    """One allocation for the whole job, rounded up to a quarter hour."""
    p = plan_without_limit
    minutes = STARTUP_MIN + math.ceil(p.train_s / 60) + p.exit_margin_min
    return math.ceil(minutes / 15) * 15


def job_plan(cfg: Config, time_limit: str | None = None, what: str = "--time") -> JobPlan:
    """The job of ``cfg`` with the allocation ``time_limit`` (else ``slurm.time_limit``, else
    the default); ValueError naming ``what`` for a limit beyond the partition's maximum or
    too short, ConfigError where no step time is predicted (CPU ranks)."""
    step = predict_step(cfg)
    if step is None:
        raise ConfigError(f"'cluster.gpu' is {cfg.cluster.gpu}: plan predicts no step time "
                          f"for it, so no job can be planned")
    step_s = step.step_s * (1 + STEP_MARGIN)
    gbps = cfg.cluster.checkpoint_write_gbps
    size = checkpoint_bytes(cfg)
    save_s = size / (gbps * 1e9) + SAVE_FIXED_S
    if time_limit is None and cfg.slurm.time_limit is not None:
        time_limit, what = cfg.slurm.time_limit, "'slurm.time_limit'"
    plan = JobPlan(step_s=step_s, train_iters=cfg.training.train_iters, checkpoint_bytes=size,
                   write_gbps=gbps, save_s=save_s,
                   save_interval=_save_interval(cfg, step_s, save_s),
                   save_interval_given=cfg.training.save_interval is not None,
                   exit_margin_min=_exit_margin_min(step_s, save_s), limit_min=UNLIMITED,
                   limit_given=time_limit is not None,
                   keep_checkpoints=cfg.slurm.keep_checkpoints, keep_every=cfg.slurm.keep_every)
    most = parse_time_limit(cfg.slurm.max_time, "'slurm.max_time'")
    if time_limit is None:
        minutes = min(DEFAULT_ALLOCATION_MIN, _whole_job_min(plan), most or math.inf)
    else:
        minutes = parse_time_limit(time_limit, what)
        _check_within(minutes, most, f"{what} {time_limit!r}", cfg.slurm.max_time)
    plan = dataclasses.replace(plan, limit_min=minutes)
    _check_fits(plan, cfg, time_limit, what, most)
    _check_keep_every(plan)
    return plan


def _check_within(minutes: int | None, most: int | None, given: str, max_time: str) -> None:
    """Refuse a limit the partition would not take (sbatch would reject the job)."""
    if most is None:
        return
    where = (f"'slurm.max_time' {max_time} (the partition's MaxTime: `scontrol show "
             f"partition NAME` shows it)")
    if minutes is None:
        raise ValueError(f"{given} asks for no time limit, beyond {where}; where the partition "
                         f"allows none, set slurm.max_time: UNLIMITED")
    if minutes > most:
        raise ValueError(f"{given} is {format_time_limit(minutes)}, longer than {where}: "
                         f"give at most {format_time_limit(most)}, or raise slurm.max_time "
                         f"if the partition takes more")


def _check_keep_every(plan: JobPlan) -> None:
    """slurm.keep_every must fall on saves, or it would keep nothing."""
    if plan.keep_every and plan.keep_every % plan.save_interval:
        raise ValueError(f"'slurm.keep_every' {plan.keep_every:,} is not a multiple of the "
                         f"save interval {plan.save_interval:,}, so no periodic save lands on "
                         f"it: give a multiple of {plan.save_interval:,}, or set "
                         f"training.save_interval to a divisor of it")


def _check_fits(plan: JobPlan, cfg: Config, given: str | None, what: str,
                most: int | None) -> None:
    """Refuse an allocation that cannot start, make one step and save it, saying what is
    too long and what to change."""
    if plan.limit_min is None:
        return
    needed = STARTUP_MIN + plan.exit_margin_min + math.ceil(plan.step_s / 60)
    if plan.limit_min >= needed:
        return
    parts = (f"{STARTUP_MIN} min start-up + {format_duration(plan.step_s)} per step + "
             f"{plan.exit_margin_min} min to save and exit = at least {needed} min")
    limit = (f"{what} {given!r} gives {plan.limit_min} min per allocation," if given is not None
             else f"the default allocation, {plan.limit} (the shortest of "
                  f"{DEFAULT_ALLOCATION_MIN // 60} hours, slurm.max_time and the whole job),")
    if most is None or needed <= most:
        change = (f"give --time (or slurm.time_limit) of at least "
                  f"{format_time_limit(math.ceil(needed / 15) * 15)}")
    else:
        change = _smaller_step(plan, cfg, most)
    raise ValueError(f"{limit} too short for one step and its save: {parts}; {change} "
                     f"(a shorter limit would requeue forever without progress)")


def _smaller_step(plan: JobPlan, cfg: Config, most: int) -> str:
    """What to change when one step and its save do not fit the longest allocation."""
    tr, p = cfg.training, cfg.parallel
    unit = tr.micro_batch_size * p.data
    # Time left for the step's own share: the exit margin holds a step too, so twice.
    room_s = (most - STARTUP_MIN - TEARDOWN_MIN - 2) * 60 - SAVE_SAFETY * plan.save_s
    fits = int(tr.global_batch_size * max(0.0, room_s / 2) / plan.step_s) // unit * unit
    text = (f"one step of {format_duration(plan.step_s)} ({tr.global_batch_size // unit} "
            f"micro-batches per data-parallel rank) cannot fit the longest allocation, "
            f"slurm.max_time {format_time_limit(most)}: lower training.global_batch_size "
            f"{tr.global_batch_size:,}")
    if fits >= unit:
        text += f" to at most about {fits:,}"
    return text + " or spread the run over more nodes (--nodes, data parallelism)"
