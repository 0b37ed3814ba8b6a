"""How the ranks of a group learn what the others hold: the one mechanism every agreement uses.

The ranks must agree on a call's arguments and their agreement mode (``attention.agree``),
on how many attention calls they made (``attention.call_count``), on which ring message
belongs to which call (``headers``), on whether each made its document batch
(``megatron.batch_verdict``), on whether each holds a kept output (``attention.remat``), and
on the figures 'auto' decides from (``attention.first_use``, ``attention.decision_check``).
Each of those states what it compares; how the numbers travel is stated here, once:

- ``device``: where a collective's tensors live for a group's backend (the GPU where the
  group is NCCL only, else the CPU);
- ``shared``: whether a group has peers to agree with at all;
- ``gather``: every rank's few int64s, one all-gather, over an NCCL group's gloo twin
  (``host_channel``: the host never waits for the GPU); the wait is bounded (``waits``)
  and its error says who was waited for and why; ``Exchange``: the same, posted now and
  read later;
- ``minimum``: an elementwise minimum over the ranks (every rank has it only if all do);
- ``Gathered``: every rank's one int64 without making the host wait for the GPU: on CUDA
  gathered on the device (``device_table``, which a CUDA graph can hold) and copied home
  into pinned memory behind an event;
- ``defer`` and ``poll``: checks whose data is still on its way home from the GPU, run in
  order once it is there, never waiting for it (one queue per process: ``poll`` raises for
  the first check that failed, at the next call);
- ``root`` and ``from_root``: the group's first rank, and its value on every rank (rank 0's
  measurements);
- ``error_text``: how an error travels as text to the peers that raise it too.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from . import host_channel
from .waits import wait_bounded

WHY = "that rank failed or is stuck"


def device(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group``'s collectives take their tensors: the current GPU where its backend is
    NCCL only, else the CPU (gloo, and mixed groups, take CPU tensors)."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shared(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` has peers (torch.distributed is up and the group has 2+ ranks)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (where no collective may run)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def error_text(error: BaseException) -> str:
    """An error as the peers say it: a ValueError's message, else its type and message."""
    return str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"


def gather(group: dist.ProcessGroup | None, values: Sequence[int], waiting_for: str,
           why: str = WHY) -> list[list[int]]:
    """Every rank's ``values`` (int64s, as many on every rank), in group rank order: one
    all-gather, bounded (``waiting_for`` and ``why`` word the timeout's error)."""
    return Exchange(group, values, waiting_for, why).values()


class Exchange:
    """``gather`` posted now and read later (``values``), so the host can work meanwhile. An
    NCCL group's goes over its gloo twin (``host_channel``): neither the posting nor the
    reading waits for the GPU's queue. ``on_group``: over ``group`` itself (the twin's own
    setup, and benchmarks and tests comparing the two ways)."""

    def __init__(self, group: dist.ProcessGroup | None, values: Sequence[int],
                 waiting_for: str, why: str = WHY, on_group: bool = False) -> None:
        where = device(group)
        made = None if on_group or where.type != "cuda" else host_channel.twin(
            group, lambda said: Exchange(group, said, waiting_for, why, on_group=True).values())
        if made is not None:
            where = torch.device("cpu")
            self._work, self._rows = host_channel.all_gather(
                made, torch.tensor(list(values), dtype=torch.int64))
        else:
            self._work, self._rows = Exchange._post(group, values, where)
        self._where, self._waiting_for, self._why = where, waiting_for, why

    @staticmethod
    def _post(group, values, where: torch.device):
        mine = torch.tensor(list(values), dtype=torch.int64, device=where)
        rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        return dist.all_gather(rows, mine, group=group, async_op=True), rows

    def values(self) -> list[list[int]]:
        """Every rank's values, in group rank order (a bounded wait for the exchange)."""
        wait_bounded(self._work, self._where, self._waiting_for, why=self._why)
        return torch.stack(self._rows).tolist()


def minimum(group: dist.ProcessGroup | None, values: torch.Tensor, waiting_for: str,
            why: str = WHY) -> torch.Tensor:
    """``values``' elementwise minimum over the ranks of ``group``, on ``values``' device
    (``values`` itself where the group has no peers)."""
    if not shared(group):
        return values
    mine = values.to(device(group), copy=True)
    work = dist.all_reduce(mine, op=dist.ReduceOp.MIN, group=group, async_op=True)
    wait_bounded(work, mine.device, waiting_for, why=why)
    return mine.to(values.device)


class Gathered:
    """Every rank's one int64, gathered over ``group`` (a collective: call on every rank, in
    the same order; a group without peers gathers its own). ``value``: a host int, or a
    one-element int64 tensor on the group's device (made there, never read on the host).
    On CPU it is here at once (a bounded wait). On CUDA the host does not wait: the gather
    runs on the current stream and its result comes home by an asynchronous copy; ``event``
    marks its arrival (``defer`` a check on it, or ``values`` waits for it)."""

    def __init__(self, group: dist.ProcessGroup | None, value: int | torch.Tensor,
                 waiting_for: str) -> None:
        peers = shared(group)
        where = device(group) if peers else (
            value.device if isinstance(value, torch.Tensor) else torch.device("cpu"))
        # Filled on the device: torch.tensor([value], device="cuda") would copy from
        # pageable memory, which makes the host wait for the stream's queued work.
        mine = value.reshape(1).to(where, torch.int64) if isinstance(value, torch.Tensor) \
            else torch.full((1,), value, dtype=torch.int64, device=where)
        self.event: Any = None
        if where.type == "cuda":
            self._home(device_table(group, mine) if peers else mine)
            return
        table = mine
        if peers:
            table = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=where)
            work = dist.all_gather_into_tensor(table, mine, group=group, async_op=True)
            wait_bounded(work, where, waiting_for)
        self._host = table

    @classmethod
    def arrived(cls, table: torch.Tensor) -> "Gathered":
        """A table the GPU gathered already (``device_table``, replayed from a CUDA graph by
        ``attention.replay``), brought home as a gather's is."""
        gathered = cls.__new__(cls)
        gathered._home(table)
        return gathered

    def _home(self, table: torch.Tensor) -> None:
        self._host = torch.empty(table.shape, dtype=torch.int64, pin_memory=True)
        self._host.copy_(table, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def values(self) -> list[int]:
        """The gathered values, in group rank order (waits only for the copy home)."""
        if self.event is not None:
            self.event.synchronize()
        return self._host.tolist()


def device_table(group: dist.ProcessGroup, value: torch.Tensor) -> torch.Tensor:
    """Every rank's one int64 ``value`` (a CUDA tensor, ``group`` NCCL) as a [world] table on
    the GPU, the current stream waiting for the gather and the host not: device work and one
    collective only, so a CUDA graph can hold it (``Gathered.arrived`` brings it home)."""
    table = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=value.device)
    dist.all_gather_into_tensor(table, value.reshape(1).to(torch.int64), group=group,
                                async_op=True).wait()
    return table


_PENDING: list[tuple[Any, Callable[[], None]]] = []  # (event, check), oldest first


def defer(check: Callable[[], None], event: Any = None) -> None:
    """Run ``check`` (it raises ValueError if the ranks disagree) once ``event`` (default:
    one recorded now on the current stream, after the copies home already queued) has
    passed: at a later ``poll``, never waiting for the GPU."""
    if event is None:
        event = torch.cuda.Event()
        event.record()
    _PENDING.append((event, check))


def poll() -> None:
    """Run the deferred checks whose data has arrived, oldest first; the first that raises
    drops the rest (the group is broken) and its error is raised here. Cheap when nothing is
    pending; never waits (nor runs inside a graph capture, where an event cannot be
    queried)."""
    if not _PENDING or capturing():
        return
    while _PENDING and _PENDING[0][0].query():
        _, check = _PENDING.pop(0)
        try:
            check()
        except ValueError:
            _PENDING.clear()
            raise


def root(group: dist.ProcessGroup | None) -> int:
    """The global rank of ``group``'s first rank: the one whose figures every rank takes."""
    if group is None or group == dist.group.WORLD:
        return 0
    return dist.get_process_group_ranks(group)[0]


def from_root(group: dist.ProcessGroup | None, value: Any) -> Any:
    """The value the group's first rank (``root``) passed, on every rank of ``group`` (a
    collective; the value is pickled)."""
    box = [value]
    dist.broadcast_object_list(box, src=root(group), group=group)
    return box[0]
