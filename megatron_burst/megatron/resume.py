"""Which optimizer state a Megatron run will load when it starts, decided from its arguments
and the files on disk exactly as Megatron's ``load_checkpoint`` decides it.

The entry point refuses, before training, a run that would load distributed-optimizer state
it cannot read (``environment.distributed_optimizer_resume_problem``). Reading only
``--load``'s tracker file got that wrong both ways. This follows
``megatron.training.checkpointing.load_checkpoint`` and ``_load_base_checkpoint`` (the same
logic in megatron-core 0.16 to 0.19; read in 0.17.0 and 0.19.2):

- ``--pretrained-checkpoint DIR`` with no tracker file in ``--load``: DIR is loaded as with
  ``--finetune``;
- ``--finetune``, ``--no-load-optim``: no optimizer state is loaded;
- the tracker file (``latest_checkpointed_iteration.txt``) gives the iteration, or says
  ``release``: a release checkpoint holds no optimizer state to load;
- ``--ckpt-step N`` loads iteration N, whether a tracker file exists or not;
- a non-persistent checkpoint (``--non-persistent-ckpt-type global``, its tracker in
  ``--non-persistent-global-ckpt-dir`` or LOAD/non_persistent) is loaded instead when its
  iteration is at least the persistent one; ``local`` ones when their folder holds any;
- nothing found: Megatron starts from scratch and loads nothing.

What is not read here: a checkpoint saved with ``--no-save-optim`` (its args are inside the
checkpoint), in which case this check may refuse a run that would have started.
"""
from __future__ import annotations

import os
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"
NON_PERSISTENT_SUBDIR = "non_persistent"  # megatron.training.checkpointing's name


def read_tracker(folder: str | None) -> tuple[int, bool] | None:
    """(iteration, release) from ``folder``'s tracker file, as Megatron's read_metadata
    reads it; None if there is none (or it is unreadable: Megatron then exits itself)."""
    if not folder:
        return None
    path = os.path.join(folder, TRACKER)
    if not os.path.isfile(path):
        return None
    with open(path) as tracker:
        text = tracker.read().strip()
    if text == "release":
        return 0, True
    try:
        iteration = int(text)
    except ValueError:
        return None
    return (iteration, False) if iteration >= 0 else None


def _arg(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def _non_persistent(args: Any, load: str | None) -> tuple[int, str] | None:
    """(iteration, folder) of the non-persistent checkpoint Megatron would find, or None."""
    kind = _arg(args, "non_persistent_ckpt_type")
    if kind == "global":
        given = _arg(args, "non_persistent_global_ckpt_dir")
        folder = given if (given or load is None) else os.path.join(load, NON_PERSISTENT_SUBDIR)
        found = read_tracker(folder)
        return (found[0], folder) if found and not found[1] else None
    if kind == "local":
        # Its iteration is known only to its manager (nvidia-resiliency-ext); one that has
        # saved anything is taken to be the newest, so the check errs towards refusing.
        folder = _arg(args, "non_persistent_local_ckpt_dir")
        if folder and os.path.isdir(folder) and os.listdir(folder):
            return 1 << 62, folder
    return None


def optimizer_state_source(args: Any) -> str | None:
    """Where the run's optimizer state will come from ("/ckpt at iteration 40", ...), or
    None where Megatron's load_checkpoint loads none (see the module docstring)."""
    load, finetune = _arg(args, "load"), bool(_arg(args, "finetune", False))
    pretrained = _arg(args, "pretrained_checkpoint")
    if pretrained and read_tracker(load) is None:
        load, finetune = pretrained, True
    if finetune or _arg(args, "no_load_optim", False):
        return None
    found = read_tracker(load)
    iteration, release = found if found else (-1, False)
    if _arg(args, "ckpt_step"):
        iteration = _arg(args, "ckpt_step")
    non_persistent = _non_persistent(args, load)
    if non_persistent and non_persistent[0] >= iteration:
        return f"the non-persistent checkpoint in {non_persistent[1]}"
    if iteration == -1 or release or not load:
        return None
    return f"{load} at iteration {iteration}"
