"""'auto' in a Megatron run decides from this machine's measured profile, never in silence
from another machine's.

``burst_attn``'s own 'auto' measures the machine at its first use (``attention.first_use``).
A Megatron run decides its layers' topology once instead, and so must find this machine's
profile itself:

- at ``configure_run`` (``resolve.topology_from_args``, before the process groups exist),
  from this machine's cached profile (an earlier run's first use, or ``megatron-burst
  tune``), looked up by the key the layers' calls will have (``cached_profile``); where none
  is cached, the run's topology is left to the layers (``None``);
- at a layer's first call (``layer_profile``), where the CP group and the call's tensors
  exist: ``first_use`` finds the profile, or measures it there on every rank of the group
  together (every CP rank runs the first layer at once) in seconds, and caches it, so the
  next run decides at configure time again. Every layer then decides from that one profile.

A profile named (``--burst-profile``, ``$MEGATRON_BURST_PROFILE``) is used as named, and
``$MEGATRON_BURST_AUTO_MEASURE=off`` decides from the shipped profile and says so, as in
``burst_attn``. What the Megatron path does not do that ``burst_attn`` does: time its
decision against the runner-up on the first calls (``attention.decision_check``).
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from megatron_burst.attention import first_use
from megatron_burst.comm.settings import current
from megatron_burst.decide import cluster, machine
from megatron_burst.decide.options import BurstOptions
from megatron_burst.decide.timing import Profile

logger = logging.getLogger(__name__)

WAIT = "measure at the first call"  # cached_profile's answer where the layers must measure


def wants_measured(options: BurstOptions, cp: int) -> bool:
    """Whether 'auto' decides from a profile measured on this machine (none named, measuring
    on, something to decide)."""
    found = current()
    return (cp > 1 and options.has_auto and not (options.profile or found.profile)
            and found.auto_measure)


def cached_profile(options: BurstOptions, cp: int, tp: int) -> Profile | None | str:
    """Before the process groups exist: this machine's cached profile for a CP group of
    ``cp`` (Megatron's rank order, TP innermost); None where no measured profile is wanted;
    ``WAIT`` where one is wanted and none is cached (the layers measure at their first call)."""
    if not wants_measured(options, cp):
        return None
    gpus = cluster.gpus_per_node()
    max_intra_node_size = cluster.max_intra_node_size(cp, gpus, tp=tp)
    cuda = torch.cuda.is_available()
    key = first_use.machine_key_for("cuda:0" if cuda else "cpu", "nccl" if cuda else "gloo",
                                    gpus.gpus_per_node,
                                    max_intra_node_size is not None and max_intra_node_size < cp)
    found = machine.find(key)
    if found is None:
        logger.warning("burst auto: no profile of this machine (%s) is cached: the layers "
                       "measure it at their first call", key.describe())
        return WAIT
    prof, where = found
    logger.warning("burst auto: the run decides from %s (%s), this machine's (%s)", where,
                   machine.measured_when(prof), key.describe())
    return prof


def layer_profile(options: BurstOptions, group: Any, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor) -> Optional[Profile]:
    """At a layer's first call: this machine's profile, found or measured now on every rank
    of ``group`` together (None where none is wanted: the shipped or named profile decides)."""
    world = group.size()
    if not wants_measured(options, world):
        return None
    prof, to_measure = first_use.machine_profile(group, world, query.device, options)
    if to_measure is None:
        return prof
    if query.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError("BurstDotProductAttention's first call with 'auto' on this machine "
                         "cannot be captured in a CUDA graph: it measures the machine (run a "
                         "step before capturing, or pass --burst-profile)")
    from megatron_burst.attention.api import burst_attn

    q, k, v = (t if t.dim() == 4 else t.unsqueeze(1) for t in (query, key, value))  # THD
    return first_use.acquire(group, world, to_measure, q, k, v, True, burst_attn)
