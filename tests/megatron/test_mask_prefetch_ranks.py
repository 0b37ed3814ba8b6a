"""Mask-builder batches made ahead, in megatron-core's GPTModel on 2 CPU gloo ranks (CP=2).

Through ``entry.mask_batch`` and Megatron's RerunDataIterator, as in training, with the
shared-question builder (a new mask every pack): the same losses and gradients with the
batches made ahead on the background thread and made on the step
($MEGATRON_BURST_PREFETCH=0); made ahead, the step's thread builds one plan only, the first
batch's (the first mask its call shape sees plans as a fixed mask; the data path plans the
shape-free key every later call uses), where made on the step it plans them all; a builder
that fails on one rank raises the same error on both, at that batch; a mask equal to the
batch before's is not planned again; no thread is left after close.
"""
from __future__ import annotations

import threading
import types

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402
from tests.megatron.harness import packed_batch  # noqa: E402
from tests.megatron.test_prefetch_ranks import _tokenizer_stub  # noqa: E402

PACKS = (((5, 40, 11, 8), 3), ((9, 30, 6, 19), 4), ((12, 2, 39, 11), 5), ((20, 44), 6))
BUILDER = "megatron_burst.megatron.mask_batches:shared_question"
FLAKY = "tests.megatron.test_mask_prefetch_ranks:flaky_builder"


def flaky_builder(batch):
    """The shared-question mask, except on rank 1 for the third pack: an error there."""
    import torch.distributed as dist

    from megatron_burst.megatron import mask_batches

    if dist.get_rank() == 1 and int(batch["tokens"][0, 0]) == int(_third_first_token()):
        raise ValueError("the builder failed on this batch")
    return mask_batches.shared_question(batch)


def _third_first_token() -> int:
    return int(packed_batch(*PACKS[2])["tokens"][0, 0])


def _setup(weights):
    from megatron_burst.decide.topology import CPTopology
    from megatron_burst.megatron import burst_run, entry
    from megatron_burst.megatron.document_model import as_document_model
    from tests.megatron import cpu_llama as cm

    topology = CPTopology.build(2, backward="burst")
    cm.init_parallel(cp=2)
    model = cm.build_tiny_llama(harness.SHAPE, spec_kwargs={"topology": topology})
    harness.load_reference_weights(model, weights)
    burst_run._CONFIGURED[:] = [entry.BurstRun(topology, None, mask_builder=BUILDER)]
    return as_document_model(model)


def _fresh() -> None:
    """Every cache a call's plan goes through emptied: each run plans as a new process."""
    import megatron_burst.attention.call_plan as call_plan
    import megatron_burst.attention.prepare as prepare
    from megatron_burst.attention import varying_masks

    call_plan.clear()
    prepare.PREPARED.clear()
    varying_masks.clear()


def _steps(model, builder: str, samples) -> tuple[list, int]:
    """(loss and gradients of each sample through entry.mask_batch, plans built on the
    step's own thread)."""
    from unittest import mock

    from megatron.core import rerun_state_machine as rsm

    import megatron_burst.attention.call_plan as call_plan
    from megatron_burst.megatron import entry, prefetch
    from tests.megatron import cpu_llama as cm

    _fresh()
    me, built = threading.current_thread(), []
    real = call_plan.build_plan

    def counting(key):
        built.append(threading.current_thread() is me)
        return real(key)

    args = types.SimpleNamespace(burst_mask_builder=builder)
    data = rsm.RerunDataIterator(iter(samples))
    out = []
    with mock.patch.object(call_plan, "build_plan", counting):
        for sample in samples:
            tokens, labels, loss_mask, positions, params = entry.mask_batch(data, args)
            batch = dict(tokens=tokens, labels=labels, loss_mask=loss_mask,
                         position_ids=positions, packed_seq_params=params)
            loss = cm.train_step(model, batch, num_tokens=int(sample["loss_mask"].sum()))
            out.append((float(loss), harness.gather_full_grads(model)))
    prefetch.close_all()
    return out, sum(built)


def _failing(model) -> tuple[str, int]:
    from megatron.core import rerun_state_machine as rsm

    from megatron_burst.megatron import entry

    samples = [packed_batch(lens, seed) for lens, seed in PACKS]
    data = rsm.RerunDataIterator(iter(samples))
    args = types.SimpleNamespace(burst_mask_builder=FLAKY)
    taken = 0
    try:
        for _ in samples:
            entry.mask_batch(data, args)
            taken += 1
    except ValueError as err:
        return str(err), taken
    return "no error", taken


def _repeated_mask_plans_once() -> list[int]:
    """Calls planned by a maker for each of three samples whose mask is the same."""
    from megatron_burst.decide.topology import CPTopology
    from megatron_burst.megatron import mask_batches
    from megatron_burst.megatron.mask_batch_maker import MaskBatchMaker, mask_targets

    targets = mask_targets("area", CPTopology.build(2, backward="burst"), None)
    maker = MaskBatchMaker(mask_batches.prefix_lm, harness.EOD, None, targets, pin=False)
    sample = packed_batch(*PACKS[0])
    other = packed_batch(*PACKS[1])
    return [len(maker(s).calls) for s in (sample, sample, other)]


def _cases(rank: int, world: int) -> dict:
    import pickle
    import warnings

    warnings.filterwarnings("ignore")
    _tokenizer_stub()

    weights = {k: v.detach().clone() for k, v in harness.reference_model().state_dict().items()
               if torch.is_tensor(v)}
    model = _setup(weights)
    samples = [packed_batch(lens, seed) for lens, seed in PACKS]
    out = {}
    out["ahead"], out["built_ahead"] = _steps(model, BUILDER, samples)
    with harness.prefetch_off():
        out["on_step"], out["built_on_step"] = _steps(model, BUILDER, samples)
    out["failing"] = _failing(model)
    out["repeated"] = _repeated_mask_plans_once()
    from megatron_burst.megatron.run_batches import _MASK_MAKERS

    made = _MASK_MAKERS[0][2](samples[0])
    out["pickled"] = type(pickle.loads(pickle.dumps(made))).__name__
    out["threads_left"] = harness.closed_prefetch()
    return out


@pytest.fixture(scope="module")
def ranks() -> list:
    return run_ranks(2, _cases, timeout=600)


def test_made_ahead_or_on_the_step_the_losses_and_grads_are_the_same(ranks):
    for r in ranks:
        harness.assert_same_steps(r["ahead"], r["on_step"], len(PACKS))


def test_made_ahead_the_step_thread_plans_only_the_first_batch(ranks):
    for r in ranks:
        assert r["built_ahead"] == 1
        assert r["built_on_step"] >= len(PACKS), r["built_on_step"]


def test_a_builder_that_fails_on_one_rank_raises_on_both_at_that_batch(ranks):
    for r in ranks:
        said, taken = r["failing"]
        assert taken == 2, said
        assert "rank 1" in said and "the builder failed on this batch" in said, said


def test_a_mask_equal_to_the_batch_befores_is_not_planned_again(ranks):
    for r in ranks:
        first, again, other = r["repeated"]
        assert first > 0 and again == 0 and other > 0


def test_a_made_batch_pickles_as_its_sample_and_no_thread_is_left(ranks):
    assert [r["pickled"] for r in ranks] == ["dict", "dict"]
    assert [r["threads_left"] for r in ranks] == [[], []]
