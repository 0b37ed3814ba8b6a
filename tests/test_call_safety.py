"""No silent wrong answer on a fast path: forced kernels, kept outputs, Ulysses headers, lse
gradients, document packs and options given explicitly.

Each case was a wrong number without an error before the call became one checked value
(``call.BurstCall``), kernels said what they run, caches were keyed by value and every
transport carried its call's header. Every result is compared with the float64 reference
(out, lse and every gradient) or must raise ValueError, on every rank.
"""
from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as ckpt

import megatron_burst as mb
from megatron_burst.decide.topology import CPTopology, HeadShape
from megatron_burst.kernels.protocol import Capabilities, FLOATS
from megatron_burst.kernels.reference import ReferenceAttention
from megatron_burst.decide.options import BurstOptions, OptionError
from megatron_burst.attention.remat import AttentionKeep
from megatron_burst.plan.schedule import Block

from .distributed import run_ranks
from .reference import reference_attention


def _inputs(seed: int, s: int, hq: int = 4, hkv: int = 2, d: int = 16, b: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv)]


def _doc_ids(lens) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))


def _reference(q, k, v, *, causal, window=(-1, -1), lens=None, loss):
    """(out, lse, dq, dk, dv) in float64 for ``loss(out, lse)``."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*leaves, causal=causal, scale=q.shape[-1] ** -0.5,
                                   window=window, doc_ids=None if lens is None else _doc_ids(lens))
    loss(out, lse).backward()
    return out.detach(), lse.detach(), *(torch.zeros_like(t) if t.grad is None else t.grad
                                         for t in leaves)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error (absolute where the reference is zero, as dv is for a loss on lse)."""
    got, ref = got.detach().double(), ref.double()
    if torch.isnan(got).any():
        return float("nan")
    return float((got - ref).norm() / ref.norm().clamp_min(1.0 if ref.norm() == 0 else 1e-300))


def _check(got: tuple, ref: tuple, tol: float, what: str) -> None:
    for name, g, r in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        err = _rel(g, r)
        assert err <= tol, f"{what}: {name} rel err {err:.3g}"  # NaN fails too


def _one_rank(q, k, v, *, loss, **kwargs):
    """burst_attn on one process: (out, lse, dq, dk, dv)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = mb.burst_attn(*leaves, return_lse=True, **kwargs)
    loss(out, lse).backward()
    return out.detach(), lse.detach(), *(t.grad for t in leaves)


def _plain(out, lse):
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    return (out * weights).sum()


# ------------------------------------------------------------ 1. kernels forced by name

MASKS = {"full": dict(causal=False), "causal": dict(causal=True),
         "band": dict(causal=True, window_size=(5, 0)),
         "two-sided band": dict(causal=False, window_size=(3, 6)),
         "documents": dict(causal=True, lens=(7, 1, 12, 12))}


@pytest.mark.parametrize("kernel", ["reference", "cpu-flash"])
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_every_cpu_kernel_forced_runs_every_block_kind(kernel: str, mask: str) -> None:
    opts = dict(MASKS[mask])
    lens = opts.pop("lens", None)
    q, k, v = _inputs(3, sum(lens) if lens else 24)
    cu = None if lens is None else torch.tensor([0, *itertools.accumulate(lens)])
    ref = _reference(q, k, v, causal=opts["causal"], window=opts.get("window_size", (-1, -1)),
                     lens=lens, loss=_plain)
    got = _one_rank(q, k, v, loss=_plain, kernel=kernel, cu_seqlens=cu,
                    layout="whole_docs" if lens else "zigzag", **opts)
    _check(got, ref, 1e-10, f"{kernel} {mask}")


@pytest.mark.parametrize("kernel", ["cudnn", "torch-flash", "flash-attn"])
def test_a_cuda_kernel_forced_on_cpu_tensors_is_refused_by_name(kernel: str) -> None:
    q, k, v = (t.float() for t in _inputs(0, 16))
    with pytest.raises(ValueError, match=f"kernel='{kernel}'"):
        mb.burst_attn(q, k, v, causal=True, kernel=kernel)


class _NoBand(ReferenceAttention):
    name = "no-band"
    capabilities = Capabilities(devices=frozenset({"cpu"}), dtypes=FLOATS,
                                kinds=frozenset({"full", "causal"}))


def test_a_kernel_is_refused_the_blocks_it_cannot_run(monkeypatch) -> None:
    """A kernel without windows, forced, raises on a windowed call naming kernel and block
    (what cuDNN did wrong on a GPU: it computed causal attention instead)."""
    from megatron_burst.kernels import selection

    monkeypatch.setitem(selection.KERNELS, "reference", _NoBand)
    monkeypatch.setattr(selection, "_CHECKED", type(selection._CHECKED)())  # not the real one
    q, k, v = _inputs(1, 32)
    assert mb.burst_attn(q, k, v, causal=True, kernel="reference").shape == q.shape
    with pytest.raises(ValueError, match=r"kernel='reference' runs \['causal', 'full'\] "
                                         r"blocks, not band"):
        mb.burst_attn(q, k, v, causal=True, window_size=(7, 0), kernel="reference")
    caps = Capabilities(devices=frozenset({"cuda"}), dtypes=FLOATS, min_side=2)
    assert "at least 2 rows" in caps.block_refusal(Block(0, 1, 0, 1, "full"))
    assert "not on cpu" in caps.tensor_refusal("cpu", torch.float32, 64)


def refuse_worker(rank: int, world: int) -> list[str]:
    q, k, v = (t.float() for t in _inputs(rank, 8))
    seen = []
    for kernel in ("cudnn", "cpu-flash"):
        try:  # rank 1 forces a kernel that cannot run here: every rank hears of it at once
            mb.burst_attn(q, k, v, causal=True, kernel=kernel if rank == 1 else None)
            seen.append("no error")
        except ValueError as e:
            seen.append(str(e))
    return seen


def test_a_refused_kernel_fails_every_rank_before_the_ring() -> None:
    cudnn, cpu_flash = zip(*run_ranks(2, refuse_worker, timeout=120))
    assert len(set(cudnn)) == 1 and "failed on rank 1" in cudnn[0], cudnn
    assert "kernel='cudnn' runs on ['cuda'], not on cpu tensors" in cudnn[0]
    assert cpu_flash[0] != "no error" and len(set(cpu_flash)) == 1  # kernel is signed too


# ------------------------------------------------------------ 2. kept outputs


def _layer(keep, **kw):
    """One attention 'layer' under a reentrant checkpoint (Megatron's full recompute): its
    first forward runs without autograd and keeps; the backward's recompute takes."""
    def attend(q, k, v):
        return mb.burst_attn(q, k, v, causal=True, keep=keep, **kw)
    return lambda q, k, v: ckpt.checkpoint(attend, q, k, v, use_reentrant=True)


def _square(out, _lse=None):
    """A loss whose gradient is the same elementwise rule on a shard and on the whole."""
    return out.square().sum() * 0.5


def _grads_of(fn, q, k, v):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    _square(out).backward()
    return out.detach(), *(t.grad for t in leaves)


def _ref_grads(q, k, v):
    out, _, *grads = _reference(q, k, v, causal=True, loss=_square)
    return out, *grads


def keep_worker(rank: int, world: int) -> dict:
    from megatron_burst.attention.sharding import shard_seq

    s, results = 16 * world, {}
    a, b, c = ([shard_seq(t, layout="zigzag", seq_dim=1) for t in _inputs(seed, s)]
               for seed in (11, 12, 13))
    full = {name: _inputs(seed, s) for name, seed in (("a", 11), ("b", 12), ("c", 13))}

    def check(name, got, inputs):
        ref = [shard_seq(t, layout="zigzag", seq_dim=1) for t in _ref_grads(*inputs)]
        results[name] = max(_rel(g, r) for g, r in zip(got, ref))

    keep = AttentionKeep(limit=4)
    layer = _layer(keep)
    with torch.no_grad():  # a validation pass without eval(): nothing will recompute it
        mb.burst_attn(*a, causal=True, keep=keep)
    check("after a no-grad forward", _grads_of(layer, *b), full["b"])
    leaves = [t.clone().requires_grad_() for t in a]
    layer(*leaves)  # a forward whose backward is dropped (a skipped non-finite loss)
    check("after a dropped backward", _grads_of(layer, *c), full["c"])
    # 1F1B: two micro-batches in flight, backwards in forward order.
    first = [t.clone().requires_grad_() for t in a]
    second = [t.clone().requires_grad_() for t in b]
    out1, out2 = layer(*first), layer(*second)
    _square(out1).backward()
    _square(out2).backward()
    check("1F1B first", (out1.detach(), *(t.grad for t in first)), full["a"])
    check("1F1B second", (out2.detach(), *(t.grad for t in second)), full["b"])
    results["left after 1F1B"] = len(keep)
    with torch.no_grad():
        for _ in range(10):  # a no-grad loop in training mode (RL log-probs)
            mb.burst_attn(*a, causal=True, keep=keep)
    results["bounded"] = len(keep)
    mb.burst_attn(*a, causal=True, keep=keep)  # a forward with autograd: not recomputed
    results["after a plain forward"] = len(keep)
    return results


@pytest.mark.parametrize("world", [1, 2])
def test_a_kept_output_goes_only_to_the_recompute_of_its_own_forward(world: int) -> None:
    results = run_ranks(world, keep_worker, timeout=180) if world > 1 else [keep_worker(0, 1)]
    for res in results:
        for name in ("after a no-grad forward", "after a dropped backward", "1F1B first",
                     "1F1B second"):
            assert res[name] < 1e-10, (name, res[name])
        assert res["left after 1F1B"] == 0
        assert res["bounded"] == 4 and res["after a plain forward"] == 0


# ------------------------------------------------------------ 3. Ulysses-only headers


def ulysses_worker(rank: int, world: int, case: str) -> str:
    os.environ["MEGATRON_BURST_TIMEOUT_S"] = "10"
    q, k, v = (t.float() for t in _inputs(rank, 8, hq=4, hkv=2))
    run = lambda **kw: mb.burst_attn(q, k, v, ulysses_size=2, **kw)  # noqa: E731
    if case == "check off":
        os.environ["MEGATRON_BURST_AGREE"] = "off"
        call = lambda: run(causal=rank == 0)  # noqa: E731
    else:  # both signatures verified; then rank 1 repeats the other one
        run(causal=True)
        run(causal=False)
        call = lambda: run(causal=rank == 0)  # noqa: E731
    try:
        call()
        return "no error"
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("case", ["check off", "cached signature"])
def test_a_ulysses_only_topology_checks_every_message(case: str) -> None:
    """ulysses_size == cp: a ring of one member, so the all-to-all is all that moves."""
    for outcome in run_ranks(2, ulysses_worker, case, timeout=120):
        assert "pair up wrongly" in outcome, outcome


# ------------------------------------------------------------ 4. lse gradients


def _lse_loss(dead_rows):
    def loss(out, lse):
        live = torch.ones(out.shape[:3], dtype=out.dtype)
        live[:, dead_rows] = 0  # tokens out of the loss: their output gradient is zero
        w = torch.linspace(0.5, 2, lse.numel(), dtype=lse.dtype).view(lse.shape)
        return _plain(out * live.unsqueeze(-1), None) + (lse * w).sum()
    return loss


def lse_worker(rank: int, world: int) -> list[float]:
    from megatron_burst.attention.sharding import shard_seq

    s, errors = 8 * world, []
    for backward, only_lse in itertools.product(("burst", "ring"), (False, True)):
        q, k, v = _inputs(5, s, hq=4, hkv=2)
        dead = slice(0, s // 2)
        loss_full = (lambda o, l: (l * 1.5).sum()) if only_lse else _lse_loss(dead)
        ref = _reference(q, k, v, causal=True, loss=loss_full)
        local = [shard_seq(t, layout="zigzag", seq_dim=1).requires_grad_() for t in (q, k, v)]
        out, lse = mb.burst_attn(*local, causal=True, backward=backward, return_lse=True)
        live_full = torch.ones(1, s, 1, 1, dtype=q.dtype)
        live_full[:, dead] = 0
        live = shard_seq(live_full, layout="zigzag", seq_dim=1)
        w_full = torch.linspace(0.5, 2, ref[1].numel(), dtype=q.dtype).view(ref[1].shape)
        w = shard_seq(w_full, layout="zigzag", seq_dim=2)
        if only_lse:
            (lse * 1.5).sum().backward()
        else:
            weights = torch.linspace(-1, 1, ref[0].numel(), dtype=q.dtype).view(ref[0].shape)
            (out * live * shard_seq(weights, layout="zigzag", seq_dim=1)).sum().add(
                (lse * w).sum()).backward()
        for got, r in zip((t.grad for t in local), ref[2:]):
            errors.append(_rel(got, shard_seq(r, layout="zigzag", seq_dim=1)))
    return errors


@pytest.mark.parametrize("world", [1, 2])
def test_the_lse_gradient_is_exact_where_the_output_gradient_is_zero(world: int) -> None:
    results = run_ranks(world, lse_worker, timeout=180) if world > 1 else [lse_worker(0, 1)]
    for errors in results:
        assert max(errors) < 1e-10, errors


# ------------------------------------------------------------ 5. packs by content


@pytest.mark.parametrize("how", ["numpy", "data", "dlpack", "inference"])
def test_a_boundaries_buffer_rewritten_in_place_is_read_again(how: str) -> None:
    """A loader that reuses one boundaries buffer rewrites it in ways that leave its
    ``_version`` alone: the next call must still see the new documents."""
    q, k, v = _inputs(2, 24)
    old, new = [0, 8, 16, 24], torch.tensor([0, 5, 9, 24], dtype=torch.int32)
    if how == "inference":
        with torch.inference_mode():
            cu = torch.tensor(old, dtype=torch.int32)
    else:
        cu = torch.tensor(old, dtype=torch.int32)
    mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=cu)
    if how == "numpy":
        cu.numpy()[:] = new.numpy()
    elif how == "data":
        cu.data.copy_(new)
    elif how == "dlpack":
        torch.from_dlpack(cu).copy_(new)
    else:
        with torch.inference_mode():
            cu.copy_(new)
    ref = _reference(q, k, v, causal=True, lens=(5, 4, 15), loss=_plain)
    got = _one_rank(q, k, v, loss=_plain, causal=True, layout="whole_docs", cu_seqlens=cu)
    _check(got, ref, 1e-10, how)


def test_boundaries_past_int32_are_refused() -> None:
    q, k, v = _inputs(0, 8)
    with pytest.raises(ValueError, match="cu_seqlens must fit int32"):
        mb.burst_attn(q, k, v, layout="whole_docs",
                      cu_seqlens=torch.tensor([0, 8, 2 ** 31 + 8], dtype=torch.int64))


# ------------------------------------------------------------ 6. options given explicitly


def test_options_are_valid_by_construction() -> None:
    with pytest.raises(OptionError, match="backward must be one of"):
        BurstOptions(backward="bogus")
    with pytest.raises(OptionError, match="ulysses_size must be a positive int"):
        BurstOptions(ulysses_size=0)
    with pytest.raises(OptionError, match="document_layout shards document masks"):
        BurstOptions(document_layout="zigzag")
    with pytest.raises(OptionError, match="profile is read only by 'auto'"):
        BurstOptions(backward="ring", ulysses_size=1, profile="h200-nvlink")
    assert BurstOptions().given == frozenset()
    explicit = BurstOptions(ulysses_size=1, intra_node_size=None)
    assert explicit.given == {"ulysses_size", "intra_node_size"} and explicit != BurstOptions()
    assert explicit.fixes() == {"ulysses": 1, "intra_node_size": None}
    problem = BurstOptions(document_mask=True).run_problem(
        micro_batch_size=2, pipeline=1, sequence_parallel=False, recompute=None)
    assert problem.option == "document_mask"


def explicit_worker(rank: int, world: int) -> list[str]:
    q, k, v = (t.float() for t in _inputs(rank, 8, hq=4, hkv=2))
    topo = CPTopology.build(world, ulysses=2, heads=HeadShape(4, 2, 16, 4))
    seen = []
    for kw in ({}, {"ulysses_size": 2}, {"ulysses_size": 1}, {"intra_node_size": None},
               {"backward": "auto"}, {"backward": "ring"}):
        try:
            mb.burst_attn(q, k, v, causal=True, topology=topo, **kw)
            seen.append("ok")
        except ValueError as e:
            seen.append(str(e))
    return seen


def test_an_option_given_with_a_decided_topology_must_agree_even_at_its_default() -> None:
    for seen in run_ranks(2, explicit_worker, timeout=120):
        # Not given, the topology's own value, None (a flat ring: it has one), 'auto': ok.
        assert [seen[i] for i in (0, 1, 3, 4)] == ["ok"] * 4, seen
        assert "does not do what the options given with it fix: {'ulysses': 1}" in seen[2]
        assert "{'backward': 'ring'}" in seen[5]


def test_softmax_scale_and_causal_are_checked_once_by_value() -> None:
    q, k, v = _inputs(0, 8)
    with pytest.raises(ValueError, match="causal must be a bool"):
        mb.burst_attn(q, k, v, causal=1)
    assert math.isclose(float(mb.burst_attn(q, k, v, softmax_scale=1).sum()),
                        float(mb.burst_attn(q, k, v, softmax_scale=1.0).sum()))


def test_a_decided_topology_is_checked_against_vs_head_dim_too() -> None:
    """A topology made for MLA's V (dv 8 < d 16) is not taken by a call whose V is d wide,
    nor the other way round: the time model and the byte counts read V's dim."""
    from megatron_burst.decide.topology import CPTopology, HeadShape

    q, k, v = _inputs(0, 8)
    mla = CPTopology.build(1, heads=HeadShape(q.shape[2], k.shape[2], 16, 8, v_head_dim=8))
    with pytest.raises(ValueError, match="topology was resolved for"):
        mb.burst_attn(q, k, v, topology=mla)
    assert mb.burst_attn(q, k, v[..., :8], topology=mla).shape[-1] == 8
