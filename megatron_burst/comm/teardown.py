"""What the package holds on process groups, let go before ``torch.distributed`` tears them down.

Why: the package makes two things the user never asked for that outlive a call and hold on
to a group: CUDA graphs of replayed passes (``attention.replay``: their NCCL kernels keep the
communicator busy, and ``destroy_process_group`` hung on both ranks of 2x H100 with them
held) and the gloo twins of NCCL groups (``host_channel``: a twin of a world that was torn
down talks to a store that is gone). ``on_destroy(release)`` wraps
``torch.distributed.destroy_process_group`` once per process; the wrapper hands every
registered ``release`` the group being destroyed (None: the whole world) before the group
goes. A module registers where it first makes what it must release.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch.distributed as dist

_RELEASES: list[Callable[[Any], None]] = []


def on_destroy(release: Callable[[Any], None]) -> None:
    """Run ``release(group)`` before each ``destroy_process_group(group)`` of this process
    (registered once however often it is asked)."""
    if release not in _RELEASES:
        _RELEASES.append(release)
    destroy = dist.destroy_process_group
    if getattr(destroy, "releases_burst_state", False):
        return

    @functools.wraps(destroy)
    def releasing(*args, **kwargs):
        group = args[0] if args else kwargs.get("group")
        for each in tuple(_RELEASES):
            each(group)
        return destroy(*args, **kwargs)

    releasing.releases_burst_state = True
    dist.destroy_process_group = releasing
