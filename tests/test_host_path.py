"""The plugin's own host work per call, counted: a regression shows here without a GPU.

At CP=1 a prepared call is one kernel call: the steady state makes a fixed, small number of
Python calls into the package (forward and backward together) and none of the planning
(validation, topology, schedule, kernel choice, signature, agreement). A new document pack
at CP=1 is planned from its boundaries without Python per document.
"""
from __future__ import annotations

import collections
import itertools
import sys

import torch

import megatron_burst as mb

PACKAGE = "/megatron_burst/"
# What a steady-state CP=1 call may reach: the call path only.
PLANNING = {"prepare", "_validate", "_topology", "_bind_plan", "choose_kernel", "signature",
            "check_agreement", "blocks", "blocks_between", "plan_calls", "plan_alone",
            "placement", "resolve"}


def profiled(fn, hook) -> None:
    """``fn()`` with ``hook(frame, event, arg)`` seeing every call (``sys.setprofile``)."""
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)


def package_calls(fn) -> collections.Counter:
    """(file, function) of every Python call into the package while ``fn()`` runs."""
    seen: collections.Counter = collections.Counter()

    def profile(frame, event, _arg):
        if event == "call" and PACKAGE in frame.f_code.co_filename:
            seen[(frame.f_code.co_filename.split(PACKAGE)[-1], frame.f_code.co_name)] += 1

    profiled(fn, profile)
    return seen


def _qkv(s: int = 16):
    return [torch.randn(1, s, h, 8, requires_grad=True) for h in (4, 2, 2)]


def test_a_prepared_cp1_call_is_the_kernel_and_a_few_lookups():
    """Without lse the call is the kernel's one op, differentiated by aten itself; with lse
    (or sinks, or a keep) it is the package's autograd function around one kernel call."""
    q, k, v = _qkv()
    do = torch.randn_like(q)
    for return_lse, budget, kernel_calls in ((False, 30, {"native": 1}),
                                             (True, 60, {"forward": 1, "backward": 1})):
        step = lambda: mb.burst_attn(q, k, v, causal=True, return_lse=return_lse)  # noqa
        loss = lambda: (step()[0] if return_lse else step()).backward(do)  # noqa: E731
        loss()  # prepares
        seen = package_calls(loss)
        assert not {name for _, name in seen} & PLANNING, seen
        assert sum(seen.values()) <= budget, (sum(seen.values()), seen.most_common(12))
        ran = {name: c for (f, name), c in seen.items() if f.startswith("kernels/")
               and name in ("forward", "backward", "native")}
        assert ran == kernel_calls, ran


def test_a_new_cp1_pack_is_planned_without_python_per_document():
    """Describing, checking and planning a new pack (everything before the kernels run,
    which on CPU loop over the documents themselves; CUDA's varlen call is one launch)."""
    from megatron_burst.attention import prepare
    from megatron_burst.attention.call import BurstCall

    q, k, v = _qkv(s=4096)
    counts = {}
    for docs in (16, 1024):
        lens = [4096 // docs] * docs
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
        kw = dict(causal=True, softmax_scale=None, window_size=(-1, -1), layout="whole_docs",
                  backward="auto", qkv_format="bshd", intra_node_size=None, ulysses_size=1,
                  cu_seqlens=cu, kernel=None, keep=None, call_label=None, topology=None)
        seen = package_calls(lambda: prepare.lookup(None, q, k, v, BurstCall.of(kw), 1))
        counts[docs] = sum(seen.values())
        # One rank has nothing for 'auto' to decide: no profile read (a file stat each
        # time), no cluster asked.
        assert not {f for f, _ in seen} & {"timing.py", "cluster.py"}, seen
    # 64 times the documents, the same Python work (within a few calls).
    assert counts[1024] <= counts[16] + 10, counts


# ------------------------------------------------------------------ CP=2 on gloo (issue 39)

# Python calls (functions and C builtins, as ``sys.setprofile`` sees them) of one CP=2
# forward + backward on gloo, the user's ``.backward()`` included, measured on the plan
# value's thin ring path; at 7b3f129 they were 1,420 (plain) and 2,905 (a new pack). The
# gloo path does more than NCCL's (each pass's first hop trades headers first, every wait is
# bounded), and the CPU kernel runs a pack's varlen calls one document at a time.
# Issue 44 (settings read once, one deferred-check queue) took them from 773/809/2102 to
# 725/761/2068. Reading the rank and the timeout only where an error needs them: 711/747/2111.
# Issue 42's first writes (a pass's runs written, not folded in, where their rows are new:
# ``attention.first_writes``) cost a new pack's plan 27 calls: 738/775/2175. Taking a pass's
# first call over every row as its output (``attention.home_output``: no copy of the output
# on the device; decided with the plan) costs 0/2/1 more: 738/777/2176. Keeping a forward's
# rows that take more than two partials apart in fp32 (``home_output.WideRows``: the rest of
# the home in half precision; the rows found with the plan) costs 2/2/12: 740/779/2188.
BUDGETS = {"plain ring": 740, "plain burst": 780, "new pack": 2190}


def _all_calls(fn) -> int:
    count = [0]

    def profile(frame, event, _arg):
        if event in ("call", "c_call"):
            count[0] += 1

    profiled(fn, profile)
    return count[0]


def _environment_reads(fn) -> list:
    """What ``fn()`` reads of the environment or the file system: calls into ``os`` (its
    environment mapping) and ``stat``s (issue 44: settings are read once, not per call)."""
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(
                ("/os.py", "<frozen os>", "/pathlib.py")):
            seen.append(frame.f_code.co_name)
        elif event == "c_call" and getattr(arg, "__name__", "") in ("stat", "getenv"):
            seen.append(arg.__name__)

    profiled(fn, profile)
    return seen


def _cp2_counts(rank: int, world: int) -> dict:
    s, gen = 256, torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, s, h, 16, generator=gen, requires_grad=True) for h in (4, 2, 2))
    do = torch.randn(1, s, 4, 16, generator=gen)
    packs = iter(range(100))

    def plain(backward):
        mb.burst_attn(q, k, v, causal=True, backward=backward).backward(do)

    def new_pack():
        cut = torch.Generator().manual_seed(next(packs))
        cuts = sorted((torch.randperm(s * world - 1, generator=cut)[:7] + 1).tolist())
        cu = torch.tensor([0, *cuts, s * world], dtype=torch.int32)
        mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=cu,
                      backward="ring").backward(do)

    cases = {"plain ring": lambda: plain("ring"), "plain burst": lambda: plain("burst"),
             "new pack": new_pack}
    counts = {}
    for name, fn in cases.items():
        for _ in range(3):  # prepared, agreed, kernels probed
            fn()
        counts[name] = min(_all_calls(fn) for _ in range(2))
    cases["auto"] = lambda: plain("auto")  # decided from the profile: no stat of it per call
    for _ in range(3):
        cases["auto"]()
    counts["environment read"] = {name: _environment_reads(fn) for name, fn in cases.items()}
    return counts


def test_a_cp2_call_and_a_new_pack_stay_within_their_python_budget():
    """A regression in the host's work per call shows here, without a GPU: every rank's
    count of Python calls per CP=2 fwd+bwd stays within its budget."""
    from .distributed import run_ranks

    for rank, counts in enumerate(run_ranks(2, _cp2_counts, timeout=300)):
        for name, budget in BUDGETS.items():
            assert counts[name] <= budget, (rank, name, counts)
        assert counts["environment read"] == {name: [] for name in [*BUDGETS, "auto"]}, counts


def _auto_and_forced_new_pack_calls(rank: int, world: int) -> tuple[float, float, str]:
    """Python calls per new-pack fwd+bwd of 'auto' and of the topology it chose, forced."""
    import random

    from megatron_burst.attention import prepare

    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 64, h, 16, generator=gen, requires_grad=True) for h in (4, 2, 2))
    do = torch.randn(1, 64, 4, 16, generator=gen)
    lens, orders = [40, 30, 20, 10, 8, 6, 6, 8], random.Random(0)
    packs = iter(torch.tensor([0, *itertools.accumulate(orders.sample(lens, len(lens)))],
                              dtype=torch.int32) for _ in range(1000))
    auto = dict(backward="auto", ulysses_size=1, intra_node_size="auto")

    def call(**kw):
        mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=next(packs),
                      **kw).backward(do)

    call(**auto)
    chosen = [p for p in prepare.PREPARED.values() if p.decision is not None][-1].topology
    counts = []
    for kw in (auto, dict(backward=chosen.backward, ulysses_size=1)):
        for _ in range(3):
            call(**kw)
        counts.append(sum(_all_calls(lambda: call(**kw)) for _ in range(5)) / 5)
    return counts[0], counts[1], chosen.describe()


def test_auto_costs_a_new_pack_little_more_than_its_topology_forced(monkeypatch):
    """'auto' decides a document call once per shape; a new pack then costs the host the
    decision's lookups, not a decision: at most 100 Python calls more than the same topology
    forced (193 more before the profile kept its hash, about 80 after)."""
    from .distributed import run_ranks

    monkeypatch.setenv("MEGATRON_BURST_AUTO_MEASURE", "off")
    for auto, forced, chosen in run_ranks(2, _auto_and_forced_new_pack_calls, timeout=300):
        assert auto - forced <= 100, (auto, forced, chosen)
