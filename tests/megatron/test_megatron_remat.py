"""Remat-aware recompute on megatron-core's GPTModel (CPU, gloo): under full recompute, keeping
attention's output from the first forward gives the same loss and gradients while the
attention ring's forward runs once per layer and step instead of twice."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)


def _step(weights, batch, cp: int, tp: int, remat: bool, pp: int = 1) -> dict:
    import megatron_burst as mb
    from megatron_burst.megatron.spec import get_llama_layer_burst_spec
    from tests.megatron import cpu_llama as cm

    cm.init_parallel(tp=tp, cp=cp, pp=pp)
    config = cm.tiny_llama_config(harness.SHAPE, recompute="full",
                                  sequence_parallel=tp > 1)
    spec = get_llama_layer_burst_spec(config, use_te=False, remat_aware=remat)  # spec params
    model = cm.build_gpt(config, spec, harness.SHAPE)
    harness.load_reference_weights(model, weights)
    with mb.count_comm() as stats:
        loss = cm.train_step(model, cm.split_batch_for_cp(batch),
                             num_tokens=int(batch["loss_mask"].sum()))
    kept = sum(len(layer.self_attention.core_attention.keep or ())
               for layer in model.decoder.layers)
    grads = harness.gather_full_grads(model)  # a TP collective: every rank takes part
    grads = grads if harness.reports_here() else None
    return dict(loss=float(loss), grads=grads, kept=kept, fwd=stats.forward_bytes,
                bwd=stats.backward_bytes)


def _remat_worker(rank: int, world: int, tp: int, pp: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from tests.megatron import cpu_llama as cm

    batch = cm.random_batch(harness.SHAPE)
    weights, _, _ = harness.reference_step(batch)
    return {remat: _step(weights, batch, cp=2, tp=tp, remat=remat, pp=pp)
            for remat in (False, True)}


# CP=2; TP2 x CP2 with sequence parallelism; PP2 x CP2 (1F1B: recomputes in forward order).
@pytest.mark.parametrize("world, tp, pp", [(2, 1, 1), (4, 2, 1), (4, 1, 2)])
def test_remat_aware_recompute_keeps_the_numbers_and_halves_the_forward_ring(world, tp, pp):
    for out in run_ranks(world, _remat_worker, tp, pp, timeout=600):
        plain, remat = out[False], out[True]
        torch.testing.assert_close(remat["loss"], plain["loss"], **TOL)
        for name, grad in (plain["grads"] or {}).items():
            torch.testing.assert_close(remat["grads"][name], grad, **TOL,
                                       msg=lambda m: f"{name}: {m}")
        # Full recompute ran every layer's forward twice: the ring's forward bytes twice.
        assert plain["fwd"] > 0 and remat["fwd"] * 2 == plain["fwd"]
        assert remat["bwd"] == plain["bwd"]
        assert remat["kept"] == 0, "every kept output was taken by its recompute"
