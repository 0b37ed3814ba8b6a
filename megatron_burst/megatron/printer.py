"""The run's one printer: a line on global rank 0 only.

It exists so that every line the Megatron entry points print (the run's choices, the FLOPs
line the benchmarks read back, the document reports) goes out once per run, not once per
rank, and also before torch.distributed is initialised (torchrun's RANK says who is 0).
"""
from __future__ import annotations

import torch.distributed as dist

from megatron_burst.comm.settings import current


def say(message: str) -> None:
    """Print on global rank 0 (torchrun's RANK before torch.distributed is initialised)."""
    rank = dist.get_rank() if dist.is_initialized() else current().launcher_rank
    if rank == 0:
        print(message, flush=True)
