"""Random call sequences on 2-4 gloo ranks: every call matches float64 or every rank raises.

Training does not call attention once on fresh arguments: layers alternate, signatures
repeat and come back from the caches, kept outputs wait for recomputes that may never come,
a loader rewrites one boundaries buffer in place, losses read lse on some rows and not the
output. Each rank draws the same program from a seeded generator (so the ranks make the
same calls, as a correct program does), with steps where one rank passes other arguments
than its peers. A step is either exact (out, lse and every gradient against the float64
reference, 1e-10) or raises ValueError on every rank.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.utils.checkpoint as ckpt

import megatron_burst as mb
from megatron_burst.attention.remat import AttentionKeep
from megatron_burst.attention.sharding import shard_seq

from .distributed import run_ranks
from .reference import reference_attention

D = 8


def _full(seed: int, s: int, hq: int, hkv: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, s, h, D, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv)]


def _rel(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    if torch.isnan(got).any():
        return float("nan")
    return float((got - ref).norm() / ref.norm().clamp_min(1.0 if ref.norm() == 0 else 1e-300))


class Program:
    """One rank's view of a random program (the same draws on every rank)."""

    def __init__(self, rank: int, world: int, seed: int):
        self.rank, self.world, self.rng = rank, world, random.Random(seed)
        self.keeps = {label: AttentionKeep(limit=3) for label in range(3)}
        self.buffer = torch.zeros(4, dtype=torch.int32)  # a loader's reused boundaries
        self.in_flight: list = []
        self.steps = 0

    def case(self) -> dict:
        r = self.rng
        hq, hkv = r.choice([(4, 4), (4, 2), (4, 1)])
        c = dict(causal=r.random() < 0.6, layout=r.choice(["zigzag", "contiguous"]),
                 backward=r.choice(["burst", "ring"]), hq=hq, hkv=hkv, window=(-1, -1),
                 ulysses=1, docs=None, label=r.randrange(3), seed=r.randrange(10 ** 6))
        if r.random() < 0.3:
            c["window"] = (r.randrange(1, 9), r.choice([0, 0, r.randrange(0, 5)]))
        if self.world % 2 == 0 and r.random() < 0.25:
            c["ulysses"] = 2
        if r.random() < 0.25:  # a pack of documents, through the reused buffer
            cuts = sorted(r.sample(range(1, 8 * self.world), 2))
            c.update(docs=(cuts[0], cuts[1] - cuts[0], 8 * self.world - cuts[1]),
                     layout="whole_docs", ulysses=1)
        return c

    def kwargs(self, c: dict) -> dict:
        cu = None
        if c["docs"] is not None:
            bounds = [0, *itertools.accumulate(c["docs"])]
            self.buffer.numpy()[:] = bounds  # in place: the tensor's _version does not move
            cu = self.buffer
        return dict(causal=c["causal"], layout=c["layout"], backward=c["backward"],
                    window_size=c["window"], ulysses_size=c["ulysses"], cu_seqlens=cu,
                    call_label=c["label"])

    def tensors(self, c: dict):
        s = 8 * self.world if c["docs"] is None else sum(c["docs"])
        full = _full(c["seed"], s, c["hq"], c["hkv"])
        cu = None if c["docs"] is None else torch.tensor([0, *itertools.accumulate(c["docs"])])
        local = [shard_seq(t, layout=c["layout"], seq_dim=1, cu_seqlens=cu) for t in full]
        return full, local, cu

    def reference(self, c, full, loss):
        doc_ids = None
        if c["docs"] is not None:
            doc_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(c["docs"]))
        leaves = [t.clone().requires_grad_() for t in full]
        out, lse = reference_attention(*leaves, causal=c["causal"], scale=D ** -0.5,
                                       window=c["window"], doc_ids=doc_ids)
        loss(out, lse).backward()
        return out, lse, [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]


def _losses(s: int, hq: int, rng: random.Random):
    """(output weights, lse weights) of a loss: some rows out of it, some barely in it
    (1e-20), lse in it or not, the whole loss scaled by 1e-30 to 1e30 (gradients are
    linear in it: the errors, relative, must not move)."""
    gen = torch.Generator().manual_seed(rng.randrange(10 ** 6))
    w_out = torch.linspace(-1, 1, s * hq * D, dtype=torch.float64).view(1, s, hq, D)
    rows = torch.rand(1, s, 1, 1, generator=gen)
    w_out = w_out * (rows < 0.6) * torch.where(rows < 0.1, 1e-20, 1.0)
    w_lse = None if rng.random() < 0.5 else torch.linspace(0.5, 1.5, hq * s,
                                                           dtype=torch.float64).view(1, hq, s)
    scale = rng.choice([1e-30, 1e-17, 1.0, 1.0, 1e17, 1e30])
    return w_out * scale, None if w_lse is None else w_lse * scale


def step(p: Program) -> str:
    """One random step; 'ok' (exact) or the ValueError's text."""
    r, c = p.rng, p.case()
    full, local, cu = p.tensors(c)
    kwargs = p.kwargs(c)
    what = r.choice(["call", "call", "keep", "disagree"])
    if what == "disagree":  # one rank passes another scale; every rank's is new, so every
        # rank checks (a rank repeating a verified signature would skip it: test_pairing)
        kwargs["softmax_scale"] = 0.25 + p.steps / 1000 + (p.rank == p.steps % p.world) / 7
    p.steps += 1
    shard = lambda t, dim=1: shard_seq(t, layout=c["layout"], seq_dim=dim, cu_seqlens=cu)  # noqa: E731
    try:
        if what == "keep":
            return _keep_step(p, c, full, local, kwargs, shard)
        w_out, w_lse = _losses(full[0].shape[1], c["hq"], r)
        loss = lambda o, lse: (o * w_out).sum() + (0 if w_lse is None else (lse * w_lse).sum())  # noqa: E731
        ref_out, ref_lse, ref_grads = p.reference(c, full, loss)
        leaves = [t.clone().requires_grad_() for t in local]
        out, lse = mb.burst_attn(*leaves, return_lse=True, **kwargs)
        local_loss = (out * shard(w_out)).sum()
        if w_lse is not None:
            local_loss = local_loss + (lse * shard(w_lse, 2)).sum()
        local_loss.backward()
    except ValueError as e:
        return str(e)
    errors = [_rel(out, shard(ref_out)),
              _rel(lse.masked_fill(torch.isneginf(lse), 0), shard(ref_lse.masked_fill(
                  torch.isneginf(ref_lse), 0), 2))]
    errors += [_rel(t.grad, shard(g)) for t, g in zip(leaves, ref_grads)]
    return "ok" if max(errors) < 1e-10 else f"wrong: {errors} in {c}"


def _keep_step(p: Program, c, full, local, kwargs, shard) -> str:
    """A layer under full recompute: a validation pass without eval(), a forward kept in
    flight, or the backward of the oldest one in flight (the order 1F1B keeps)."""
    keep = p.keeps[c["label"]]
    kwargs = dict(kwargs, keep=keep, cu_seqlens=None if c["docs"] is None else
                  mb.pack_documents(kwargs["cu_seqlens"].clone()))
    move = p.rng.choice(["validate", "forward", "backward", "backward"])
    if move == "validate":
        with torch.no_grad():
            mb.burst_attn(*local, **kwargs)
        return "ok"
    if move == "forward" or not p.in_flight:
        leaves = [t.clone().requires_grad_() for t in local]
        out = ckpt.checkpoint(lambda q, k, v: mb.burst_attn(q, k, v, **kwargs), *leaves,
                              use_reentrant=True)
        p.in_flight.append((c, full, leaves, out, shard))
        return "ok"
    c, full, leaves, out, shard = p.in_flight.pop(0)
    out.square().sum().mul(0.5).backward()
    _, _, ref_grads = p.reference(c, full, lambda o, lse: o.square().sum() * 0.5)
    errors = [_rel(t.grad, shard(g)) for t, g in zip(leaves, ref_grads)]
    return "ok" if max(errors) < 1e-10 else f"wrong kept: {errors} in {c}"


def program_worker(rank: int, world: int, seed: int, steps: int) -> list[str]:
    p = Program(rank, world, seed)
    return [step(p) for _ in range(steps)]


@pytest.mark.parametrize("world, seed", [(2, 1), (3, 2), (4, 3)])
def test_random_call_sequences_are_exact_or_refused_everywhere(world: int, seed: int):
    outcomes = run_ranks(world, program_worker, seed, 40, timeout=600)
    for i, column in enumerate(zip(*outcomes)):
        assert all(o == "ok" for o in column) or all(
            o != "ok" and not o.startswith("wrong") for o in column), (i, column)
        assert len(set(column)) == 1, (i, column)  # one error, the same on every rank
    kinds = {o.split(":")[0] for column in zip(*outcomes) for o in column}
    assert "ok" in kinds and any(k.startswith("burst_attn") for k in kinds), kinds
