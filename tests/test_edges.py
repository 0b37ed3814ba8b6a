"""Exact at the edges (issue 40): gradients linear in the loss at any scale, a loss on lse
without cancellation, the same backward passes on every rank, bad settings named.

Each case runs on gloo ranks against the float64 single-process reference
(``tests.reference``): the package's own shards, out, lse and every gradient.
"""
from __future__ import annotations

import math

import pytest
import torch

import megatron_burst as mb

from .distributed import run_ranks
from .reference import reference_attention

S, HQ, HKV, D = 32, 4, 2, 16
EXACT, BF16 = 1e-10, 2e-2  # float64 and bf16 tolerances, the README's words too
SCALES = (1e-30, 1e-17, 1e17, 1e30)


def _inputs(dtype, seed=3):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, S, HQ, D, generator=gen, dtype=torch.float64)
    k = torch.randn(1, S, HKV, D, generator=gen, dtype=torch.float64)
    v = torch.randn(1, S, HKV, D, generator=gen, dtype=torch.float64)
    do = torch.randn(1, S, HQ, D, generator=gen, dtype=torch.float64)
    dlse = torch.randn(1, HQ, S, generator=gen, dtype=torch.float64)
    return [t.to(dtype) for t in (q, k, v)], do, dlse


def _reference(q, k, v, do, dlse):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*leaves, causal=True, scale=D ** -0.5)
    loss = (out * do.double()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse.double()).sum()
    loss.backward()
    return [out.detach(), lse.detach()] + [t.grad for t in leaves]


def _ring(rank, world, dtype, backward, do, dlse, **extra):
    """This rank's (out, lse, dq, dk, dv) shards of the ring, fp64 copies."""
    (q, k, v), _, _ = _inputs(dtype)
    local = [mb.shard_seq(t).detach().requires_grad_() for t in (q, k, v)]
    out, lse = mb.burst_attn(*local, causal=True, backward=backward, return_lse=True, **extra)
    loss = (out.double() * mb.shard_seq(do).double()).sum()
    if dlse is not None:
        loss = loss + (lse.double() * mb.shard_seq(dlse, seq_dim=2).double()).sum()
    loss.backward()
    return [t.detach().double() for t in (out, lse, *(x.grad for x in local))]


def _relative(got, want) -> float:
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def _scaled_case(rank, world, backward, scale):
    (q, k, v), do, dlse = _inputs(torch.float64)
    return _ring(rank, world, torch.float64, backward, do * scale, dlse * scale)


@pytest.mark.parametrize("backward", ["burst", "ring"])
def test_gradients_are_linear_in_the_loss_from_1e_minus_30_to_1e_plus_30(backward):
    """Scaling the loss scales every gradient by the same factor, exactly (float64): no
    clamp, no underflow of a squared norm, for the output's and lse's gradients alike."""
    shards = run_ranks(2, _scaled_case, backward, 1.0, timeout=120)
    for scale in SCALES:
        scaled = run_ranks(2, _scaled_case, backward, scale, timeout=120)
        for one, many in zip(shards, scaled):
            for name, a, b in zip(("dq", "dk", "dv"), one[2:], many[2:]):
                assert _relative(b / scale, a) < EXACT, (backward, scale, name)


def _tiny_rows_case(rank, world, backward):
    (q, k, v), do, dlse = _inputs(torch.float64)
    do = do.clone()
    do[:, ::3] *= 1e-20  # tiny, not zero: a squared norm of 1e-40 with a loss on lse
    do[:, 1::3] = 0  # out of the output's loss, in the lse's
    return _ring(rank, world, torch.float64, backward, do, dlse)


@pytest.mark.parametrize("backward", ["burst", "ring"])
def test_rows_with_tiny_or_no_output_gradient_keep_their_lse_gradient(backward):
    (q, k, v), do, dlse = _inputs(torch.float64)
    do = do.clone()
    do[:, ::3] *= 1e-20
    do[:, 1::3] = 0
    ref = _reference(q, k, v, do, dlse)
    got = run_ranks(2, _tiny_rows_case, backward, timeout=120)
    full = [torch.cat([g[i] for g in got], dim=2 if i == 1 else 1) for i in range(5)]
    order = _zigzag_order(2)
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        dim = 2 if i == 1 else 1
        want = ref[i].index_select(dim, order)
        assert _relative(full[i], want) < EXACT, (backward, name)


def _zigzag_order(world: int) -> torch.Tensor:
    """Positions of the concatenated zigzag shards of ``world`` ranks."""
    chunk = S // (2 * world)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk)
                      for r in range(world) for c in (r, 2 * world - 1 - r)])


def _bf16_lse_case(rank, world, backward):
    (q, k, v), do, dlse = _inputs(torch.bfloat16)
    do = (do * 1e-3).clone()
    do[:, 1::2] = 0  # these rows are in the lse's loss only
    return _ring(rank, world, torch.bfloat16, backward, do, dlse)


@pytest.mark.parametrize("backward", ["burst", "ring"])
def test_a_loss_on_lse_in_bf16_does_not_cancel(backward):
    """dv does not depend on lse: a loss on lse with large dlse where dO is zero must leave
    dv as accurate as plain bf16 attention's (it was 79% wrong: a stand-in added and
    subtracted)."""
    (q, k, v), do, dlse = _inputs(torch.bfloat16)
    do = (do * 1e-3).clone()
    do[:, 1::2] = 0
    ref = _reference(q, k, v, do, dlse)
    got = run_ranks(2, _bf16_lse_case, backward, timeout=120)
    order = _zigzag_order(2)
    for i, name in ((2, "dq"), (3, "dk"), (4, "dv")):
        full = torch.cat([g[i] for g in got], dim=1)
        err = _relative(full, ref[i].index_select(1, order))
        assert err < BF16, (backward, name, err)


def _one_rank_lse_loss(rank, world, backward, extra):
    (q, k, v), do, dlse = _inputs(torch.float64)
    return _ring(rank, world, torch.float64, backward, do, dlse if rank == 0 else None,
                 **extra)


@pytest.mark.parametrize("backward,extra", [("burst", {}), ("ring", {}),
                                            ("burst", {"ulysses_size": 2}),
                                            ("ring", {"ulysses_size": 2})])
def test_lse_in_one_rank_s_loss_only_runs_the_same_passes_everywhere(backward, extra):
    """Rank 0's loss uses lse, rank 1's does not: both backwards finish at once (the same
    passes on every rank, the Ulysses all-to-alls of out and lse too) with the gradients of
    that loss."""
    (q, k, v), do, dlse = _inputs(torch.float64)
    order = _zigzag_order(2)
    half = S // 2
    mine = torch.zeros_like(dlse)
    shard0 = order[:half]
    mine[:, :, shard0] = dlse[:, :, shard0]  # the lse gradient of rank 0's rows only
    ref = _reference(q, k, v, do, mine)
    got = run_ranks(2, _one_rank_lse_loss, backward, extra, timeout=60)
    for i, name in ((2, "dq"), (3, "dk"), (4, "dv")):
        full = torch.cat([g[i] for g in got], dim=1)
        assert _relative(full, ref[i].index_select(1, order)) < EXACT, (backward, name)


@pytest.mark.parametrize("raw", ["inf", "1e20", "nan", "-1", "0", "soon"])
def test_a_timeout_setting_that_cannot_be_honoured_is_named(raw, monkeypatch):
    from megatron_burst.comm import waits

    monkeypatch.setenv(waits.TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=waits.TIMEOUT_ENV):
        waits.timeout_s()
    monkeypatch.setenv(waits.TIMEOUT_ENV, "3600")
    assert waits.timeout_s() == 3600.0
    assert math.isfinite(waits.timeout_s())


# ------------------------------------------------------------------ shard_seq and unshard_seq

def _unshard_case(rank, world, replicated):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 20, 3, generator=gen, dtype=torch.float64)  # seq_dim -2
    weights = torch.randn(world, *x.shape, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 5, 13, 20])
    local = mb.shard_seq(x, layout="whole_docs", seq_dim=-2, cu_seqlens=cu).requires_grad_()
    full = mb.unshard_seq(local, layout="whole_docs", seq_dim=-2, cu_seqlens=cu)
    w = weights[0] if replicated else weights[rank]
    (full * w).sum().backward()
    return full.shape, torch.equal(full, x), local.grad, mb.shard_seq(
        weights[0] if replicated else weights.sum(0), layout="whole_docs", seq_dim=-2,
        cu_seqlens=cu)


def test_unshard_seq_takes_a_negative_seq_dim_with_documents():
    for shape, same, _, _ in run_ranks(2, _unshard_case, False, timeout=60):
        assert shape == (1, 2, 20, 3) and same


def test_unshard_seq_gives_the_gradient_of_the_sum_of_the_ranks_losses():
    """Each rank's own loss: the gradient of their sum, exactly. A loss replicated on every
    rank counts once per rank (world times), as the module docstring says."""
    for _, _, grad, want in run_ranks(2, _unshard_case, False, timeout=60):
        assert torch.allclose(grad, want, rtol=1e-12, atol=1e-12)
    for _, _, grad, want in run_ranks(2, _unshard_case, True, timeout=60):
        assert torch.allclose(grad, 2 * want, rtol=1e-12, atol=1e-12)


def test_a_seq_dim_outside_the_tensor_is_named():
    with pytest.raises(ValueError, match="seq_dim"):
        mb.shard_seq(torch.zeros(1, 8, 2), seq_dim=3)
    with pytest.raises(ValueError, match="seq_dim"):
        mb.unshard_seq(torch.zeros(1, 8, 2), seq_dim=-4)


# ------------------------------------------------------------------ calls with no tokens

def _empty_case(rank, world):
    shapes = {"empty pack": ((1, 0), dict(cu_seqlens=torch.tensor([0, 0, 0]),
                                         layout="whole_docs")),
              "batch 0": ((0, 8), dict(causal=True))}
    got = {}
    for name, (lead, kwargs) in shapes.items():
        q, k, v = (torch.randn(*lead, h, 8, requires_grad=True) for h in (4, 2, 2))
        out = mb.burst_attn(q, k, v, **kwargs)  # backward 'auto': nothing to time
        out.sum().backward()
        got[name] = (tuple(out.shape), tuple(q.grad.shape), tuple(k.grad.shape))
    return got


def test_a_call_with_no_tokens_returns_the_empty_result():
    for got in run_ranks(2, _empty_case, timeout=60):
        assert got == {"empty pack": ((1, 0, 4, 8), (1, 0, 4, 8), (1, 0, 2, 8)),
                       "batch 0": ((0, 8, 4, 8), (0, 8, 4, 8), (0, 8, 2, 8))}


# ------------------------------------------------------------------ settings the ranks share

def _modes_case(rank, world):
    import os
    import time

    os.environ["MEGATRON_BURST_AGREE"] = "off" if rank == 0 else "first"
    os.environ["MEGATRON_BURST_TIMEOUT_S"] = "30"
    q, k, v = (torch.randn(1, 8, h, 8) for h in (4, 2, 2))
    start = time.monotonic()
    try:
        mb.burst_attn(q, k, v, causal=True, backward="ring")
        return "no error", time.monotonic() - start
    except ValueError as e:
        return str(e), time.monotonic() - start


def test_ranks_with_other_agreement_modes_get_one_error_at_once():
    outcomes = run_ranks(2, _modes_case, timeout=120)
    assert len({o for o, _ in outcomes}) == 1, outcomes
    said, _ = outcomes[0]
    assert "MEGATRON_BURST_AGREE differs" in said and "'off'" in said, said
    assert all(t < 10 for _, t in outcomes), outcomes


# ------------------------------------------------------------------ a head without a sink

def _sink_case(rank, world):
    gen = torch.Generator().manual_seed(8)
    lens = (5, 7)
    full = [torch.randn(1, sum(lens), h, 8, generator=gen, dtype=torch.float64)
            for h in (4, 2, 2, 4)]
    cu = torch.tensor([0, 5, 12])
    local = [mb.shard_seq(t, cu_seqlens=cu).requires_grad_() for t in full[:3]]
    sinks = torch.tensor([0.5, float("-inf"), 1.0, -0.3], dtype=torch.float64,
                         requires_grad=True)
    out, lse = mb.burst_attn(*local, causal=True, cu_seqlens=cu, sinks=sinks,
                             return_lse=True)
    (out * mb.shard_seq(full[3], cu_seqlens=cu)).sum().backward()
    gathered = [mb.unshard_seq(t.detach(), cu_seqlens=cu) for t in
                (out, local[0].grad, local[1].grad, local[2].grad)]
    return ([t.tolist() for t in gathered], sinks.grad.tolist(),
            bool(torch.isnan(lse).any() or torch.isnan(out).any()))


def test_a_head_without_a_sink_gives_no_nan_where_rows_are_padding():
    """A sink logit of -inf (a head without one) beside padding rows (zigzag documents are
    padded to 2 x CP): out, lse and every gradient, the sinks' too, as float64 says."""
    gen = torch.Generator().manual_seed(8)
    full = [torch.randn(1, 12, h, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2, 4)]
    leaves = [t.clone().requires_grad_() for t in full[:3]]
    sinks = torch.tensor([0.5, float("-inf"), 1.0, -0.3], dtype=torch.float64,
                         requires_grad=True)
    doc_ids = torch.tensor([0] * 5 + [1] * 7)
    out, _ = reference_attention(*leaves, causal=True, scale=8 ** -0.5, doc_ids=doc_ids,
                                 sinks=sinks)
    (out * full[3]).sum().backward()
    results = run_ranks(2, _sink_case, timeout=60)
    for tensors, _, nan_lse in results:
        assert not nan_lse
        for got, want in zip(tensors, (out, *(t.grad for t in leaves))):
            assert _relative(torch.tensor(got, dtype=torch.float64), want.detach()) < EXACT
    sink_grad = sum(torch.tensor(g, dtype=torch.float64) for _, g, _ in results)  # per rank
    assert not torch.isnan(sink_grad).any() and sink_grad[1] == 0
    assert _relative(sink_grad, sinks.grad) < EXACT


# ------------------------------------------------------------------ second-order gradients

def _second_order_case(rank, world, kernel):
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 8, h, 8, generator=gen, dtype=torch.float64,
                           requires_grad=True) for h in (4, 2, 2))
    out = mb.burst_attn(q, k, v, causal=True, kernel=kernel, backward="ring")
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    try:
        grad_q.sum().backward()
        return "no error"
    except RuntimeError as e:
        return str(e)


@pytest.mark.parametrize("kernel", ["reference", None])
def test_a_second_order_gradient_raises_with_every_kernel(kernel):
    """The ring's messages have no derivative: differentiating its backward raises (with the
    reference kernel, whose ops autograd could record, it was silently 40-75% wrong)."""
    for said in run_ranks(2, _second_order_case, kernel, timeout=60):
        assert "differentiate" in said or "twice" in said, said


def test_the_readme_states_these_tests_bounds():
    from .readme import says

    words = f"scaling the loss by {min(SCALES):g} to {max(SCALES):g}".replace("e+", "e")
    says(f"{words} scales every gradient by the same factor (float64, {EXACT:g})")
    says(f"dv at plain bf16 accuracy, within {BF16:.0e}".replace("e-0", "e-"))
