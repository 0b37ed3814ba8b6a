"""Every --burst-* option either changes what a Megatron run does or stops it: none is ignored.

Both ways into Megatron's training loop (this package's entry point and Megatron-LM's own
pretrain_gpt.py with patches/ applied) hand the parsed options to
`megatron_burst.megatron.entry.configure_run` and make document batches with
`entry.document_batch`; the patch and the entry point are checked to call exactly those.
The walk takes the options from the parser itself, so an option added later without a case
here fails the test. What a run does is everything `configure_run` decides: the topology, the
layer spec, the model hooks, remat, the document layout, and the dataloader's dense mask.
"""
from __future__ import annotations

import argparse
import pathlib
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

from megatron_burst.megatron import entry  # noqa: E402
from megatron_burst.megatron.arguments import add_burst_args  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
# The Megatron options configure_run reads, with Megatron's defaults (megatron.training is
# not importable on Python 3.11, where CI runs; tests/launch checks the real parser).
MEGATRON_DEFAULTS = dict(
    cp_comm_type=["p2p"], context_parallel_size=4, tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1, sequence_parallel=False, num_attention_heads=16,
    num_query_groups=4, group_query_attention=True, kv_channels=None, hidden_size=1024,
    bf16=True, fp16=False, hierarchical_context_parallel_sizes=None, seq_length=16384,
    attention_dropout=0.0, recompute_granularity=None, micro_batch_size=1,
    reset_attention_mask=False, reset_position_ids=False, position_embedding_type="rope",
    create_attention_mask_in_dataloader=True, hybrid_context_parallel=False,
    dataloader_inter_document_masking=False, sft=False, fim_data=False, mtp_num_layers=None)
BURST = ["--cp-comm-type", "burst"]
PREFIX_LM = "megatron_burst.megatron.mask_batches:prefix_lm"
FULL = ["--recompute-granularity", "full"]
# For each option: command lines with it (after BURST), and what must happen: a list (a
# run without the option, or with another value, which must do something else) or the text
# of the ValueError the line must raise.
CASES = {
    "--burst-backward": [(["--burst-backward", "burst"], ["--burst-backward", "ring"]),
                         (["--burst-backward", "auto"], ["--burst-backward", "burst"])],
    "--burst-intra-node-size": [(["--burst-intra-node-size", "2"], []),
                                (["--burst-intra-node-size", "3"], "divide")],
    "--burst-ulysses-size": [(["--burst-ulysses-size", "2"], []),
                             (["--burst-ulysses-size", "3"], "dividing")],
    "--burst-profile": [(["--burst-profile", "/no/such/profile.json"], "no such file"),
                        (["--burst-profile", "a100-ib", "--burst-backward", "ring",
                          "--burst-intra-node-size", "4", "--burst-ulysses-size", "1"],
                         "read only by 'auto'")],
    "--burst-remat-aware": [(["--burst-remat-aware"] + FULL, FULL),
                            (["--burst-remat-aware"], "recompute-granularity full")],
    "--burst-document-mask": [(["--burst-document-mask"], []),
                              (["--burst-document-mask", "--micro-batch-size", "2"],
                               "micro-batch-size 1"),
                              (["--burst-document-mask", "--sft"], "--sft")],
    "--burst-document-layout": [(["--burst-document-mask", "--burst-document-layout",
                                  "zigzag"], ["--burst-document-mask"]),
                                (["--burst-document-layout", "zigzag"],
                                 "needs --burst-document-mask")],
    "--burst-document-capacity": [
        (["--burst-document-mask", "--burst-document-layout", "pack_zigzag",
          "--burst-document-capacity", "64"],
         ["--burst-document-mask", "--burst-document-layout", "pack_zigzag"]),
        (["--burst-document-mask", "--burst-document-capacity", "64"],
         "needs --burst-document-layout pack_zigzag")],
    "--burst-mask-builder": [(["--burst-mask-builder", PREFIX_LM], []),
                             (["--burst-mask-builder", "no_colon"], "module:function"),
                             (["--burst-mask-builder", PREFIX_LM, "--micro-batch-size", "2"],
                              "micro-batch-size 1"),
                             (["--burst-mask-builder", PREFIX_LM, "--burst-document-mask"],
                              "cannot be combined with --burst-document-mask")],
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.set_defaults(**MEGATRON_DEFAULTS)
    p.add_argument("--cp-comm-type", nargs="+")
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--recompute-granularity")
    p.add_argument("--sft", action="store_true")
    return add_burst_args(p)


def burst_options() -> list[str]:
    return sorted(a.option_strings[0] for a in parser()._actions
                  if a.option_strings and a.option_strings[0].startswith("--burst-"))


def what_runs(argv: list[str]) -> dict:
    """Everything configure_run decides for `argv` (raises what it raises): the run, and
    what every layer gets through the spec it binds."""
    args = parser().parse_args(argv)
    model_cfg = SimpleNamespace(transformer_layer_spec=None, pre_wrap_hooks=[])
    run = entry.configure_run(args, model_cfg)
    spec = model_cfg.transformer_layer_spec
    return dict(run=run, spec=getattr(getattr(spec, "func", spec), "__name__", None),
                layer_params=getattr(spec, "keywords", None),
                hooks=[getattr(h, "__name__", h) for h in model_cfg.pre_wrap_hooks],
                dense_mask=args.create_attention_mask_in_dataloader)


def test_every_option_has_a_case() -> None:
    assert burst_options() == sorted(CASES), "say what each --burst-* option changes"


@pytest.mark.parametrize("option", sorted(CASES))
def test_option_changes_what_runs_or_raises(option: str) -> None:
    for extra, expected in CASES[option]:
        if isinstance(expected, list):
            assert what_runs(BURST + extra) != what_runs(BURST + expected), (option, extra)
        else:
            with pytest.raises(ValueError, match=expected):
                what_runs(BURST + extra)


@pytest.mark.parametrize("option", sorted(CASES))
def test_option_without_burst_attention_is_refused(option: str) -> None:
    """With another --cp-comm-type the layers are not BurstAttention: the option would do
    nothing, so the run stops naming it."""
    extra, _ = CASES[option][0]
    with pytest.raises(ValueError, match="need BurstAttention"):
        what_runs(["--cp-comm-type", "p2p"] + extra)


def test_burst_runs_build_no_dense_mask() -> None:
    """Upstream's dataloader builds a dense [s, s] mask by default; a burst run turns it off
    and says so, a run without BurstAttention is left alone."""
    ran = what_runs(BURST)
    assert ran["dense_mask"] is False and ran["run"].dense_mask_off
    assert any("no dense" in line for line in ran["run"].describe())
    assert what_runs(["--cp-comm-type", "p2p"])["dense_mask"] is True


def test_both_entry_points_call_the_shared_entry() -> None:
    """The patch and this package's entry point hand everything to the same functions."""
    patch = (REPO / "patches" / "megatron-lm-core_v0.19.0-burst.patch").read_text()
    own = (REPO / "megatron_burst" / "megatron" / "pretrain_gpt.py").read_text()
    for call in ("configure_run(", "document_batch(", "dataset_on_every_rank("):
        assert f"burst_entry.{call}" in patch, call
        assert f"entry.{call}" in own, call
    added = [line[1:] for line in patch.splitlines() if line.startswith("+")
             and not line.startswith("+++")]
    assert len(added) < 60, "keep the patch small: the logic lives in the package"


def test_runs_without_burst_attention_are_left_alone() -> None:
    """Megatron-LM's pretrain_gpt.py with the patch calls configure_run for every run once
    the package is installed: Megatron's own CP modes (one per layer too) and the dense-mask
    flags its dataloader honours are not ours to refuse there."""
    for argv in (["--cp-comm-type", "p2p", "a2a"], ["--cp-comm-type", "p2p"]):
        args = parser().parse_args(argv)
        args.reset_attention_mask = args.reset_position_ids = True
        assert entry.configure_run(args, SimpleNamespace()).topology is None, argv
    with pytest.raises(ValueError, match="burst cannot be mixed per layer"):
        entry.configure_run(parser().parse_args(["--cp-comm-type", "burst", "p2p"]))


@pytest.mark.parametrize("extra, megatron, match", [
    ([], dict(reset_attention_mask=True), "--reset-attention-mask"),
    ([], dict(reset_position_ids=True), "--reset-position-ids"),
    (["--sft"], {}, "--sft"),
    ([], dict(fim_data=True), "--fim-data"),
    ([], dict(mtp_num_layers=1), "--mtp-num-layers"),
    ([], dict(logits_load_dir="/teacher/logits"), "--logits-load-dir"),
])
def test_this_entry_point_refuses_what_it_would_ignore(extra, megatron, match) -> None:
    """This package's entry point builds no dense mask, GPT datasets only, no MTP block and
    the token loss only, whatever the CP mode: those flags stop the run instead of doing
    nothing."""
    for comm in (["--cp-comm-type", "p2p"], BURST):
        args = parser().parse_args(comm + extra)
        for key, value in megatron.items():
            setattr(args, key, value)
        with pytest.raises(ValueError, match=match):
            entry.check_own_entry(args)
    entry.check_own_entry(parser().parse_args(BURST))  # a plain run passes


def test_a_run_without_gloo_groups_names_the_host_channel(monkeypatch) -> None:
    """Megatron's --disable-gloo-process-groups (a cluster where gloo cannot connect) with
    the agreements' gloo twins (``comm.host_channel``, the default) stops at start-up naming
    the setting that keeps them on NCCL, instead of failing at the first call."""
    from megatron_burst.comm import settings

    args = parser().parse_args(BURST)
    args.use_gloo_process_groups = False
    with pytest.raises(ValueError, match="--disable-gloo-process-groups: .*"
                                         "MEGATRON_BURST_HOST_CHANNEL=group"):
        entry.configure_run(args)
    monkeypatch.setenv(settings.HOST_CHANNEL_ENV, "group")
    assert entry.configure_run(args).topology is not None


def test_the_patch_s_batch_call_honours_a_mask_builder(monkeypatch) -> None:
    """Megatron-LM's pretrain_gpt.py with the patch calls entry.document_batch for every
    batch the package makes: under --burst-mask-builder that must be the builder's mask
    batch (it made document batches, ignoring the builder)."""
    from megatron_burst.megatron import run_batches

    made = []
    monkeypatch.setattr(run_batches, "mask_batch",
                        lambda it, args: made.append(args.burst_mask_builder) or "mask batch")
    args = SimpleNamespace(burst_mask_builder="megatron_burst.megatron.mask_batches:prefix_lm",
                           burst_document_mask=False)
    assert entry.dataset_on_every_rank(args)
    assert entry.document_batch(iter(()), args) == "mask batch"
    assert made == [args.burst_mask_builder]
