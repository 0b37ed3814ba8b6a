"""Document batches made ahead, in megatron-core's GPTModel on 2 CPU gloo ranks (CP=2).

Through ``entry.document_batch`` and Megatron's RerunDataIterator, as in training: the same
losses and gradients with the batches made ahead on the background thread and made on the
step ($MEGATRON_BURST_PREFETCH=0); with prefetch the step's thread plans nothing (every
layer and the backward use the plans made ahead); the run's plan targets are its layers';
a batch that fails on one rank raises the same error on both, at that batch; a data
iterator that ends on one rank only is an error on both; no thread is left after close.
"""
from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402
from tests.megatron.harness import EOD, packed_batch  # noqa: E402

PACKS = (((5, 40, 11, 8), 3), ((9, 30, 6, 19), 4), ((1, 2, 50, 11), 5), ((64,), 6))


def targets_of_model(model, layout: str):
    """The targets a built model's BurstAttention layers call with (to check ``pack_plans.targets_from_args``)."""
    from megatron_burst.megatron import masks
    from megatron_burst.megatron.attention import BurstDotProductAttention
    from megatron_burst.megatron.pack_plans import PlanTarget
    from megatron_burst.plan.schedule import Mask

    found = {PlanTarget.of(layout, Mask(masks.is_causal(m.attn_mask_type), m.window_size),
                           m.topology, m.cp_group)
             for m in model.modules()
             if isinstance(m, BurstDotProductAttention) and m.topology is not None}
    return tuple(sorted(found, key=lambda t: t.mask.window))


def _tokenizer_stub() -> None:
    """megatron.training's get_tokenizer, for entry.document_batch (the 0.16 wheel has no
    megatron.training; a test rank needs only the EOD token)."""
    tokenizer = types.SimpleNamespace(eod=EOD)
    try:
        import megatron.training as training
    except ImportError:
        training = types.ModuleType("megatron.training")
        sys.modules["megatron.training"] = training
    training.get_tokenizer = lambda: tokenizer


def _args():
    s = harness.SHAPE
    return types.SimpleNamespace(
        burst_document_layout="whole_docs", num_layers=s.num_layers, hidden_size=s.hidden_size,
        ffn_hidden_size=s.ffn_hidden_size, num_attention_heads=s.num_heads,
        group_query_attention=True, num_query_groups=s.num_kv_heads, kv_channels=None,
        padded_vocab_size=s.vocab_size, swiglu=True, seq_length=s.seq_length,
        recompute_granularity=None, window_size=None, window_attn_skip_freq=None)


def _setup(weights):
    from megatron.core import parallel_state

    from megatron_burst.decide.topology import CPTopology
    from megatron_burst.megatron import burst_run, entry
    from megatron_burst.megatron.document_model import as_document_model
    from megatron_burst.megatron.pack_plans import targets_from_args
    from megatron_burst.megatron.run_flops import layer_windows

    from tests.megatron import cpu_llama as cm

    # The run's topology, handed to every layer by the spec as the entry point does.
    topology = CPTopology.build(2, backward="burst")
    cm.init_parallel(cp=2)
    model = cm.build_tiny_llama(harness.SHAPE, spec_kwargs={"topology": topology})
    harness.load_reference_weights(model, weights)
    model = as_document_model(model)
    burst_run._CONFIGURED[:] = [entry.BurstRun(topology, "whole_docs")]
    args = _args()
    group = parallel_state.get_context_parallel_group()
    from_args = targets_from_args("whole_docs", layer_windows(args), topology, group)
    same_targets = len(from_args) == 1 and from_args == targets_of_model(model, "whole_docs")
    return model, args, same_targets


def _steps(model, args, samples, after_step=None) -> list:
    """Loss and gradients of each sample, taken through entry.document_batch."""
    from megatron.core import rerun_state_machine as rsm

    from megatron_burst.megatron import entry
    from tests.megatron import cpu_llama as cm

    data = rsm.RerunDataIterator(iter(samples))
    out = []
    for i in range(len(samples)):
        tokens, labels, loss_mask, positions, params = entry.document_batch(data, args)
        batch = dict(tokens=tokens, labels=labels, loss_mask=loss_mask, position_ids=positions,
                     packed_seq_params=params)
        loss = cm.train_step(model, batch, num_tokens=int(samples[i]["loss_mask"].sum()))
        out.append((float(loss), harness.gather_full_grads(model)))
        if after_step is not None:
            after_step(i)
    return out


def _planned_during_steps(model, args, samples) -> list:
    """Step i does not end until the pack of batch i+2 is planned (its kernel calls made):
    True for each step where that happened, on the prefetch thread, in time."""
    from unittest import mock

    from megatron_burst.megatron import document_batches, prefetch

    planned = {}  # document lengths -> (event, the planning thread's name)
    real = document_batches.plan_pack

    def recording(pack, target, ring):
        calls = real(pack, target, ring)
        entry = planned.setdefault(pack.lens, [threading.Event(), None])
        entry[1] = threading.current_thread().name
        entry[0].set()
        return calls

    seen = []

    def after_step(i):
        if i + 2 < len(PACKS):
            entry = planned.setdefault(PACKS[i + 2][0], [threading.Event(), None])
            seen.append(entry[0].wait(timeout=60)
                        and entry[1].startswith(prefetch.THREAD_PREFIX))

    with mock.patch.object(document_batches, "plan_pack", recording):
        _steps(model, args, samples, after_step)
    return seen


def _planned_on_this_thread(model, args, samples) -> list:
    """Planning calls made by the step's thread (taking the batch and the step together),
    every cache of plans emptied first so that each pack is planned anew."""
    import megatron_burst.attention.prepare as prepare
    import megatron_burst.plan.packs as packs
    import megatron_burst.plan.placement as placement
    import megatron_burst.attention.call_plan as call_plan

    placement.placement.cache_clear()
    call_plan.clear()
    packs._PACKS.clear()
    prepare.PREPARED.clear()

    me = threading.current_thread()
    seen = {"placements": 0, "pair_blocks": 0, "call_plans": 0}
    with harness.counting_plans(seen, lambda: threading.current_thread() is me):
        _steps(model, args, samples)
    return [seen]


def _failing_cases(rank: int, model, args) -> dict:
    """A batch broken on rank 1 only, and data that ends early on rank 1 only."""
    from megatron.core import rerun_state_machine as rsm

    from megatron_burst.megatron import entry

    out = {}
    good = [packed_batch(lens, seed) for lens, seed in PACKS[:3]]
    broken = {k: v.expand(2, -1) for k, v in good[2].items()}  # two sequences: refused
    for case, samples in (("broken", good[:2] + [broken if rank == 1 else good[2]]),
                          ("short", good[:2] if rank == 1 else good)):
        data = rsm.RerunDataIterator(iter(samples))
        taken = []
        try:
            for _ in range(3):
                entry.document_batch(data, args)
                taken.append(True)
            out[case] = ("no error", len(taken))
        except ValueError as err:
            out[case] = (str(err), len(taken))
    return out


def _cases(rank: int, world: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    _tokenizer_stub()

    weights = {k: v.detach().clone() for k, v in harness.reference_model().state_dict().items()
               if torch.is_tensor(v)}
    model, args, same_targets = _setup(weights)
    samples = [packed_batch(lens, seed) for lens, seed in PACKS]
    out = {"same_targets": same_targets}
    out["ahead"] = _steps(model, args, samples)
    out["planned_ahead"] = _planned_on_this_thread(model, args, samples)
    out["planned_during_steps"] = _planned_during_steps(model, args, samples)
    with harness.prefetch_off():
        out["on_step"] = _steps(model, args, samples)
        out["planned_on_step"] = _planned_on_this_thread(model, args, samples)
    out["failing"] = _failing_cases(rank, model, args)
    out["threads_left"] = harness.closed_prefetch()
    return out


@pytest.fixture(scope="module")
def ranks() -> list:
    return run_ranks(2, _cases, timeout=600)


def test_the_run_plans_for_the_targets_its_layers_call(ranks):
    assert [r["same_targets"] for r in ranks] == [True, True]


def test_made_ahead_or_on_the_step_the_losses_and_grads_are_the_same(ranks):
    for r in ranks:
        harness.assert_same_steps(r["ahead"], r["on_step"], len(PACKS))


def test_the_pack_after_next_is_planned_while_the_step_runs(ranks):
    for r in ranks:
        assert r["planned_during_steps"] == [True] * (len(PACKS) - 2)


def test_with_prefetch_the_step_thread_plans_nothing(ranks):
    for r in ranks:
        assert r["planned_ahead"] == [{"placements": 0, "pair_blocks": 0, "call_plans": 0}]
        on_step = r["planned_on_step"][0]
        assert on_step["placements"] > 0 and on_step["pair_blocks"] > 0 \
            and on_step["call_plans"] > 0, on_step


def test_a_batch_that_failed_on_one_rank_raises_on_both_at_that_batch(ranks):
    for r in ranks:
        said, taken = r["failing"]["broken"]
        assert taken == 2, said
        assert "rank 1" in said and "one packed sequence per micro batch" in said, said


def test_data_that_ends_on_one_rank_only_is_an_error_on_both(ranks):
    for r in ranks:
        said, taken = r["failing"]["short"]
        assert taken == 2 and "ended here while other ranks still had batches" in said, said


def test_no_prefetch_thread_is_left(ranks):
    assert [r["threads_left"] for r in ranks] == [[], []]
