"""The replay of eager ring passes from CUDA graphs (``attention.replay``), on CPU: the setting
is validated where it is read, a call says whether it replays by rule, ranks that set it
differently refuse together, and a pass's graph is keyed by value. The replays themselves
run on GPUs (``tests/test_gpu_replay.py``)."""
from __future__ import annotations

import os
import types

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention import replay
from megatron_burst.attention.call import call_of
from megatron_burst.comm import settings

from .distributed import run_ranks


def test_the_setting_is_checked_where_it_is_read(monkeypatch):
    assert settings.BurstSettings.from_env({}).replay == "off"  # opt in (attention.replay)
    for value in ("on", "OFF", " auto "):
        assert settings.BurstSettings.from_env({settings.REPLAY_ENV: value}).replay == \
            value.strip().lower()
    with pytest.raises(ValueError, match=settings.REPLAY_ENV):
        settings.BurstSettings.from_env({settings.REPLAY_ENV: "sometimes"})


def _plan(travels: bool = True, whole=None):
    return types.SimpleNamespace(topo=object() if travels else None, whole=whole)


def _call(**given):
    arguments = dict(causal=True, softmax_scale=None, window_size=(-1, -1), layout="zigzag",
                     qkv_format="bshd", kernel=None, call_label=None, topology=None,
                     cu_seqlens=None, keep=None,
                     sinks=None, return_lse=False, mask=None, backward="ring",
                     ulysses_size=1, intra_node_size=None)
    arguments.update(given)
    return call_of(arguments)


def test_which_calls_replay(monkeypatch):
    """CUDA only, a ring that moves something, the same work every call; ``auto`` up to
    REPLAY_MAX_ELEMENTS of queries a rank (8K tokens of 16 heads of 128 in, one token more
    out), ``on`` any size, ``off`` (the default) none."""
    def cuda(*shape):
        return types.SimpleNamespace(is_cuda=True, shape=shape,
                                     numel=lambda: int(torch.Size(shape).numel()))

    small = torch.empty(1, 64, 2, 8, device="meta")
    cuda_like, cuda_big = cuda(1, 8192, 16, 128), cuda(1, 8193, 16, 128)
    assert not replay.wanted(_call(), cuda_like, _plan())
    monkeypatch.setenv(settings.REPLAY_ENV, "auto")
    plain = _call()
    assert not replay.wanted(plain, small, _plan())  # not CUDA
    assert replay.wanted(plain, cuda_like, _plan())
    assert not replay.wanted(plain, cuda_big, _plan())  # auto: host-bound sizes only
    assert not replay.wanted(plain, cuda_like, _plan(travels=False))  # one member
    assert not replay.wanted(plain, cuda_like, _plan(whole=object()))
    pack = _call(layout="whole_docs", cu_seqlens=torch.tensor([0, 30, 64], dtype=torch.int32))
    assert not replay.wanted(pack, cuda_like, _plan())  # a new plan every pack
    device_docs = _call(layout="pack_zigzag", cu_seqlens=torch.tensor([0, 30, 64]))
    assert replay.wanted(device_docs, cuda_like, _plan())  # the GPU reads the documents
    monkeypatch.setenv(settings.REPLAY_ENV, "on")
    assert replay.wanted(plain, cuda_big, _plan())
    monkeypatch.setenv(settings.REPLAY_ENV, "off")
    assert not replay.wanted(plain, cuda_like, _plan())


def _bound(group_name: str = "g", plan_key=("plan", 1), scale: float = 0.125,
           boundaries=None):
    kernel = types.SimpleNamespace(name="torch-flash")
    return types.SimpleNamespace(group=types.SimpleNamespace(group_name=group_name),
                                 plan=types.SimpleNamespace(key=plan_key), kernel=kernel,
                                 scale=scale, seq_first=False, boundaries=boundaries)


def test_a_pass_graph_is_keyed_by_value(monkeypatch):
    """Equal values give one key whatever the objects; any difference of the plan, scale,
    group, shape, stride, dtype or boundaries' shape gives another."""
    monkeypatch.setattr(replay, "group_name", lambda group: group.group_name)
    t = torch.zeros(1, 8, 2, 4)
    key = replay._key("forward", _bound(), (t,))
    assert key == replay._key("forward", _bound(plan_key=("plan", 1)), (torch.ones(1, 8, 2, 4),))
    others = [replay._key("backward", _bound(), (t,)),
              replay._key("forward", _bound(plan_key=("plan", 2)), (t,)),
              replay._key("forward", _bound(scale=0.5), (t,)),
              replay._key("forward", _bound(group_name="h"), (t,)),
              replay._key("forward", _bound(), (torch.zeros(1, 9, 2, 4),)),
              replay._key("forward", _bound(), (torch.zeros(1, 2, 8, 4).transpose(1, 2),)),
              replay._key("forward", _bound(), (t.double(),)),
              replay._key("forward", _bound(boundaries=torch.zeros(9, dtype=torch.int32)),
                          (t,))]
    assert len({key, *others}) == 1 + len(others)


def test_a_cpu_call_never_replays():
    q, k, v = (torch.randn(1, 16, 2, 8, requires_grad=True) for _ in range(3))
    mb.burst_attn(q, k, v, causal=True).sum().backward()
    assert replay.CAPTURED == []


def mixed_worker(rank, world):
    os.environ[settings.REPLAY_ENV] = "off" if rank == 0 else "auto"
    settings.reload()
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 32, 2, 8, generator=gen) for _ in range(3))
    try:
        mb.burst_attn(q, k, v, causal=True, backward="ring")
    except ValueError as error:
        return str(error)
    finally:  # a rank process may serve later tests
        os.environ.pop(settings.REPLAY_ENV, None)
        settings.reload()
    return None


def test_ranks_that_set_it_differently_refuse_together():
    """A rank that would capture while its peer runs eagerly (no headers against headers)
    would pair its messages wrongly: the setting is in the call's signature."""
    said = run_ranks(2, mixed_worker, timeout=120)
    assert said[0] is not None and said[0] == said[1], said
    assert "'replay'" in said[0] and "'off'" in said[0] and "'auto'" in said[0], said[0]


def test_a_replay_counts_what_its_capture_posted():
    """What a capture posts is counted apart (nothing leaves then), and each replay adds it
    to every open counter, nested ones too (``accounting.captured``, ``replayed``)."""
    from megatron_burst.comm import accounting

    with mb.count_comm() as outer:
        with accounting.captured() as sent:
            accounting.record_sent(100, "forward")
            accounting.record_sent(40, "backward")
        assert outer.total_bytes == 0
        assert (sent.forward_bytes, sent.backward_bytes) == (100, 40)
        with mb.count_comm() as inner:
            accounting.replayed(sent)
            accounting.replayed(sent)
        assert (inner.forward_bytes, inner.backward_messages) == (200, 2)
    assert (outer.forward_bytes, outer.backward_bytes, outer.forward_messages) == (200, 80, 2)


class _FakeGraph:
    """Stands in for a CUDA graph: a replay doubles its input into its output."""

    def __init__(self, inputs, outputs):
        self.inputs, self.outputs, self.replays = inputs, outputs, 0

    def replay(self):
        self.replays += 1
        self.outputs[0].copy_(self.inputs[0] * 2)


def test_a_key_captures_at_its_second_call_and_keys_seen_once_push_out_no_graph(monkeypatch):
    """First call eager (None), second captured and replayed, later replays; outputs are
    copies (the next replay does not change them); a stream of keys each seen once (a mask
    that changes every call) leaves the graphs held; past KEPT graphs the oldest goes."""
    monkeypatch.setattr(replay, "group_name", lambda group: group.group_name)
    monkeypatch.setattr(replay.consensus, "capturing", lambda: False)
    captures = []

    def capture(bound, tensors, pass_):
        inputs = tuple(torch.empty_like(t) for t in tensors)
        outputs = (torch.empty_like(tensors[0]),)
        captures.append(bound.plan.key)
        return replay._Graph(_FakeGraph(inputs, outputs), inputs, outputs,
                             replay.accounting.CommStats())

    monkeypatch.setattr(replay, "_capture", capture)
    replay.clear()
    bound = _bound()
    bound.replay = True
    eager = lambda b, x: (x * 2,)  # noqa: E731  (what the pass computes)
    x = torch.arange(4.0)
    assert replay.run("forward", bound, (x,), eager) is None  # first call: eager
    first = replay.run("forward", bound, (x,), eager)  # captured, then replayed
    again = replay.run("forward", bound, (x + 1,), eager)
    assert captures == [("plan", 1)] and torch.equal(first[0], x * 2)
    assert torch.equal(again[0], (x + 1) * 2) and torch.equal(first[0], x * 2)  # a copy
    for i in range(replay.SEEN_KEPT + 5):  # keys seen once each
        other = _bound(plan_key=("mask", i))
        other.replay = True
        assert replay.run("forward", other, (x,), eager) is None
    assert list(replay._GRAPHS) and replay.run("forward", bound, (x,), eager) is not None
    assert len(replay._SEEN) == replay.SEEN_KEPT and len(captures) == 1
    for i in range(replay.KEPT):  # KEPT more graphs: the first one goes
        other = _bound(plan_key=("shape", i))
        other.replay = True
        for _ in range(2):
            replay.run("forward", other, (x,), eager)
    assert len(replay._GRAPHS) == replay.KEPT and len(captures) == 1 + replay.KEPT
    assert replay.run("forward", bound, (x,), eager) is None  # seen anew: eager again
    replay.clear()


def test_a_capture_while_graphs_are_held_is_refused(monkeypatch):
    """Inside a capture of the user's: the pass runs as captured (None) while no graph is
    held, and raises ValueError naming the variable once one is (``replay`` docstring)."""
    monkeypatch.setattr(replay.consensus, "capturing", lambda: True)
    replay.clear()
    bound = _bound()
    bound.replay = True
    assert replay.run("forward", bound, (torch.zeros(2),), lambda b, x: (x,)) is None
    replay._GRAPHS[("held",)] = object()
    try:
        with pytest.raises(ValueError, match=settings.REPLAY_ENV):
            replay.run("forward", bound, (torch.zeros(2),), lambda b, x: (x,))
    finally:
        replay.clear()


def test_the_teardown_drops_the_graphs_first(monkeypatch):
    """NCCL's teardown waits for graphs that hold its kernels (it hung with replay graphs
    held, 2x H100): the first capture wraps ``destroy_process_group`` once, and the wrapper
    drops the graphs before the group goes (on GPUs: ``tests/test_gpu_replay.py``)."""
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "destroy_process_group",
                        lambda *a, **k: calls.append((dict(replay._GRAPHS), a, k)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronized"))
    replay._release_before_teardown()
    wrapped = dist.destroy_process_group
    replay._release_before_teardown()  # once: no wrapper around the wrapper
    assert dist.destroy_process_group is wrapped and wrapped.releases_burst_state
    monkeypatch.setitem(replay._GRAPHS, ("a key",), "a graph")
    dist.destroy_process_group("a group")
    assert calls == ["synchronized", ({}, ("a group",), {})] and not replay._GRAPHS
    dist.destroy_process_group()  # nothing held: straight through
    assert calls[-1] == ({}, (), {})
