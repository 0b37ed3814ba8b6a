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


# ------------------------------------------------------------ what training really does

def _loss(model, batch, num_tokens: int, cp: int) -> torch.Tensor:
    """The scaled loss of one micro-batch (as `cm.train_step` forms it), without backward."""
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return (out.float() * batch["loss_mask"]).sum() * cp / num_tokens


def _schedule_grads(cp: int, remat: bool, weights, batches, order) -> dict:
    """Gradients accumulated over ``order``: ('F', i) a micro-batch's forward kept in flight,
    ('B', i) its backward, ('V', i) a forward under no_grad in training mode (a validation
    loss without eval()), ('D', i) a forward whose backward is dropped (a skipped step)."""
    import megatron_burst as mb
    from megatron_burst.megatron.spec import get_llama_layer_burst_spec
    from tests.megatron import cpu_llama as cm

    cm.init_parallel(cp=cp)
    config = cm.tiny_llama_config(harness.SHAPE, recompute="full")
    spec = get_llama_layer_burst_spec(config, use_te=False, remat_aware=remat)
    model = cm.build_gpt(config, spec, harness.SHAPE)
    harness.load_reference_weights(model, weights)
    local = [cm.split_batch_for_cp(b) for b in batches]
    tokens = int(batches[0]["loss_mask"].sum())
    in_flight = {}
    with mb.count_comm() as stats:
        for what, i in order:
            if what == "V":
                with torch.no_grad():
                    _loss(model, local[i], tokens, cp)
            elif what == "D":
                _loss(model, local[i], tokens, cp)  # its graph is dropped here
            elif what == "F":
                in_flight[i] = _loss(model, local[i], tokens, cp)
            else:
                in_flight.pop(i).backward()
    cm.reduce_gradients(model)
    kept = sum(len(layer.self_attention.core_attention.keep or ())
               for layer in model.decoder.layers)
    return dict(grads={n: p.grad.clone() for n, p in model.named_parameters()},
                kept=kept, fwd=stats.forward_bytes)


# 1F1B with three micro-batches in flight, then the interleaved schedule's per-layer order
# (forwards of four before the first backward), with validation passes without eval() and
# forwards whose backward was dropped before, between and after them. What such a pass kept
# stays until the layer's next recompute drops it (the interleaved order's last step).
ORDERS = {
    "1F1B": [("V", 3), ("D", 2), ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
             ("B", 2), ("B", 3)],
    "interleaved": [("F", 0), ("V", 1), ("F", 1), ("D", 0), ("F", 2), ("F", 3), ("B", 0),
                    ("B", 1), ("V", 2), ("B", 2), ("B", 3), ("F", 1), ("B", 1)],
}


def _schedule_worker(rank: int, world: int, order_name: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from tests.megatron import cpu_llama as cm

    batches = [cm.random_batch(harness.SHAPE, seed=s) for s in range(4)]
    weights, _, _ = harness.reference_step(batches[0])
    order = ORDERS[order_name]
    return {name: _schedule_grads(cp, remat, weights, batches, order)
            for name, cp, remat in (("cp1", 1, False), ("cp2", world, False),
                                    ("cp2 remat", world, True))}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_remat_aware_gradients_equal_cp1_whatever_else_ran(order: str):
    """Full recompute + remat-aware at CP=2 under the schedules training runs, with the
    forwards that leave a kept output behind (validation without eval(), a dropped
    backward): the gradients equal CP=1's, and nothing stays kept."""
    for out in run_ranks(2, _schedule_worker, order, timeout=600):
        reference = out["cp1"]["grads"]
        for run in ("cp2", "cp2 remat"):
            for name, grad in reference.items():
                torch.testing.assert_close(out[run]["grads"][name], grad, **TOL,
                                           msg=lambda m: f"{run} {name}: {m}")
        assert out["cp2 remat"]["kept"] == 0
        recomputed = sum(1 for what, _ in ORDERS[order] if what == "B")
        forwards = len(ORDERS[order]) - recomputed
        if order == "1F1B":  # every recompute took its kept output: one ring per forward
            assert out["cp2"]["fwd"] * forwards == out["cp2 remat"]["fwd"] * (forwards + recomputed)
        else:  # six forwards in flight exceed a PP=1 layer's bound (4): some recomputes ran
            # the ring (exact, only slower), and a recompute took the output of an identical
            # forward whose backward was dropped
            assert out["cp2 remat"]["fwd"] < out["cp2"]["fwd"]
