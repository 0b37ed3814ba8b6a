"""The CPU side of two GPU benchmarks of issue 42: ``mask_kernel_kinds.py`` sorts profiled
kernels into kinds (cuDNN's attention kernels name "flash" too, and must count as cuDNN),
``megatron_mask_builders.py`` compares CP=gpus losses with CP=1's (a failed or missing
run, or a gap over the tolerance, fails), on its configs with the builder set; and
``deal_cost.py`` times the area layout's deal both ways, leaving the package's switch on."""
from __future__ import annotations

import sys

import pytest

from .readme import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import deal_cost  # noqa: E402
import mask_kernel_kinds as kk  # noqa: E402
import megatron_mask_builders as mmb  # noqa: E402


@pytest.mark.parametrize("name,kind", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "cudnn"),
    ("void cudnn::fusion::fmha_reduce_head<true>(void const*)", "cudnn"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "flash"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
    ("_merge_kernel", "merge"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>>",
     "elementwise/copy"),
    ("void at::native::reduce_kernel<128, 4>", "other")])
def test_kernels_fall_into_their_kind(name, kind):
    assert kk.kind(name) == kind


def test_the_kinds_table_counts_all_but_nccl():
    row = dict(family="causal_document", where="ring of 2", rank=1,
               ms_by_kind={"nccl": 9.0, "cudnn": 3.0, "flash": 2.5, "other": 0.5})
    line = kk.table([row]).splitlines()[2]
    assert line.startswith("| causal_document | ring of 2 | 1 | 9.000 | 3.000 | 2.500 |")
    assert line.endswith("| 6.000 |")


def _run(losses, rc=0, ms=(300.0, 300.0, 200.0, 220.0)):
    return dict(rc=rc, losses=list(losses), ms_per_iter=list(ms))


def test_builders_pass_within_the_tolerance_and_fail_beyond_it_or_on_a_failed_run():
    runs = {("prefix_lm", "cp"): _run([10.5, 8.0, 4.7001]),
            ("prefix_lm", "one"): _run([10.5, 8.0, 4.7, 3.1]),  # one more iteration: ignored
            ("shared_question", "cp"): _run([10.5, 8.01]),
            ("shared_question", "one"): _run([10.5, 8.0])}
    rows = {r["builder"]: r for r in mmb.compare(runs, 5e-3)}
    assert rows["prefix_lm"]["ok"] and rows["prefix_lm"]["iterations"] == 3
    assert rows["prefix_lm"]["gap"] == pytest.approx(1e-4)
    assert rows["prefix_lm"]["ms_cp"] == pytest.approx(210.0)  # after two iterations
    assert not rows["shared_question"]["ok"]  # 1e-2 over 5e-3
    runs["shared_question", "cp"] = _run([], rc=1)
    failed = {r["builder"]: r for r in mmb.compare(runs, 5e-3)}["shared_question"]
    assert failed["gap"] is None and not failed["ok"]
    assert "a run failed" in mmb.table(mmb.compare(runs, 5e-3), 2)
    del runs["prefix_lm", "one"]
    assert not mmb.compare(runs, 5e-3)[0]["ok"]


def test_builder_configs_set_the_builder_and_the_context_size():
    from megatron_burst.launch.config.schema import load_config

    import megatron_e2e

    base = load_config(megatron_e2e.CONFIG)
    for cp in (2, 1):
        cfg = mmb.builder_config(base, "shared_question", cp, 8)
        assert cfg.data.mask_builder == "megatron_burst.megatron.mask_batches:shared_question"
        assert cfg.parallel.context == cp and cfg.training.train_iters == 8
        assert not cfg.data.document_mask


@pytest.mark.parametrize("script,argv,named", [
    (kk, ["--heads", "64:8", "--out", "x"], "--heads"),
    (kk, ["--heads", "64:7:128", "--out", "x"], "--heads"),
    (kk, ["--warmup", "0", "--out", "x"], "--warmup"),
    (mmb, ["--tolerance", "0", "--out", "x"], "--tolerance"),
    (mmb, ["--gpus", "1", "--out", "x"], "--gpus")])
def test_bad_arguments_are_refused_by_name_before_any_rank_starts(script, argv, named,
                                                                   monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [script.__file__, *argv])
    with pytest.raises(SystemExit):
        script.main()
    assert named in capsys.readouterr().err



def test_the_deal_is_timed_both_ways_and_the_switch_left_on():
    from megatron_burst.plan import area
    from slice_masks import new_packs

    masks = new_packs("block_causal_document", 4096, 0.25, 3)
    on, off = (deal_cost.timed(2, masks, way) for way in (True, False))
    assert area.BETWEEN_SLICES
    assert on["ms"] > 0 and off["ms"] > 0 and on["balance"] >= 1 and off["balance"] >= 1
    assert on["cutting"] < off["cutting"] <= 1  # its cuts fall between the blocks
    row = dict(world=2, family="block_causal_document", between_slices=on, even_chunks=off)
    line = deal_cost.table(dict(machine="cpu", packs=3, command="x"), [row]).splitlines()[-1]
    assert line.startswith("| 2 | block_causal_document | ")


@pytest.mark.parametrize("args, says", [(["--packs", "0"], "--packs must be at least 1"),
                                        (["--worlds", "2,x"], "--worlds must be positive")])
def test_the_deal_timer_refuses_bad_arguments_by_name(args, says):
    import subprocess

    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "deal_cost.py"), *args,
                          "--out", "/nonexistent/x"], capture_output=True, text=True)
    assert run.returncode == 2 and says in run.stderr
