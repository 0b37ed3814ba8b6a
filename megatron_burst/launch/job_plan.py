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
- the allocation: ``slurm.time_limit``/``--time``, else the shorter of ``DEFAULT_ALLOCATION_MIN``
  and the whole job; refused if it cannot fit start-up, one step and the save;
- how many allocations the chain takes.
"""
from __future__ import annotations

import dataclasses
import math

from .config import Config, ConfigError
from .memory import stage_params
from .slurm_time import UNLIMITED, format_time_limit, parse_time_limit
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

    @property
    def limit(self) -> str:
        return format_time_limit(self.limit_min)

    @property
    def exit_after_min(self) -> int | None:
        """Megatron's --exit-duration-in-mins (None: no limit, no exit)."""
        return None if self.limit_min is None else self.limit_min - self.exit_margin_min

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
               f"{format_duration(every)} ({how})"]
        if self.limit_min is None:
            out.append(f"allocation: --time {self.limit} (no limit): one allocation runs the "
                       f"whole job, {format_duration(self.train_s)} of training")
            return out
        source = "given" if self.limit_given else (
            f"the shorter of {DEFAULT_ALLOCATION_MIN // 60} hours and the whole job")
        out.append(f"allocation: --time {self.limit} ({source}); Megatron saves and exits "
                   f"{self.exit_margin_min} min before it (one step, twice the save, "
                   f"{TEARDOWN_MIN} min tear-down): --exit-duration-in-mins "
                   f"{self.exit_after_min}")
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
    the default); ValueError naming ``what`` for a limit too short, ConfigError where no
    step time is predicted (CPU ranks)."""
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
                   limit_given=time_limit is not None)
    if time_limit is None:
        minutes = min(DEFAULT_ALLOCATION_MIN, _whole_job_min(plan))
    else:
        minutes = parse_time_limit(time_limit, what)
    plan = dataclasses.replace(plan, limit_min=minutes)
    _check_fits(plan, time_limit, what)
    return plan


def _check_fits(plan: JobPlan, given: str | None, what: str) -> None:
    """Refuse an allocation that cannot start, make one step and save it."""
    if plan.limit_min is None:
        return
    needed = STARTUP_MIN + plan.exit_margin_min + math.ceil(plan.step_s / 60)
    if plan.limit_min < needed:
        raise ValueError(
            f"{what} {given!r} gives {plan.limit_min} min per allocation, too short for one "
            f"step and its save: {STARTUP_MIN} min start-up + {format_duration(plan.step_s)} "
            f"per step + {plan.exit_margin_min} min to save and exit = at least {needed} min "
            f"(a shorter limit would requeue forever without progress)")
