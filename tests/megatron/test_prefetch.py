"""The prefetcher on one process: order, overlap with the step, errors at the batch that
failed, the end of the data, Megatron's rerun replay, clean shutdown, and the trace."""
from __future__ import annotations

import json
import pickle
import threading

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_burst.megatron import prefetch  # noqa: E402
from megatron_burst.megatron.prefetch import THREAD_PREFIX, Prefetcher  # noqa: E402


def _prefetch_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture(autouse=True)
def _no_thread_left():
    yield
    prefetch.close_all()
    assert _prefetch_threads() == []


def test_batches_come_in_the_source_order_made_once_each():
    made = []

    def make(x):
        made.append(x)
        return ("batch", x)

    assert list(Prefetcher(iter(range(7)), make)) == [("batch", x) for x in range(7)]
    assert made == list(range(7))


def test_the_batch_after_next_is_made_on_the_thread_while_the_step_runs():
    """Deterministic, no timing: step i does not end until batch i+2 was made, which only a
    thread running beside the step can do (made here, the step would wait forever)."""
    done = {i: threading.Event() for i in range(8)}
    where = {}

    def make(i):
        where[i] = threading.current_thread().name
        done[i].set()
        return i

    taken = []
    for i in Prefetcher(iter(range(8)), make):
        taken.append(i)
        if i + 2 < 8:  # the step: it runs while the thread makes batch i+2
            assert done[i + 2].wait(timeout=30), f"batch {i + 2} was not made during step {i}"
    assert taken == list(range(8))
    assert all(name.startswith(THREAD_PREFIX) for name in where.values())


def test_a_failed_batch_raises_at_its_own_step_and_only_there():
    def make(x):
        if x == 3:
            raise ValueError("malformed pack 3")
        return x

    it = Prefetcher(iter(range(6)), make)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="malformed pack 3"):
        next(it)
    assert next(it) == 4  # the batches after it were made, in order


def test_a_failed_read_raises_at_its_batch():
    def source():
        yield 0
        raise OSError("disk gone")

    it = Prefetcher(source(), lambda x: x)
    assert next(it) == 0
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def test_the_data_ends_where_the_source_ends():
    it = Prefetcher(iter([1, 2]), lambda x: x, depth=3)
    assert list(it) == [1, 2]
    with pytest.raises(StopIteration):
        next(it)


def test_close_ends_the_thread_and_a_closed_prefetcher_refuses():
    it = Prefetcher(iter(range(100)), lambda x: x)
    next(it)
    assert len(_prefetch_threads()) == 1
    it.close()
    assert _prefetch_threads() == []
    with pytest.raises(ValueError, match="closed"):
        next(it)


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(iter(()), lambda x: x, depth=0)


def test_a_rerun_replays_the_batches_made_for_its_iteration():
    """Under Megatron's RerunDataIterator the prefetcher sits under it: a rewind hands back the
    very batches of the iteration, and the batch made ahead is not lost by the replay."""
    from megatron.core import rerun_state_machine as rsm

    rsm.initialize_rerun_state_machine(mode=rsm.RerunMode.VALIDATE_RESULTS)
    try:
        outer = rsm.RerunDataIterator(iter(range(10)))
        assert prefetch.prefetching(outer, lambda x: [x], None) is outer
        assert isinstance(outer.iterable, Prefetcher)
        assert prefetch.prefetching(outer, lambda x: [x], None).iterable is outer.iterable
        first = [next(outer) for _ in range(3)]
        outer.rewind()
        assert [next(outer) for _ in range(3)] == first
        assert all(a is b for a, b in zip(first, outer.saved_microbatches))
        outer.advance()
        assert next(outer) == [3]
    finally:
        rsm.destroy_rerun_state_machine()


def test_other_iterators_are_left_as_they_are():
    plain = iter(range(3))
    assert prefetch.prefetching(plain, lambda x: x, None) is plain


def test_the_switch_reads_the_environment(monkeypatch):
    monkeypatch.setenv(prefetch.ENV, "0")
    assert not prefetch.enabled()
    monkeypatch.setenv(prefetch.ENV, "1")
    assert prefetch.enabled()
    monkeypatch.setenv(prefetch.ENV, "maybe")
    with pytest.raises(ValueError, match=prefetch.ENV):
        prefetch.enabled()


def test_a_prepared_batch_pickles_as_its_sample():
    from megatron_burst.megatron.document_batches import DocumentBatchMaker

    tokens = torch.tensor([[1, 2, 9, 3, 4, 5, 9, 6]])
    sample = {"tokens": tokens, "labels": tokens, "loss_mask": torch.ones(1, 8)}
    batch = DocumentBatchMaker(9, None, "whole_docs", (), None, pin=False)(sample)
    assert batch.params.pack.lens == (3, 4, 1)
    back = pickle.loads(pickle.dumps(batch))
    assert type(back) is dict and torch.equal(back["tokens"], tokens)


def test_the_trace_records_the_prefetch_thread_beside_the_step(tmp_path):
    from megatron_burst.megatron.trace import StepTrace

    trace = StepTrace(f"{tmp_path}:1:2", rank=0)
    made = {i: threading.Event() for i in range(6)}

    def make(i):
        torch.ones(64, 64) @ torch.ones(64, 64)
        made[i].set()
        return i

    for i in Prefetcher(iter(range(6)), make):
        trace.step()
        with torch.profiler.record_function("the step"):
            torch.ones(128, 128) @ torch.ones(128, 128)
            if i + 2 < 6:  # the step ends once batch i+2 is made: inside the traced steps
                assert made[i + 2].wait(timeout=30)
    events = json.loads((tmp_path / "rank0.json").read_text())["traceEvents"]
    threads = {e["name"]: e["tid"] for e in events if e.get("name", "").startswith(
        ("megatron_burst", "the step"))}
    assert {"megatron_burst: make batch", "megatron_burst: take batch", "the step"} <= set(threads)
    assert threads["megatron_burst: make batch"] != threads["the step"]
    with pytest.raises(ValueError, match="MEGATRON_BURST_TRACE"):
        StepTrace("dir:1:0", rank=0)


def test_a_single_rank_pack_planned_ahead_is_the_one_the_call_uses(monkeypatch):
    """CP=1: the pack's one varlen call, planned by plan_pack, is what burst_attn runs; the
    call itself plans nothing and gives what a pack planned at the call gives."""
    import megatron_burst as mb
    import megatron_burst.plan.packs as packs
    import megatron_burst.attention.prepare as prepare
    import megatron_burst.attention.call_plan as call_plan
    import megatron_burst.attention.pair_calls as pair_calls
    import megatron_burst.plan.schedule as schedule
    from megatron_burst.decide.topology import CPTopology
    from megatron_burst.megatron.pack_plans import PlanTarget, plan_pack

    topology = CPTopology.build(1, backward="burst")
    target = PlanTarget.of("whole_docs", schedule.Mask(True), topology, None)
    cu = torch.tensor([0, 5, 45, 56, 64], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(64, 1, h, 16, generator=gen, requires_grad=True)
               for h in (4, 2, 2))

    def attend():
        out = mb.burst_attn(q, k, v, None, causal=True, layout="whole_docs",
                            qkv_format="sbhd", cu_seqlens=mb.pack_documents(cu),
                            topology=topology)
        out.sum().backward()
        return out.detach(), q.grad.clone()

    def fresh():
        call_plan.clear()
        packs._PACKS.clear()
        prepare.PREPARED.clear()
        q.grad = None

    fresh()
    at_call = attend()
    fresh()
    calls = plan_pack(mb.pack_documents(cu), target, target.ring()).calls
    assert calls and all(c.varlen for c in calls)
    planned = []
    monkeypatch.setattr(pair_calls, "plan_alone", lambda *a: planned.append(a))
    monkeypatch.setattr(pair_calls, "plan_calls", lambda *a, **k: planned.append(a))
    ahead = attend()
    assert planned == []
    assert torch.equal(ahead[0], at_call[0]) and torch.equal(ahead[1], at_call[1])


def test_a_pack_zigzag_batch_has_one_shape_and_plans_nothing():
    """Layout pack_zigzag: the boundaries padded to the run's capacity (the same shape for
    every batch, which CUDA graphs replay), no pack in the params (it would differ per
    batch), nothing planned; the pack for the FLOPs and the report still described; more
    documents than the capacity raise."""
    from megatron_burst.megatron.document_batches import DocumentBatchMaker

    tokens = torch.tensor([[1, 2, 9, 3, 4, 5, 9, 6]])
    sample = {"tokens": tokens, "labels": tokens, "loss_mask": torch.ones(1, 8)}
    maker = DocumentBatchMaker(9, None, "pack_zigzag", (), None, pin=False, capacity=6)
    batch = maker(sample)
    assert batch.params.pack is None and batch.calls == ()
    assert batch.params.cu_seqlens_q.tolist() == [0, 3, 7, 8, 8, 8, 8]
    assert batch.pack.lens == (3, 4, 1)
    *tensors, params = batch.to_step(torch.device("cpu"))
    assert params.cu_seqlens_q is params.cu_seqlens_kv and params.layout == "pack_zigzag"
    unset = DocumentBatchMaker(9, None, "pack_zigzag", (), None, pin=False)(sample)
    assert unset.params.cu_seqlens_q.tolist() == [0, 3, 7, 8, 8]  # its own power of two
    with pytest.raises(ValueError, match="more than the run's document capacity 2"):
        DocumentBatchMaker(9, None, "pack_zigzag", (), None, pin=False, capacity=2)(sample)


@pytest.mark.parametrize("layout, capacity, refused", [
    ("whole_docs", None, True), ("pack_zigzag", None, True), ("pack_zigzag", 64, False)])
def test_cuda_graphs_take_document_batches_of_one_shape_only(layout, capacity, refused):
    from types import SimpleNamespace

    from megatron_burst.megatron.run_checks import check_cuda_graphs

    args = SimpleNamespace(cuda_graph_impl="local", burst_remat_aware=False,
                           burst_document_capacity=capacity)
    if refused:
        with pytest.raises(ValueError, match="--burst-document-capacity"):
            check_cuda_graphs(args, layout)
    else:
        check_cuda_graphs(args, layout)


def test_cuda_graphs_refuse_the_eager_replay(monkeypatch):
    """MEGATRON_BURST_REPLAY on with --cuda-graph-impl: refused at start-up, naming both,
    not at the capture mid-run (``attention.replay``); off (the default) passes."""
    from types import SimpleNamespace

    from megatron_burst.comm import settings
    from megatron_burst.megatron.run_checks import check_cuda_graphs

    args = SimpleNamespace(cuda_graph_impl="local", burst_remat_aware=False)
    check_cuda_graphs(args, None)
    for mode in ("auto", "on"):
        monkeypatch.setenv(settings.REPLAY_ENV, mode)
        with pytest.raises(ValueError, match=f"{settings.REPLAY_ENV}={mode} with "
                                             f"--cuda-graph-impl local"):
            check_cuda_graphs(args, None)
    args.cuda_graph_impl = "none"
    check_cuda_graphs(args, None)  # no graphs: replay is the user's choice


def test_document_params_survive_megatrons_cuda_graph_mapping():
    """Megatron's CUDA graph runner maps a layer's arguments with its own ``tree_map``, which
    rebuilds a dataclass (``__post_init__`` included) with an ``ArgMetadata`` or a weak
    reference in each tensor's place: DocumentParams must not refuse them (on 2x H100 the
    first graphed document run stopped there)."""
    import weakref

    cuda_graphs = pytest.importorskip("megatron.core.transformer.cuda_graphs")
    from megatron_burst.megatron.documents import document_params

    params = document_params(torch.tensor([0, 3, 8], dtype=torch.int32), "pack_zigzag", 4)
    meta = cuda_graphs.tree_map(
        lambda x: cuda_graphs.ArgMetadata(x) if torch.is_tensor(x) else x, params)
    assert isinstance(meta.cu_seqlens_q, cuda_graphs.ArgMetadata)
    refs = cuda_graphs.tree_map(lambda x: weakref.ref(x) if torch.is_tensor(x) else x, params)
    assert refs.cu_seqlens_q() is params.cu_seqlens_q
    with pytest.raises(ValueError, match="cu_seqlens_q must be a 1-D tensor"):
        document_params(torch.tensor([0, 3, 8]), "pack_zigzag", 4).__class__(
            cu_seqlens_q="0,3,8", layout="pack_zigzag")  # a real bad value still raises
