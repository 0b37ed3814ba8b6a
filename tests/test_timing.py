"""The time model and `auto`: which topology it picks for which cluster, and `tune` on CPU ranks.

Synthetic profiles make each choice clear-cut: a slow inter-node link must pick the double
ring, many heads over a short sequence must pick Ulysses, GQA must pick the ring backward,
and no choice may break a divisibility rule. `tune` runs on gloo ranks at toy sizes and
must write a profile the model can load. MLA's two head dims count apart, and a sliding
window's layer is timed step by step over exactly the bytes the ring sends.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import megatron_burst as mb
from megatron_burst.decide.topology import CPTopology, HeadShape
from megatron_burst.decide.scheduled_time import _HopPlan, predict_scheduled
from megatron_burst.plan.schedule import Mask, RingSchedule
from megatron_burst.decide.timing import (Kernel, Link, Profile, choose,
                                          load_profile, predict)

from .distributed import run_ranks

NVLINK = Link(5.0, 300.0)
FAST = Profile(name="synthetic", intra=NVLINK, inter=Link(5.0, 300.0), alltoall=Link(10.0, 300.0),
               dense=Kernel(500.0, 1000.0), varlen=Kernel(300.0, 1000.0), memory_gbps=3000.0,
               step_overhead_us=30.0, call_overhead_us=100.0)


def scheduled_bytes(topology: CPTopology, *, batch: int, s_local: int,
                    window: tuple[int, int], member: int, causal: bool = True
                    ) -> tuple[int, int]:
    """(forward, backward) ring bytes ring member ``member`` sends in the hops this model
    times (no all-to-all): what ``CPTopology.rank_bytes`` counts, by another road
    (the time model's own hops, ``scheduled_time._HopPlan``)."""
    sched = RingSchedule.of("zigzag", topology.cp, (s_local * topology.cp,),
                            Mask(causal, tuple(window)), topology.ulysses)
    out = []
    for backward in (False, True):
        plan = _HopPlan(topology, sched, batch, backward)
        sent = 0  # each step's payload hops, and the accumulator sent on after it
        for s in range(topology.ring_size):
            sent += sum(n for _, n in plan.hops(member, s)) + plan.acc_after(member, s)
        out.append(sent)
    return out[0], out[1]


def test_shipped_profiles_load_and_say_where_they_come_from():
    for name in ("h200-nvlink", "a100-ib"):
        prof = load_profile(name)
        assert prof.source and prof.intra.gbps > prof.inter.gbps
    assert "NOT MEASURED" in load_profile("a100-ib").source
    with pytest.raises(ValueError, match="no such file"):
        load_profile("tpu-v9")


def test_a_slow_inter_node_link_picks_the_double_ring():
    slow = dataclasses.replace(FAST, inter=Link(10.0, 5.0))
    best = choose(8, HeadShape(32, 8, 128, 2), tokens=16384, prof=slow, max_intra_node_size=4,
                  ulysses=1)[0].topology
    assert best.double and best.positions_per_node == 4
    # Inside one node there is no double ring to pick.
    assert not choose(8, HeadShape(32, 8, 128, 2), tokens=16384, prof=slow,
                      ulysses=1)[0].topology.double


def test_many_heads_and_a_short_sequence_pick_ulysses():
    best = choose(8, HeadShape(64, 64, 128, 2), tokens=2048, prof=FAST)[0].topology
    assert best.ulysses > 1


def test_gqa_picks_the_ring_backward_and_mha_the_burst_one_when_links_bind():
    narrow = dataclasses.replace(FAST, intra=Link(5.0, 20.0))
    gqa = choose(4, HeadShape(32, 8, 128, 2), tokens=8192, prof=narrow, ulysses=1)[0]
    mha = choose(4, HeadShape(32, 32, 128, 2), tokens=8192, prof=narrow, ulysses=1)[0]
    assert gqa.topology.backward == "ring" and mha.topology.backward == "burst"


@pytest.mark.parametrize("cp, hq, hkv", [(8, 32, 8), (8, 24, 3), (6, 12, 4), (16, 8, 1),
                                         (4, 6, 6), (12, 36, 12)])
def test_auto_never_breaks_divisibility(cp, hq, hkv):
    heads = HeadShape(hq, hkv, 64, 2)
    for max_intra_node_size in (None, cp // 2 if cp % 2 == 0 else None):
        for pred in choose(cp, heads, tokens=4096, prof=FAST,
                           max_intra_node_size=max_intra_node_size):
            topology = pred.topology
            assert cp % topology.ulysses == 0 and hq % topology.ulysses == 0
            assert hkv % topology.ulysses == 0 or topology.ulysses % hkv == 0
            if topology.double:
                assert cp % topology.intra_node_size == 0
                assert topology.intra_node_size <= (max_intra_node_size or cp)


def test_prediction_grows_with_work_and_exposes_slow_links():
    heads = HeadShape(32, 32, 128, 2)
    topology = CPTopology.build(4, heads=heads, backward="burst")
    short, long = (predict(topology, FAST, tokens=t) for t in (4096, 32768))
    assert long.compute_s > 8 * short.compute_s
    slow = predict(topology, dataclasses.replace(FAST, intra=Link(5.0, 2.0)), tokens=4096)
    # A fast link hides every hop but the last accumulator's trip home, which follows the
    # last compute; a slow one exposes the hops too.
    home = FAST.intra.seconds(topology.backward_hop_parts(4096)[1])
    assert short.exposed_comm_s == pytest.approx(home) and slow.exposed_comm_s > 100 * home


def test_the_accumulator_trip_home_is_priced_once_after_the_last_step():
    """The backward's accumulators leave after the compute that fills them: all but the
    last ride beside a later payload hop (hidden where the link is fast), the last comes
    home exposed; the scheduled model (a window, step by step) prices the same tail."""
    heads = HeadShape(32, 8, 128, 2)
    for cp in (2, 4):
        for mode in ("ring", "burst"):
            top = CPTopology.build(cp, heads=heads, backward=mode)
            payload, acc = top.backward_hop_parts(8192)
            assert payload + acc == top.backward_hop_bytes(8192)
            plain = predict(top, FAST, tokens=8192)
            assert plain.exposed_comm_s == pytest.approx(FAST.intra.seconds(acc))
            window = predict_scheduled(top, FAST, batch=1, s_local=8192, window=(-1, -1),
                                       causal=False)
            assert window.exposed_comm_s == pytest.approx(FAST.intra.seconds(acc), rel=0.02)


def _tune_worker(rank, world, out):
    import os
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # two "nodes" of two ranks: both links measured
    from megatron_burst.tools import tune
    tune.main(["--out", out, "--quick"])


def test_tune_on_cpu_ranks_writes_a_profile_the_model_loads(tmp_path):
    out = str(tmp_path / "profile.json")
    run_ranks(4, _tune_worker, out, timeout=300)
    prof = load_profile(out)
    assert prof.gpus_per_node == 2 and "measured by megatron-burst tune" in prof.source
    assert prof.intra.points and prof.inter.points and prof.dense.peak_tflops > 0
    # the host priced as first use prices it: Ulysses' tiny call beside the ring's
    assert prof.call_overhead_us > 0 and prof.ulysses_call_overhead_us > 0
    raw = json.loads((tmp_path / "profile.raw.json").read_text())
    assert raw["raw"]["world"] == 4
    # The model ranks every topology with it, fastest first, with finite positive times.
    ranked = choose(4, HeadShape(4, 2, 32, 4), tokens=512, prof=prof)
    times = [p.total_s for p in ranked]
    assert len(ranked) >= 4 and times == sorted(times)
    assert all(0 < t < 1 and t == t for t in times), times


def _tune_one_rank(rank, world, out):
    from megatron_burst.tools import tune
    tune.main(["--out", out, "--quick"])


def test_tune_on_one_rank_says_the_links_were_not_measured(tmp_path, capfd):
    """Issue 43: `tune --nproc 1` wrote placeholder link rates (1 GB/s) as if measured."""
    out = str(tmp_path / "profile.json")
    run_ranks(1, _tune_one_rank, out, timeout=300)
    prof, base = load_profile(out), load_profile("h200-nvlink")
    assert ("not measured on 1 rank(s), 1 per node: the intra-node link, inter-node link, "
            "all-to-all (copied from h200-nvlink)") in prof.source
    assert (prof.intra, prof.inter, prof.alltoall) == (base.intra, base.inter, base.alltoall)
    assert prof.ulysses_call_overhead_us is None  # no Ulysses on one rank
    assert "note: not measured on 1 rank(s)" in capfd.readouterr().err


def test_tune_keeps_a_slow_kernel_above_zero():
    """A CPU rank on a busy host measures a few GFLOP/s: rounded to 0 TFLOP/s, `tune` would
    write a profile its own loader refuses."""
    from megatron_burst.tools.tune import _fit_kernel

    rising = _fit_kernel([(1024, 0.001), (4096, 0.003)])  # no saturation seen
    saturating = _fit_kernel([(1024, 0.002), (4096, 0.0032), (16384, 0.0034)])
    for kernel in (rising, saturating):
        assert 0.001 <= kernel.peak_tflops < 0.01, kernel


def _auto_worker(rank, world):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 32, h, 16, dtype=torch.float64) for h in (4, 2, 2))
    local = [mb.shard_seq(t) for t in (q, k, v)]
    auto = mb.burst_attn(*local, causal=True, ulysses_size="auto", intra_node_size="auto",
                         backward="auto")
    plain = mb.burst_attn(*local, causal=True, backward="burst")
    return float((auto - plain).abs().max())


def test_auto_topology_gives_the_same_attention():
    assert max(run_ranks(4, _auto_worker, timeout=120)) < 1e-12


# ------------------------------------------------------------------ MLA dims and windows

MLA = HeadShape(16, 16, 192, 2, v_head_dim=128)  # DeepSeek-V3's dims, MLA's K head per Q head


def test_mla_prediction_sits_between_its_two_head_dims():
    narrow = dataclasses.replace(FAST, intra=Link(5.0, 2.0))  # the links bind: bytes show
    for mode in ("burst", "ring"):
        pred = {d: predict(CPTopology.build(4, backward=mode, heads=h), narrow, tokens=8192)
                for d, h in (("mla", MLA), (128, HeadShape(16, 16, 128, 2)),
                             (192, HeadShape(16, 16, 192, 2)))}
        for part in ("compute_s", "exposed_comm_s"):
            low, mid, high = (getattr(pred[k], part) for k in (128, "mla", 192))
            assert low < mid < high, (mode, part, low, mid, high)


@pytest.mark.parametrize("cp, intra_node_size, mode", [(4, None, "ring"), (8, None, "burst"),
                                                       (8, 4, "ring"), (4, 2, "burst"),
                                                       (2, None, "ring"), (2, None, "burst")])
def test_the_scheduled_model_times_exactly_the_bytes_the_ring_sends(cp, intra_node_size, mode):
    topology = CPTopology.build(cp, backward=mode, intra_node_size=intra_node_size,
                                heads=HeadShape(8, 2, 24, 2, v_head_dim=16))
    for window in ((-1, 0), (3, 0), (20, 0)):
        for member in range(cp):
            assert scheduled_bytes(topology, batch=2, s_local=16, window=window,
                                   member=member) == topology.rank_bytes(
                member, batch=2, s_local=16, window=window), (window, member)


def test_a_sliding_window_layer_costs_its_band_and_its_hops():
    topology = CPTopology.build(4, backward="ring", heads=HeadShape(32, 8, 64, 2))
    full = predict(topology, FAST, tokens=32768)
    # Unbounded on the left it is the causal layer again, step by step: near the uniform law.
    causal = predict_scheduled(topology, FAST, batch=1, s_local=32768, window=(-1, 0))
    assert abs(causal.compute_s / full.compute_s - 1) < 0.15
    band = predict_scheduled(topology, FAST, batch=1, s_local=32768, window=(128, 0))
    wider = predict_scheduled(topology, FAST, batch=1, s_local=32768, window=(1024, 0))
    assert band.compute_s < wider.compute_s < full.compute_s / 10
    # Over a slow link the band's hops show, priced as the ring sends them: the runs its
    # receivers read (a zigzag rank needs the last 128 keys of its neighbours' chunks), not
    # the whole payload (``plan.runs``); before runs, one span of leading rows cost more
    # than a whole hop here.
    slow = dataclasses.replace(FAST, intra=Link(5.0, 2.0))
    waiting = predict_scheduled(topology, slow, batch=1, s_local=32768, window=(128, 0))
    hop = slow.intra.seconds(topology.hop_bytes(32768))
    edge = slow.intra.seconds(topology.hop_bytes(128))
    assert edge < waiting.exposed_comm_s < hop / 10


def test_a_measured_kernel_is_read_between_its_points_and_never_beyond_them():
    """A kernel with measured points interpolates on log(tokens) and holds the end points'
    rates outside them (its fitted curve would run on past the largest point)."""
    from megatron_burst.attention.measure import fit_kernel

    measured = [(2048, 290.0), (8192, 540.0), (32768, 570.0)]
    kernel = fit_kernel(measured)
    assert kernel.points == tuple(measured)
    assert kernel.tflops(8192) == 540.0 and kernel.tflops(16384) == pytest.approx(555.0)
    assert kernel.tflops(1 << 20) == 570.0 and kernel.tflops(512) == 290.0
    curve = Kernel(kernel.peak_tflops, kernel.half_tokens)  # the same fit, no points
    assert curve.tflops(1 << 20) > 570.0
    raw = {**json.loads(json.dumps(dataclasses.asdict(FAST))),
           "dense": dataclasses.asdict(kernel)}
    assert Profile.from_json(raw).dense == kernel  # a profile file keeps them
    raw["dense"]["points"] = [[2048, 0.0]]
    with pytest.raises(ValueError, match=r"dense.points\[0\] \(TFLOP/s\)"):
        Profile.from_json(raw)


def test_a_call_s_host_and_gpu_overlap_as_their_root_sum_of_squares():
    """A call takes more than the larger of its host and GPU times and less than their sum:
    their root sum of squares (``host_time.overlapped``); a pack's host, where the profile
    has no pack figures, is ``PACK_HOST`` times a plain call's; a training step's share
    (``serial_s``) is the sum."""
    from megatron_burst.decide.host_time import PACK_HOST
    from megatron_burst.decide.pack_load import PackLoad
    from megatron_burst.decide.scheduled_time import predict_pack

    slow_host = dataclasses.replace(FAST, call_overhead_us=50_000.0)
    top = CPTopology.build(2, ulysses=1, backward="ring", heads=HeadShape(32, 8, 128, 2))
    for prof in (FAST, slow_host):
        p = predict(top, prof, tokens=8192)
        gpu = p.compute_s + p.exposed_comm_s + p.alltoall_s
        assert p.host_s == pytest.approx((prof.call_overhead_us + 4 * prof.step_overhead_us)
                                         * 1e-6)
        assert max(gpu, p.host_s) < p.total_s < gpu + p.host_s
        assert p.total_s == pytest.approx((gpu ** 2 + p.host_s ** 2) ** 0.5)
        assert p.serial_s == pytest.approx(gpu + p.host_s)
        pack = predict_pack(top, prof, PackLoad.of_pack((8192, 4096, 4096), "whole_docs"))
        steps = 4  # two a pass: every document is held whole, yet the ring still walks
        assert pack.host_s == pytest.approx(
            PACK_HOST * (prof.call_overhead_us + steps * prof.step_overhead_us) * 1e-6)
        pack_gpu = pack.compute_s + pack.exposed_comm_s + pack.alltoall_s
        assert pack.total_s == pytest.approx((pack_gpu ** 2 + pack.host_s ** 2) ** 0.5)
    slow = predict(top, slow_host, tokens=8192)
    # host-bound: about the host's own time, the GPU's adding little (9.7 ms to 50.1)
    assert slow.host_s < slow.total_s < 1.02 * slow.host_s


def test_ulysses_calls_cost_the_host_what_first_use_measured_for_them():
    """A topology that splits heads costs the host the profile's Ulysses figure where it has
    one (its all-to-alls and their copies: 1.5-2x a ring call), the call overhead where not;
    a profile file keeps the figure, and null or a missing one loads as not measured."""
    uly = CPTopology.build(2, ulysses=2, backward="ring", heads=HeadShape(32, 8, 128, 2))
    ring = CPTopology.build(2, ulysses=1, backward="ring", heads=HeadShape(32, 8, 128, 2))
    measured = dataclasses.replace(FAST, call_overhead_us=3000.0,
                                   ulysses_call_overhead_us=5000.0)
    assert predict(uly, measured, tokens=8192).host_s == pytest.approx(
        (5000.0 + 2 * measured.step_overhead_us) * 1e-6)
    assert predict(ring, measured, tokens=8192).host_s == pytest.approx(
        (3000.0 + 4 * measured.step_overhead_us) * 1e-6)
    unmeasured = dataclasses.replace(measured, ulysses_call_overhead_us=None)
    assert predict(uly, unmeasured, tokens=8192).host_s == pytest.approx(
        (3000.0 + 2 * measured.step_overhead_us) * 1e-6)
    raw = measured.to_json()
    assert Profile.from_json(raw) == measured
    for absent in (None, "missing"):
        old = {k: v for k, v in raw.items() if k != "ulysses_call_overhead_us"}
        if absent is None:
            old["ulysses_call_overhead_us"] = None
        assert Profile.from_json(old).ulysses_call_overhead_us is None
    with pytest.raises(ValueError, match="ulysses_call_overhead_us"):
        Profile.from_json({**raw, "ulysses_call_overhead_us": -1.0})


PACK_FIGURES = dict(pack_call_overhead_us=3000.0, pack_doc_overhead_us=50.0,
                    ulysses_pack_call_overhead_us=4000.0, ulysses_pack_doc_overhead_us=150.0)


@pytest.mark.parametrize("ulysses, fixed, per_doc", [(1, 3000.0, 50.0), (2, 4000.0, 150.0)])
def test_a_new_pack_costs_the_host_what_first_use_measured_for_its_documents(
        ulysses, fixed, per_doc):
    """A pack's host cost is the profile's measured fixed cost and one per document (the
    flat ring's, or Ulysses' where the topology splits heads); a profile without them (the
    shipped ones) keeps ``PACK_HOST`` times a plain call's. The figures load from a file,
    null or missing as not measured, and a negative one is refused by name."""
    from megatron_burst.decide.host_time import PACK_HOST
    from megatron_burst.decide.pack_load import PackLoad
    from megatron_burst.decide.scheduled_time import predict_pack

    top = CPTopology.build(2, ulysses=ulysses, backward="ring", heads=HeadShape(32, 8, 128, 2))
    measured = dataclasses.replace(FAST, call_overhead_us=2000.0, **PACK_FIGURES)
    for lens in ((8192, 4096, 4096), (1024,) * 16):
        load = PackLoad.of_pack(lens, "whole_docs")
        assert predict_pack(top, measured, load).host_s == pytest.approx(
            (fixed + len(lens) * per_doc) * 1e-6)
        shipped = dataclasses.replace(FAST, step_overhead_us=0.0)  # no pack figures
        assert predict_pack(top, shipped, load).host_s == pytest.approx(
            PACK_HOST * predict(top, shipped, tokens=8192).host_s)
    raw = measured.to_json()
    assert Profile.from_json(raw) == measured
    for name in PACK_FIGURES:
        assert getattr(Profile.from_json({**raw, name: None}), name) is None
        assert getattr(Profile.from_json({k: v for k, v in raw.items() if k != name}),
                       name) is None
        with pytest.raises(ValueError, match=name):
            Profile.from_json({**raw, name: -1.0})


def _kernel_points(rank: int, world: int) -> tuple:
    import torch

    from megatron_burst.attention.measure import measure_kernels

    dense, varlen = measure_kernels([32, 128], 2, 16, torch.device("cpu"), torch.float32,
                                    repeat=1)
    return dense.points, varlen.points


def test_first_use_measures_the_kernel_on_long_documents_too():
    """``measure_kernels``: a dense point at every size, and varlen points for documents of
    n/8 tokens at every size and of n/2 at the largest (a pack's long documents carry most of
    its work; past its last point a kernel's rate is held flat)."""
    from .distributed import run_ranks

    (dense, varlen), = run_ranks(1, _kernel_points, timeout=120)
    assert [n for n, _ in dense] == [32, 128]
    assert sorted(n for n, _ in varlen) == [4, 16, 64]
    assert all(rate > 0 for _, rate in (*dense, *varlen))


def test_a_profile_hashes_by_value_once_and_pickles_without_its_hash():
    """``Profile.__hash__`` is computed once (every new pack's decision hashes it) and by
    value: equal profiles hash alike, a changed one differently, and a pickled one carries
    no hash made in another process."""
    import dataclasses
    import pickle

    prof = load_profile("h200-nvlink")
    same, other = dataclasses.replace(prof), dataclasses.replace(prof, memory_gbps=1.0)
    assert hash(prof) == hash(same) and prof == same and {prof: 1}[same] == 1
    assert hash(prof) != hash(other) and prof != other
    assert "_hash" in prof.__dict__
    back = pickle.loads(pickle.dumps(prof))
    assert back == prof and "_hash" not in back.__dict__ and hash(back) == hash(prof)
    assert "_hash" not in prof.to_json()
