"""Eager calls at a CUDA graph's host cost: a ring pass whose work repeats is captured once
and replayed (``MEGATRON_BURST_REPLAY=auto`` or ``on``; ``off`` by default, ``comm.settings``).

Why: at 8-16K tokens per GPU an eager CP=2 call is host-bound. Its passes post three hops
(about 150 us of host time each in the process group's own calls), launch a dozen kernels
and run the loops' Python: 2-3 ms of host time a call, against 1-3 ms of GPU work (README,
issue 39). The same passes replayed from a CUDA graph cost the host a few launches. Users
who capture their whole step get that already; this gives it to the eager step, wherever a
pass's work is the same from call to call: a plain sequence's plan, and a pack whose
documents the GPU reads (layout ``pack_zigzag``: the boundaries are one of the graph's
inputs, so one graph serves every pack). A ``whole_docs`` pack has new hops and kernel calls
every micro-batch, so its passes always run eagerly (``wanted``).

How: each pass (the forward ring; the backward rings given O) is keyed by value: which pass,
the plan's key, the kernel, scale and format, the group's name, and every input's shape,
stride and dtype. Its key's first call runs eagerly (it warms every kernel, the merge's
compile and the peers' communicators); its second is captured, and every later one replays:
the call's tensors are copied into the graph's own inputs on the GPU, in stream order, the
graph is replayed, and its outputs are cloned out, since the next replay writes over them.
The backward's graph takes the tensors the forward saved, so layers may run in any order
(layer 2's forward between layer 1's forward and backward overwrites nothing layer 1 needs).
The same machinery replays a call's other device work that repeats (``function``: a pack's
boundaries check, ``agree.check_boundaries``). A graph holds what its capture read from
outside it (``_Graph.holds``), and the process group's teardown drops every graph first
(``_release_before_teardown``: NCCL's teardown waits for graphs that hold its kernels).
At most ``KEPT`` graphs are held, each with its buffers; ``auto`` replays only where a rank's
queries are small (``REPLAY_MAX_ELEMENTS``): there the host bounds the call, and the copies
in and out and the graph's buffers are small.

Exact: a replay runs the kernels the eager pass ran, in its order, on copies of the same
values. The decision is the same on every rank: the setting is part of the call's
signature (``call.signature``), and a key's calls are counted alike on ranks whose calls
agree. What a replay does not do, as in a user's own capture: stamp and check the messages'
headers (``comm.headers``); the call's arguments were compared at its signature's first
call (``agree``), eagerly.

Why off by default: on 2x H100 (torch 2.11, NCCL), a CUDA graph captured by the user
(``torch.cuda.make_graphed_callables``) after calls that replayed failed on one machine
(``cudaErrorStreamCaptureInvalidated`` before the forward's first merge) where a host sync or
a collective came between a call's forward and its backward, and once in that pattern without
replay too; on another machine every such capture worked (``benchmarks/capture_after_eager.py``,
README). Not understood, so a capture while this process holds replay graphs raises
ValueError naming the setting, on every rank (``run``): a run that captures its own graphs
(Megatron's ``--cuda-graph-impl``) keeps it off.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import torch

from ..comm import accounting, consensus, teardown
from ..comm.settings import REPLAY_ENV, current
from ..kernels.thresholds import HOST_BOUND_MAX_ELEMENTS
from .sharding import group_name

KEPT = 8  # graphs held (a model's attention shapes: its layers share one per pass)
SEEN_KEPT = 256  # keys called once, remembered (a mask that changes every call is one each)
# ``auto``: where a rank's queries hold at most this many elements (tokens x heads x head
# dim: 8K tokens of 16 heads of 128, 16K of 16 of 64). Measured on 2x H100 (README): at 8K
# tokens of 16:4 heads d64 a replayed call ran 0.81 of one GPU's kernel against 0.56-0.66
# eager, while at 8K of 32 heads of 128 it gained nothing, the copies in and out costing what
# the host saved (0.76-0.86 replayed against 0.78-0.92 eager, two runs). The ring's forward
# draws its threshold's line at the same size (``kernels.thresholds``).
REPLAY_MAX_ELEMENTS = HOST_BOUND_MAX_ELEMENTS


def wanted(call, q: torch.Tensor, plan) -> bool:
    """Whether this prepared call's ring passes may replay (a value of its ``BoundPlan``):
    CUDA, a plan whose passes move something, the same work every call (no pack planned on
    the host, nothing kept for a recompute), and the setting."""
    mode = current().replay
    if mode == "off" or not q.is_cuda or plan.topo is None or plan.whole is not None:
        return False
    if call.keep or (call.cu_seqlens is not None and not call.device_docs):
        return False
    return mode == "on" or q.numel() <= REPLAY_MAX_ELEMENTS


@dataclasses.dataclass
class _Graph:
    """One captured pass: its graph, its own inputs and outputs."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    sent: accounting.CommStats  # what a replay sends (``count_comm`` counts it each replay)
    # What the capture read from outside the graph (a plan's device tables, a function's
    # closure), held as long as the graph: the graph reads their memory at every replay.
    holds: object = None


# Keys called once, and keys captured: apart, so that keys seen once (a slice mask or a pack
# length that changes every call) never push out a graph. Both bounded, oldest out first,
# the same on every rank whose calls agree.
_SEEN: "collections.OrderedDict[tuple, None]" = collections.OrderedDict()
_GRAPHS: "collections.OrderedDict[tuple, _Graph]" = collections.OrderedDict()
CAPTURED: list[tuple] = []  # keys captured in this process, in order (tests, benchmarks)


def run(name: str, bound, tensors: Sequence[torch.Tensor],
        pass_: Callable[..., tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...] | None:
    """``pass_(bound, *tensors)`` (untagged) from a replay of its graph, captured at its
    key's second call; None where the caller must run the pass eagerly (not wanted, inside a
    user's capture, or the key's first call)."""
    if not bound.replay:
        return None
    if consensus.capturing():  # a user's own capture: the pass is captured as it runs
        if _GRAPHS:
            raise ValueError(f"burst_attn in a CUDA graph capture after calls that replayed "
                             f"their passes ({REPLAY_ENV}={current().replay}): such captures "
                             f"failed on a 2x H100 machine (not understood); set "
                             f"{REPLAY_ENV}=off in a run that captures its own graphs")
        return None
    given = tensors if bound.boundaries is None else (*tensors, bound.boundaries)
    return _replayed(_key(name, bound, tensors), given,
                     lambda: _capture(bound, tensors, pass_))


def function(key: tuple, fn: Callable[..., tuple[torch.Tensor, ...]],
             tensors: Sequence[torch.Tensor], fresh: bool = True
             ) -> tuple[torch.Tensor, ...] | None:
    """``fn(*tensors)`` from a replay of its graph, captured at ``key``'s second call; None
    where the caller runs it eagerly (the key's first call, or inside any capture). ``fn``:
    device work and collectives only, called alike on every rank (the boundaries' check,
    ``agree.check_boundaries``); ``key``: what its graph holds for, by value, the inputs'
    shapes, strides and dtypes added here. ``fresh=False``: the graph's own outputs, for a
    caller that reads them in stream order before any later replay (no copies out)."""
    if consensus.capturing():
        return None
    key = ("function", *key, tuple((t.shape, t.stride(), t.dtype, str(t.device))
                                   for t in tensors))
    return _replayed(key, tensors, lambda: _capture_function(fn, tensors), fresh)


def _replayed(key: tuple, given: Sequence[torch.Tensor], capture: Callable[[], "_Graph"],
              fresh: bool = True) -> tuple[torch.Tensor, ...] | None:
    """The graph of ``key`` replayed on ``given`` (``capture`` makes it at the key's second
    call); None at the key's first call."""
    found = _GRAPHS.get(key)
    if found is not None:
        _GRAPHS.move_to_end(key)
    elif key not in _SEEN:  # first call: eager (it warms what the capture will need)
        _keep(_SEEN, key, None, SEEN_KEPT)
        return None
    else:
        del _SEEN[key]
        found = capture()
        _release_before_teardown()
        _keep(_GRAPHS, key, found, KEPT)
        CAPTURED.append(key)
    for mine, value in zip(found.inputs, given):
        mine.copy_(value)
    found.graph.replay()
    accounting.replayed(found.sent)
    return tuple(t.clone() for t in found.outputs) if fresh else found.outputs


def clear() -> None:
    """Drop every graph and every key seen (tests; a process that changes its settings)."""
    _SEEN.clear()
    _GRAPHS.clear()
    CAPTURED.clear()


def _capture_function(fn: Callable[..., tuple[torch.Tensor, ...]],
                      tensors: Sequence[torch.Tensor]) -> _Graph:
    """Capture ``fn`` on inputs of its own. Runs nothing: the caller replays."""
    inputs = tuple(torch.empty_like(t) for t in tensors)
    graph = torch.cuda.CUDAGraph()
    with accounting.captured() as sent, torch.cuda.graph(graph):
        outputs = tuple(fn(*inputs))
    return _Graph(graph, inputs, outputs, sent, fn)


def _release_before_teardown() -> None:
    """Make ``torch.distributed.destroy_process_group`` drop this module's graphs first.

    Why: a graph holding NCCL's kernels keeps its communicator busy, and the teardown waits
    for it: with replay graphs held, ``destroy_process_group`` hung on both ranks (2x H100,
    torch 2.11, NCCL 2.28: killed after 60 s), and returned in 0.1-0.5 s with them dropped
    first (``tests/test_gpu_replay.py``). The graphs are this module's own, made without the
    user asking for graphs, so it is this module's job to let them go; it registers at the
    process's first capture (``comm.teardown``), and any group's teardown drops them all
    (they are captured again where calls go on)."""
    teardown.on_destroy(_drop_graphs)


def _drop_graphs(_group) -> None:
    if _GRAPHS:
        import gc

        torch.cuda.synchronize()  # no graph is destroyed while it runs
        clear()
        gc.collect()


def _keep(table: collections.OrderedDict, key: tuple, value, most: int) -> None:
    table[key] = value
    if len(table) > most:
        table.popitem(last=False)  # the oldest: the same on every rank whose calls agree


def _key(name: str, bound, tensors: Sequence[torch.Tensor]) -> tuple:
    """What a pass's graph holds for, by value (the module docstring)."""
    cu = bound.boundaries
    return (name, group_name(bound.group), bound.plan.key, type(bound.kernel).__qualname__,
            bound.kernel.name, bound.scale, bound.seq_first, str(tensors[0].device),
            tuple((t.shape, t.stride(), t.dtype) for t in tensors),
            None if cu is None else (cu.shape, cu.dtype))


def _capture(bound, tensors: Sequence[torch.Tensor],
             pass_: Callable[..., tuple[torch.Tensor, ...]]) -> _Graph:
    """Capture ``pass_`` on inputs of its own (the boundaries too, where the GPU reads them:
    the launches are made from them inside the graph). Runs nothing: the caller replays."""
    inputs = tuple(torch.empty_like(t) for t in tensors)
    cu = None if bound.boundaries is None else torch.empty_like(bound.boundaries)
    graph = torch.cuda.CUDAGraph()
    with accounting.captured() as sent, torch.cuda.graph(graph):
        # Inside the graph the pass runs as an eager one, its launches bound to ``cu``.
        captured = bound if cu is None else dataclasses.replace(
            bound, replay=False).with_boundaries(cu)
        outputs = tuple(pass_(captured, *inputs))
    if cu is not None:
        inputs = (*inputs, cu)
    return _Graph(graph, inputs, outputs, sent, captured)
