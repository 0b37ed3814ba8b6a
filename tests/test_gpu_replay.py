"""Eager calls replayed from CUDA graphs (``attention.replay``) on GPUs, skipped without CUDA:
a replayed call gives what the eager call gives, on new inputs every call, with layers
interleaved as a model runs them (forward A, forward B, backward B, backward A)."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

import megatron_burst as mb

from .distributed import run_ranks
from .test_gpu_pack_zigzag import boundaries, pack

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
TRIALS = 4  # the first call of each pass runs eagerly, the second captures, then replays


def _fresh(mode: str | None) -> None:
    """The replay setting ``mode`` (None: unset) from a fresh start: no graph held, no
    prepared call (a prepared call holds whether it replays)."""
    from megatron_burst.attention import prepare, replay
    from megatron_burst.comm import settings

    if mode is None:
        os.environ.pop(settings.REPLAY_ENV, None)
    else:
        os.environ[settings.REPLAY_ENV] = mode
    settings.reload()
    replay.clear()
    prepare.PREPARED.clear()


@contextlib.contextmanager
def _replaying():
    """Replay ``auto`` for the block, then unset, nothing held."""
    _fresh("auto")
    try:
        yield
    finally:
        _fresh(None)


def _small(dev) -> list[torch.Tensor]:
    """q, k, v of a small call: 1,024 tokens a rank, 8:2 heads, d 64, bf16."""
    return [torch.randn(1, 1024, h, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
            for h in (8, 2, 2)]


def _calls(dev, opts: dict, heads, seq_first: bool, docs: bool, trials: int):
    """Every trial's two layers: (out and the grads of q, k, v) each, on new inputs drawn
    from one seed (so both settings see the same values). Without ``return_lse``: a call that
    hands lse back runs its backward eagerly (three passes, ``burst._backward_with_lse``)."""
    gen = torch.Generator(device=dev).manual_seed(23)
    total, rows = 4096, []
    shape = (lambda h: (total, 1, h, 64)) if seq_first else (lambda h: (1, total, h, 64))
    layout = "pack_zigzag" if docs else "zigzag"
    shard = lambda t: mb.shard_seq(t, layout=layout, seq_dim=0 if seq_first else 1)  # noqa
    for trial in range(trials):
        layers = []
        for layer in range(2):
            full = [torch.randn(shape(h), device=dev, generator=gen, dtype=torch.bfloat16)
                    for h in (heads[0], heads[1], heads[1], heads[0])]
            local = [shard(t).requires_grad_() for t in full[:3]]
            kw = dict(opts)
            if docs:
                lens = pack(total, 64, 1500, seed=10 * trial + layer)
                kw.update(layout="pack_zigzag", cu_seqlens=boundaries(lens, 48, dev))
            out = mb.burst_attn(*local, **kw)
            layers.append((local, out, shard(full[3])))
        for local, out, do in reversed(layers):
            out.backward(do)
        for local, out, _ in layers:
            rows.append([out.detach(), *(t.grad for t in local)])
    torch.cuda.synchronize()
    return rows


def replay_worker(rank, world, cases):
    from megatron_burst.attention import replay

    dev = torch.device("cuda", rank)
    found = []
    for name, opts, heads, seq_first, docs in cases:
        got, captured, sent = {}, {}, {}
        for mode in ("off", "on"):
            _fresh(mode)
            with mb.count_comm() as stats:
                got[mode] = _calls(dev, opts, heads, seq_first, docs, TRIALS)
            captured[mode] = sorted(key[1] if key[0] == "function" else key[0]
                                    for key in replay.CAPTURED)
            sent[mode] = (stats.forward_bytes, stats.backward_bytes, stats.forward_messages,
                          stats.backward_messages)
        for i, (eager, replayed) in enumerate(zip(got["off"], got["on"])):
            found.append(dict(
                case=name, docs=docs, call=i, captured_on=captured["on"],
                captured_off=captured["off"],
                sent_on=sent["on"], sent_off=sent["off"],
                same_bits=[bool(torch.equal(a, b)) for a, b in zip(eager, replayed)],
                rel=[float(((a.double() - b.double()).norm() / b.double().norm().clamp_min(
                    1e-30)).item()) if torch.isfinite(a).all() else float("nan")
                     for a, b in zip(eager, replayed)]))
    _fresh(None)
    return found


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
def test_replayed_calls_give_the_eager_calls_results_over_nccl():
    """out bit for bit; the gradients within the rounding of the kernels' atomic
    sums (flash's and cuDNN's backward add dQ's partials in any order). The replays happened:
    each case captured its forward and its backward, and 'off' captured nothing; and the
    bytes counted (``count_comm``) are the same: a replay counts what its capture posted.
    A pack's boundaries check replays from a graph of its own too."""
    cases = [("causal, ring backward", dict(causal=True, backward="ring"), (8, 2), False,
              False),
             ("causal, burst backward, sbhd", dict(causal=True, backward="burst",
                                                   qkv_format="sbhd"), (8, 8), True, False),
             ("full, GQA", dict(causal=False, backward="ring"), (8, 2), False, False),
             ("causal window", dict(causal=True, window_size=(700, 0), backward="ring"), (8, 2),
              False, False),
             ("pack_zigzag, new pack every call", dict(causal=True, backward="ring"), (8, 2),
              False, True)]
    rows = run_ranks(NGPU, replay_worker, cases, backend="nccl", timeout=600)
    for rank_rows in rows:
        for r in rank_rows:
            print(r)
            assert r["captured_off"] == [], r
            assert r["sent_on"] == r["sent_off"] and r["sent_on"][0] > 0, r
            passes = ["backward", "forward"]  # and a pack's boundaries check (agree)
            assert r["captured_on"] == (["backward", "boundaries", "forward"] if r["docs"]
                                        else passes), r
            assert r["same_bits"][0], r  # out
            assert max(r["rel"]) < 5e-3, r  # NaN fails too


def capture_worker(rank, world, _):
    """Calls that replayed, then the user's own capture of the same call."""
    from megatron_burst.attention import replay

    with _replaying():
        inputs = _small(torch.device("cuda", rank))
        fn = lambda q, k, v: mb.burst_attn(q, k, v, causal=True, backward="ring")  # noqa
        for _ in range(3):
            fn(*inputs).sum().backward()
        held = len(replay.CAPTURED)
        try:
            torch.cuda.make_graphed_callables(fn, tuple(inputs), num_warmup_iters=3)
        except ValueError as error:
            return held, str(error)
        return held, None


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
def test_a_users_capture_after_replays_is_refused_on_every_rank():
    """A capture after replays failed on 2x H100 (``attention.replay``): it is refused with
    the same ValueError, naming the setting, on every rank, and nothing hangs."""
    said = run_ranks(NGPU, capture_worker, None, backend="nccl", timeout=300)
    for held, error in said:
        assert held == 2 and error is not None and "MEGATRON_BURST_REPLAY" in error, said
    assert len({error for _, error in said}) == 1, said


def teardown_worker(rank, world, _):
    """Calls that replayed, then the process group's teardown: (graphs held, seconds)."""
    import time

    import torch.distributed as dist

    from megatron_burst.attention import replay

    with _replaying():
        inputs = _small(torch.device("cuda", rank))
        for _ in range(4):
            mb.burst_attn(*inputs, causal=True, backward="ring").sum().backward()
        held = len(replay._GRAPHS)
        torch.cuda.synchronize()
        start = time.perf_counter()
        dist.destroy_process_group()
        return held, time.perf_counter() - start


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
def test_the_teardown_after_replays_does_not_hang():
    """With replay graphs held, NCCL's teardown waited for good (both ranks, killed after
    60 s); ``destroy_process_group`` now drops them first (``replay``), and returns."""
    said = run_ranks(NGPU, teardown_worker, None, backend="nccl", timeout=120, barrier=False)
    for held, seconds in said:
        assert held == 2 and seconds < 30, said


def bad_boundaries_worker(rank, world, case):
    """Packs whose boundaries check replays from its graph, then one bad pack: what each
    rank's next call raises."""
    from megatron_burst.attention import replay

    dev = torch.device("cuda", rank)
    with _replaying():
        total = 2048 * world
        q, k, v = (torch.randn(1, 2048, h, 64, device=dev, dtype=torch.bfloat16)
                   for h in (8, 2, 2))
        call = lambda cu: mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag",  # noqa
                                        cu_seqlens=cu)
        for seed in range(4):
            call(boundaries(pack(total, 64, 1500, seed=seed), 48, dev))
        checks = [key for key in replay.CAPTURED if key[1] == "boundaries"]
        bad = boundaries(pack(total, 64, 1500, seed=9), 48, dev)
        if case == "one rank differs" and rank == 1:
            bad[3] += 1
        if case == "decreasing":
            bad[2], bad[3] = bad[3].clone(), bad[2].clone()
        call(bad)
        torch.cuda.synchronize()
        try:
            call(boundaries(pack(total, 64, 1500, seed=5), 48, dev))
        except ValueError as error:
            return len(checks), str(error)
        return len(checks), "no error"


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("case", ["one rank differs", "decreasing"])
def test_a_replayed_boundaries_check_still_refuses_bad_packs_on_every_rank(case):
    """With replay on, the boundaries' digest and gather replay from a graph of their own
    (``agree.check_boundaries``); a bad pack after it was captured still raises the same
    ValueError on every rank at the call after."""
    said = run_ranks(NGPU, bad_boundaries_worker, case, backend="nccl", timeout=300)
    assert all(checks == 1 for checks, _ in said), said
    assert len({error for _, error in said}) == 1, said
    expected = "different cu_seqlens" if case == "one rank differs" else "must start at 0"
    assert expected in said[0][1], said
