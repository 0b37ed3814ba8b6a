"""The README's GPU figures for packed documents, host time and the Megatron runs are the
results on file: each table row and each figure quoted in the text is rebuilt here from
`benchmarks/results/*.json`. A rerun that changes a number fails here until the README says
the same (the launch layer's figures: tests/launch/test_launch_readme_numbers.py)."""
from __future__ import annotations

import json
import math
import re
import statistics

import pytest

from .readme import RESULTS, even_chunks
from .readme import says as _says

MIXES = ("lognormal", "uniform", "long", "tiny")
NEW, SAME, BACK_TO_BACK = ("burst whole_docs, new pack each call",
                           "burst whole_docs, same pack repeated",
                           "burst whole_docs, new packs back to back (no sync)")


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _span(values, fmt: str = "{:.2f}") -> str:
    """'low-high' as the README writes a range."""
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def _documents() -> dict:
    """(tokens per GPU, 'hq:hkv d', mix, method) -> row of the fresh-pack benchmark."""
    rows = {}
    for r in _load("h200x2_documents_fresh.json")["rows"]:
        if r["gpus"] == 2 and r["method"].startswith("burst"):
            rows[r["per_gpu"], f"{r['heads']} d{r['head_dim']}", r["mix"], r["method"]] = r
    return rows


def _megatron(name: str) -> dict:
    return {r["name"]: r for r in _load(name)["runs"]}


def test_fresh_pack_table_is_the_run_on_file():
    rows = _documents()
    cases = sorted({k[:3] for k in rows},
                   key=lambda k: (k[0], k[1] != "32:8 d128", MIXES.index(k[2])))
    assert len(cases) == 24
    for per_gpu, heads, mix in cases:
        new, same, b2b = (rows[per_gpu, heads, mix, m] for m in (NEW, SAME, BACK_TO_BACK))
        _says(f"| {per_gpu // 1024}K | {heads} | {mix} | {new['ms']:.1f} | {same['ms']:.1f} | "
              f"{new['fresh_over_repeated']:.2f} | {new['efficiency_vs_1gpu']:.2f} | "
              f"{b2b['efficiency_vs_1gpu']:.2f} |")


def test_fresh_pack_summary_is_the_table():
    rows = _documents()
    new = [r for k, r in rows.items() if k[3] == NEW]
    ratio = [r["fresh_over_repeated"] for r in new if r["mix"] != "tiny"]
    tiny = [r["fresh_over_repeated"] for r in new if r["mix"] == "tiny"]
    big = [r["efficiency_vs_1gpu"] for k, r in rows.items()
           if k[0] == 32768 and k[1] == "32:8 d128" and k[2] != "tiny" and k[3] == NEW]
    tiny_big = rows[32768, "32:8 d128", "tiny", NEW]["efficiency_vs_1gpu"]
    _says(f"costs {_span(ratio)}x the same pack again (packs of hundreds of tiny documents "
          f"{_span(tiny, '{:.1f}')}x: their planning")
    _says(f"{_span(big)} of one GPU's kernel on the same fresh packs (32:8 heads, d 128; "
          f"tiny documents {tiny_big:.2f})")


def test_cudnn_per_document_figures_are_the_run_on_file():
    one_gpu = {}
    for r in _load("h200x2_documents_fresh.json")["rows"]:
        if r["gpus"] == 1:
            one_gpu.setdefault((r["per_gpu"], r["head_dim"], r["mix"]), {})[r["method"]] = r["ms"]
    cudnn = {k: m for k, m in one_gpu.items() if "1 GPU cuDNN per document, new pack each call" in m}
    assert cudnn, "the run on file has cuDNN rows"
    graph_s = [m["1 GPU cuDNN per document, new pack each call"] / 1e3 for m in cudnn.values()]
    varlen_ms = [m["1 GPU varlen flash, new pack each call"] for m in cudnn.values()]
    _says(f"one new pack on cuDNN per document took {_span(graph_s, '{:.1f}')} s against "
          f"{min(varlen_ms):.1f}-{max(varlen_ms):.0f} ms on the varlen kernel")
    by_tokens = sorted((k[0], m["1 GPU cuDNN per document, new pack each call"] / 1e3)
                       for k, m in cudnn.items())
    _says(f"({by_tokens[0][1]:.1f} s per call at {by_tokens[0][0] // 1024}K/GPU, "
          f"{by_tokens[-1][1]:.1f} s at {by_tokens[-1][0] // 1024}K)")


@pytest.mark.parametrize("name, label, run", [
    ("megatron_documents_small_h200x2.json", "small (4 layers, hidden 1024, 16:4), 16K, CP=2",
     "small 16K CP=2"),
    ("megatron_documents_small_h200x2.json", "same, document masks",
     "small 16K CP=2, document masks"),
    ("megatron_documents_cp1_h200x2.json", "same, document masks, CP=1 (one GPU)",
     "small 16K CP=1, document masks"),
    ("megatron_documents_1b_h200x2.json", "Llama-3.2 1B shape, 64K, CP=2", "1b 64K CP=2"),
    ("megatron_documents_1b_h200x2.json", "same, document masks",
     "1b 64K CP=2, document masks"),
])
def test_end_to_end_documents_table_is_the_run_on_file(name, label, run):
    r = _megatron(name)[run]
    assert r["rc"] == 0
    mfu = f"{r['mfu']:.3f}"
    if run == "1b 64K CP=2, document masks":
        mfu = f"**{mfu}**"
    _says(f"| {label} | {r['steady_ms']:.0f} | {r['pairs_share']:.3f} | "
          f"{r['model_tflops_per_gpu']:.0f} | {mfu} | {r['tflops_per_gpu']:.0f} |")


def test_end_to_end_documents_summary_is_the_runs():
    big = _megatron("megatron_documents_1b_h200x2.json")
    masked, plain = big["1b 64K CP=2, document masks"], big["1b 64K CP=2"]
    _says(f"the masked step runs at the unmasked step's MFU ({masked['mfu']:.3f} vs "
          f"{plain['mfu']:.3f}, FLOPs actually done)")
    _says(f"the masked step is {masked['steady_ms'] / plain['steady_ms']:.2f}x the unmasked one")
    small = _megatron("megatron_documents_small_h200x2.json")
    s_masked, s_plain = small["small 16K CP=2, document masks"], small["small 16K CP=2"]
    _says(f"the masks save less than their FLOPs: "
          f"{s_masked['steady_ms'] / s_plain['steady_ms']:.2f}x the time, "
          f"{s_masked['mfu'] / s_plain['mfu']:.2f}x the MFU")
    cp1 = _megatron("megatron_documents_cp1_h200x2.json")["small 16K CP=1, document masks"]
    _says(f"Losses with masks at CP=2 equal CP=1's ({s_masked['losses'][0]:.4f}, "
          f"{s_masked['losses'][1]:.4f}, {s_masked['losses'][2]:.4f} vs "
          f"{cp1['losses'][2]:.4f}, ...)")


def test_host_time_figures_are_the_run_on_file():
    rows = _load("h200x2_host_time.json")["rows"]
    host = [r for r in rows if r["part"] == "host"]
    burst_eager = [r["host_ms"] for r in host if r["case"].startswith("burst")
                   and r["mode"] == "eager" and "pack" not in r["case"]]
    repeated_pack = [r["host_ms"] for r in host if "pack" in r["case"]]
    burst_graph = [r["host_ms"] for r in host if r["case"].startswith("burst")
                   and r["mode"] == "CUDA graph"]
    sdpa_graph = [r["host_ms"] for r in host if "SDPA" in r["case"]
                  and r["mode"] == "CUDA graph"]
    _says(f"an eager `burst_attn` forward + backward at CP=2 costs {_span(burst_eager, '{:.1f}')}"
          f" ms of host time")
    _says(f"The run on file called one document pack again ({repeated_pack[0]:.1f} ms)")
    docs = _documents()
    new, same = (docs[8192, "32:8 d128", "lognormal", m]["host_ms"] for m in (NEW, SAME))
    _says(f"what a new pack adds: {new:.1f} against {same:.1f} ms of host time per call (8K "
          f"tokens per GPU, lognormal, 32:8)")
    _says(f"replayed, {_span(burst_graph)} ms, against {sdpa_graph[0]:.2f} ms for PyTorch's SDPA")
    eff = {(r["case"], r["mode"]): r["efficiency"] for r in rows
           if r["part"] == "efficiency" and "efficiency" in r}
    mha = eff["causal MHA 32:32 d128, 8192/GPU", "eager"]
    gqa = eff["causal GQA 32:8 d128, 8192/GPU", "eager"]
    small = [eff["causal GQA 16:4 d64, 8192/GPU", m] for m in ("eager", "CUDA graph")]
    _says(f"causal efficiency against cuDNN on one GPU is {mha:.2f} (MHA 32:32) and {gqa:.2f} "
          f"(GQA 32:8) at d 128")
    _says(f"{small[0]:.2f} -> {small[1]:.2f} with graphs at 16:4 heads of d 64")


def test_megatron_graphs_figures_are_the_runs_on_file():
    small = _megatron("megatron_graphs_small_h200x2.json")
    eager, graphed = small["small CP=2, eager"], small["small CP=2, CUDA graphs (local)"]
    one = small["small CP=1, CUDA graphs (local)"]
    _says(f"step {eager['steady_ms']:.0f} -> {graphed['steady_ms']:.0f} ms with the same losses, "
          f"{one['steady_ms'] / graphed['steady_ms']:.2f}x the tokens/s of CP=1 on one GPU "
          f"({one['steady_ms']:.0f} ms)")
    _says(f"its unmasked CP=2 step falls from {eager['steady_ms']:.0f} to "
          f"{graphed['steady_ms']:.0f} ms")
    for a, b in zip(eager["losses"], graphed["losses"]):
        assert abs(a - b) < 1e-3 * abs(a), "graphed and eager losses differ"
    big = _megatron("megatron_graphs_1b_h200x2.json")
    _says(f"(MFU {big['1b CP=2, eager']['mfu']:.3f} eager, "
          f"{big['1b CP=2, CUDA graphs (local)']['mfu']:.3f} graphed)")


def test_upstream_patch_figures_are_the_runs_on_file():
    runs = _megatron("megatron_upstream_h200x2.json")
    up, ours = "upstream pretrain_gpt.py + patch", "megatron_burst.megatron.pretrain_gpt"
    r = {(name.split(": ")[0], name.split(": ")[1]): run for name, run in runs.items()}
    assert all(run["rc"] == 0 for run in runs.values())
    docs_up, docs_ours = r["document masks", up], r["document masks", ours]
    _says(f"gives the entry point's losses ({docs_up['losses'][-1]:.6f} vs "
          f"{docs_ours['losses'][-1]:.6f} after {len(docs_ours['losses'])} iterations; "
          f"without it {r['default flags', up]['losses'][-1]:.3f})")
    plain = {way: r["full recompute", way]["steady_ms"] for way in (up, ours)}
    remat = {way: r["full recompute + remat-aware", way]["steady_ms"] for way in (up, ours)}
    _says(f"({plain[up]:.0f} -> {remat[up]:.0f} ms against {plain[ours]:.0f} -> "
          f"{remat[ours]:.0f} ms)")
    default = {way: r["default flags", way]["steady_ms"] for way in (up, ours)}
    _says(f"Upstream's own step was {default[up] / default[ours] - 1:.0%} slower than the entry "
          f"point's there ({default[up]:.0f} vs {default[ours]:.0f} ms; {docs_up['steady_ms']:.0f}"
          f" vs {docs_ours['steady_ms']:.0f} ms with document masks)")


# ------------------------------------------------------- two GPUs where training runs (issue 39)

ISSUE39 = "h100x2_issue39/"


def _rows39(name: str) -> list[dict]:
    return _load(ISSUE39 + name)["rows"]


def _host(side: str, case: str, mode: str = "eager") -> dict:
    return next(r for r in _rows39(f"h100x2_host_time_{side}.json")
                if r["case"] == case and r["mode"] == mode)


def _pack_row(side: str, part: str, per_gpu: int, mix: str, method: str) -> dict:
    return next(r for r in _rows39(f"h100x2_documents_{part}_{side}.json")
                if r["per_gpu"] == per_gpu and r["mix"] == mix and r["method"] == method)


def _pair(fmt: str, key) -> str:
    return " | ".join(fmt.format(key(side)) for side in ("before", "after"))


def test_two_gpu_host_rows_are_the_runs_on_file():
    ring, burst = "burst causal, ring bwd", "burst causal, burst bwd"
    both = lambda mode: lambda side: f"{_host(side, ring, mode)['host_ms']:.2f} / " \
        f"{_host(side, burst, mode)['host_ms']:.2f}"  # noqa: E731
    _says(f"| host ms of one CP=2 call, tiny tensors, eager (ring / burst backward) | "
          f"{_pair('{}', both('eager'))} |")
    _says(f"| CUDA-graph replay of a CP=2 call, host ms (ring / burst backward) | "
          f"{_pair('{}', both('CUDA graph'))} |")
    new = "burst whole_docs, new pack each call (eager only)"
    _says(f"| the same, a new `whole_docs` pack every call | "
          f"{_pair('{:.2f}', lambda side: _host(side, new)['host_ms'])} |")
    sdpa = "1 GPU SDPA (cuDNN), the whole sequence"
    _says(f"| one GPU's SDPA on the whole sequence, the host's floor, same runs | "
          f"{_pair('{:.2f}', lambda side: _host(side, sdpa)['host_ms'])} |")


def test_two_gpu_efficiency_rows_are_the_runs_on_file():
    cases = ("causal MHA 32:32 d128, 8192/GPU", "causal GQA 32:8 d128, 8192/GPU",
             "causal GQA 16:4 d64, 8192/GPU")
    three = lambda mode: lambda side: " / ".join(  # noqa: E731
        f"{_host(side, c, mode)['efficiency']:.2f}" for c in cases)
    _says(f"| 8K/GPU causal, no documents, eager (MHA 32:32 / GQA 32:8 / GQA 16:4 d64) | "
          f"{_pair('{}', three('eager'))} |")
    _says(f"| the same, CUDA graph | {_pair('{}', three('CUDA graph'))} |")


def test_two_gpu_document_rows_are_the_runs_on_file():
    eff = lambda part, n, mix, m: lambda side: _pack_row(  # noqa: E731
        side, part, n, mix, m)["efficiency_vs_1gpu"]
    _says(f"| new pack every call vs one GPU's varlen, 8K/GPU, 16:4 d64, uniform | "
          f"{_pair('{:.2f}', eff('8k16k', 8192, 'uniform', NEW))} |")
    _says(f"| the same pack again, 8K/GPU | "
          f"{_pair('{:.2f}', eff('8k16k', 8192, 'uniform', SAME))} |")
    _says(f"| new pack every call, 16K/GPU | "
          f"{_pair('{:.2f}', eff('8k16k', 16384, 'uniform', NEW))} |")
    _says(f"| the same pack again, 16K/GPU | "
          f"{_pair('{:.2f}', eff('8k16k', 16384, 'uniform', SAME))} |")
    two = lambda m: lambda side: " / ".join(  # noqa: E731
        f"{eff('32k', 32768, mix, m)(side):.2f}" for mix in ("uniform", "lognormal"))
    _says(f"| 32K/GPU, 32:8 d128, same pack again (uniform / lognormal) | "
          f"{_pair('{}', two(SAME))} |")
    _says(f"| 32K/GPU, new packs back to back, no sync (uniform / lognormal) | "
          f"{_pair('{}', two(BACK_TO_BACK))} |")


def test_two_gpu_megatron_row_is_the_run_on_file():
    runs = _megatron(ISSUE39 + "megatron_documents_small_h100x2_after.json")
    cp2 = runs["small 16K CP=2, document masks"]["steady_ms"]
    cp1 = runs["small 16K CP=1, document masks"]["steady_ms"]
    _says(f"{cp2:.0f} vs {cp1:.0f} ms: {cp1 / cp2:.2f}x")


def test_two_gpu_rows_added_for_every_target_are_the_runs_on_file():
    eff = lambda m: lambda side: " / ".join(  # noqa: E731
        f"{_pack_row(side, '32k', 32768, mix, m)['efficiency_vs_1gpu']:.2f}"
        for mix in ("uniform", "lognormal"))
    _says(f"| 32K/GPU, new pack every call (uniform / lognormal) | {_pair('{}', eff(NEW))} |")
    big = [r for r in _rows39("h100x2_host_time_before_runA.json")
           if r["mode"] == "eager" and r["case"].endswith("32768/GPU")]
    values = " / ".join(f"{r['efficiency']:.2f}" for r in big)
    _says(f"| 32K/GPU causal, eager (MHA 32:32 / GQA 32:8 / GQA 16:4 d64) | {values} "
          f"(`h100x2_host_time_before_runA`) |")
    sdpa = "1 GPU SDPA (cuDNN), the whole sequence"
    _says("one GPU's SDPA replay, same runs: " + " / ".join(
        f"{_host(side, sdpa, 'CUDA graph')['host_ms']:.2f}" for side in ("before", "after")))


def test_two_gpu_text_figures_are_the_probe_and_runs_on_file():
    from .test_host_path import BUDGETS

    probe = _load(ISSUE39 + "h100x2_host_ops_nccl_env_probe.json")
    ring = next(c for c in probe["calls"] if c["case"] == "plain causal, ring bwd")
    post = {k: round(v["median_us"]) for k, v in ring["posting"].items()}
    _says(f"a hop costs {post['post_ops']} us of host time")
    _says(f"(`send` {post['send']} us, `recv` {post['recv']} us, `_end_coalescing` "
          f"{post['_end_coalescing']} us")
    blocks = {k: round(v) for k, v in probe["building_blocks_us"].items()}
    _says(f"Launching one cuDNN forward costs {blocks['cuDNN fwd op (256 tok)']} us, a flash "
          f"backward {blocks['flash bwd op']}")
    _says(f"the fused merge's Triton launch {blocks['triton merge launch']} us, an event "
          f"{blocks['event record']} us")
    _says(f"within {BUDGETS['plain ring']:,} / {BUDGETS['new pack']:,}")
    same = _pack_row("after", "8k16k", 8192, "uniform", SAME)["host_ms"]
    new = _pack_row("after", "8k16k", 8192, "uniform", NEW)["host_ms"]
    one = _pack_row("after", "8k16k", 8192, "uniform",
                    "1 GPU varlen kernel alone (pack planned before)")["ms"]
    _says(f"{same:.2f} ms for a pack seen before and {new:.2f} ms for a new one, while one\n"
          f"GPU runs the whole pack in {one:.2f} ms")
    ratios = [_pack_row("after", "32k", 32768, mix, NEW)["fresh_over_repeated"]
              for mix in ("uniform", "lognormal")]
    _says(f"the medians over the packs are {ratios[0]:.2f}x and {ratios[1]:.2f}x the\n"
          f"same pack again")
    runs = _megatron(ISSUE39 + "megatron_documents_small_h100x2_after.json")
    losses = [runs[f"small 16K CP={cp}, document masks"]["losses"][-1] for cp in (2, 1)]
    _says(f"losses agree ({losses[0]:.5f} at CP=2, {losses[1]:.5f} at CP=1, iteration "
          f"{len(runs['small 16K CP=2, document masks']['losses'])})")


def test_two_gpu_test_count_is_the_run_on_file():
    dots = (RESULTS / ISSUE39 / "gpu_tests_h100x2_after.txt").read_text().strip()
    _says(f"({dots.count('.')} passed, {dots.count('s')} needs 4 GPUs)")


def _mask_table_said(table, json_name: str) -> dict:
    """Every row of a slice_masks.md table (the header and the twelve families) is in the
    README; returns its JSON's rows by family."""
    rows = [line for line in table.read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 13
    for line in rows:
        _says(line)
    return {r["family"]: r for r in _load(json_name)["rows"]}


def _at_least(run: dict, bar: float) -> list[int]:
    """How many families reach ``bar``: forward eager, captured, backward eager, captured."""
    return [sum(r[key] >= bar for r in run.values()) for key in (
        "efficiency_fwd", "efficiency_graph_fwd", "efficiency_bwd", "efficiency_graph_bwd")]


def test_slice_mask_table_is_the_run_on_file():
    """The README's slice-mask table is the benchmark's printout on file, row for row; the
    efficiencies and before/after figures its text quotes are the runs on file."""
    folder = RESULTS / "h200x2_issue42_flex_cp"
    run = _mask_table_said(folder / "slice_masks.md", "h200x2_issue42_flex_cp/slice_masks.json")
    assert _at_least(run, 0.75) == [5, 9, 9, 12]
    _says("The forward reaches the issue's 0.75 in\nfive families of twelve eager")
    _says("and nine captured; the backward in nine eager and\nall twelve captured")
    for family, words in (("full", "full"), ("causal", "causal"),
                          ("full_document", "full documents"),
                          ("prefix_lm_causal", "prefix-LM\ncausal"),
                          ("prefix_lm_document", "prefix-LM documents")):
        _says(f"{words} {run[family]['efficiency_fwd']:.2f}")
    low = {f: r["efficiency_graph_fwd"] for f, r in run.items() if r["efficiency_graph_fwd"] < 0.75}
    assert set(low) == {"causal_blockwise", "sliding_window_causal", "global_sliding_window"}
    _says(f"causal blockwise ({low['causal_blockwise']:.2f}), the causal window "
          f"({low['sliding_window_causal']:.2f})\nand the global window "
          f"({low['global_sliding_window']:.2f})")
    ratio = {f: r["burst"]["fwd_bwd_tflops"] / r["torch_flex_cp"]["fwd_bwd_tflops"]
             for f, r in run.items()}
    faster = sorted(x for x in ratio.values() if x > 1)
    assert len(faster) == 10
    _says(f"ten families of twelve\n({faster[0]:.2f}x to {faster[-1]:.2f}x, both eager)")
    _says(f"sliding window ({ratio['sliding_window']:.2f}x) and the global\nsliding window "
          f"({ratio['global_sliding_window']:.2f}x; its 1,024 rows that see every key put "
          f"{run['global_sliding_window']['balance_area']:.3f}x")
    errs = [r["torch_flex_cp"]["rel_err_vs_one_gpu"] for r in run.values()]
    short = lambda x: f"{x:.1e}".replace("e-0", "e-")  # noqa: E731  (3.2e-3)
    _says(f"every family within\n{short(max(errs))} of one GPU's output")
    _says(f"every\nfamily within {short(max(r['rel_err_vs_one_gpu'] for r in run.values()))} of "
          "one GPU")
    last = {r["family"]: r for r in _load("h200x2_issue42_coalesced/slice_masks.json")["rows"]}
    now = {r["family"]: r for r in _load("h200x2_issue42_one_block/slice_masks.json")["rows"]}
    b, a = now["shared_question"], last["shared_question"]
    _says(f"its forward {b['burst']['fwd_tflops']:.0f} to {a['burst']['fwd_tflops']:.0f} TFLOP/s "
          f"per GPU ({b['efficiency_fwd']:.2f} to {a['efficiency_fwd']:.2f}),\nbackward "
          f"{b['burst']['bwd_tflops']:.0f} to {a['burst']['bwd_tflops']:.0f}")
    after = {r["family"]: r for r in _load("h200x2_issue42_area_edges/slice_masks.json")["rows"]}
    before = {r["family"]: r for r in
              _load("h200x2_issue42_area_edges/before_slice_masks.json")["rows"]}
    _says(f"the causal family's forward {after['causal']['burst']['fwd_tflops']:.0f} to "
          f"{now['causal']['burst']['fwd_tflops']:.0f}\nTFLOP/s per GPU "
          f"({after['causal']['efficiency_fwd']:.2f} to {now['causal']['efficiency_fwd']:.2f};")
    b, a = before["sliding_window_causal"]["burst"], after["sliding_window_causal"]["burst"]
    _says(f"forward {b['fwd_tflops']:.0f} to {a['fwd_tflops']:.0f} TFLOP/s per GPU,\n"
          f"backward {b['bwd_tflops']:.0f} to {a['bwd_tflops']:.0f}")
    b, a = before["causal_document"]["burst"], after["causal_document"]["burst"]
    _says(f"causal documents {b['fwd_tflops']:.0f} / {b['bwd_tflops']:.0f} to "
          f"{a['fwd_tflops']:.0f} / {a['bwd_tflops']:.0f}")
    fresh = _load("h200x2_issue42_after/slice_masks.json")["rows"]
    old = _load("h200x2_issue42_after/before_slice_masks_fresh.json")["rows"]
    new_tf = [r["burst_fresh"]["tflops"] for r in fresh if r.get("burst_fresh")]
    old_tf = [r["burst_fresh"]["tflops"] for r in old if r.get("burst_fresh")]
    _says(f"{min(old_tf):.2f}-{max(old_tf):.2f} TFLOP/s per GPU\nbefore, "
          f"{min(new_tf):.0f}-{max(new_tf):.0f} after")


def test_auto_figures_are_the_runs_on_file():
    folder = "h200x2_issue41_nov26/"
    runs = {tag: _load(f"{folder}{pre}auto_check{tag}.json")["meta"]
            for pre in ("",) for tag in ("", "_25gbps", "_50gbps")}
    before = {tag: _load(f"{folder}before_auto_check{tag}.json")["meta"]
              for tag in ("", "_25gbps", "_50gbps")}
    for tag, seconds in (("", "8.9 s"), ("_25gbps", "5.1 s"), ("_50gbps", "4.7 s")):
        assert any(f"in {seconds} at first use" in line for line in runs[tag]["auto_log"])
        _says(seconds)
    _says(f"within {runs['']['worst_auto_over_best']:.2f} of the best forced")
    _says(f"({runs['_25gbps']['worst_auto_over_best']:.2f} under\nemulated 25 GB/s links, "
          f"where it was {before['_25gbps']['worst_auto_over_best']:.2f} before")
    _says(f"{runs['_50gbps']['worst_auto_over_best']:.2f} under\n50 GB/s")
    within = [m["rows_model_within_15pct"].split(" of ")[0] for m in runs.values()]
    was = [m["rows_model_within_15pct"].split(" of ")[0] for m in before.values()]
    _says(f"within 15% in {within[0]} of 32 rows ({within[1]} and {within[2]} of 32 emulated; "
          f"{was[0]}, {was[1]} and {was[2]}\nbefore)")


def _first_use_seconds(runs: list[dict]) -> list[str]:
    """How long each run's first use took, as its log says it ("7.8 s")."""
    seconds = []
    for m in runs:
        (line,) = [x for x in m["auto_log"] if "at first use" in x]
        seconds.append(line.split(" in ")[1].split(" at first use")[0])
    return seconds


def test_host_figures_are_the_runs_on_file():
    folder = "h100x2_issue41_host/"
    tags = ("", "_25gbps", "_50gbps")
    runs = [_load(f"{folder}l2_model/auto_check{t}.json")["meta"] for t in tags]
    before = [_load(f"{folder}auto_check{t}.json")["meta"] for t in tags]
    within = [m["rows_model_within_15pct"].split(" of ")[0] for m in runs]
    was = [m["rows_model_within_15pct"].split(" of ")[0] for m in before]
    _says(f"the model within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows")
    _says(f"{was[0]}, {was[1]} and {was[2]} in the run before it)")
    worst = [f"{m['worst_auto_over_best']:.2f}" for m in runs]
    _says(f"auto within {worst[0]}, {worst[1]} and\n{worst[2]} of the best")
    seconds = _first_use_seconds(runs)
    _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]}")
    profile = _load(f"{folder}first_run/profile_50gbps.json")
    _says(f"{profile['call_overhead_us']:,.0f} us a call")
    gap = _load(f"{folder}host_gap.json")["auto_against_forced"]
    assert 0.3 <= gap["host_ms"]["auto"] - gap["host_ms"]["forced"] <= 0.57
    # the root-sum-of-squares law with each row's own host time (model_replay --row-host)
    import sys
    sys.path.insert(0, str(RESULTS.parents[0]))
    import model_replay
    from megatron_burst.decide.timing import Profile

    within = recorded = total = 0
    for sub, tags in (("", ("", "_25gbps", "_50gbps")), ("first_run/", ("_25gbps", "_50gbps"))):
        for tag in tags:
            prof = Profile.from_json(_load(f"{folder}{sub}profile{tag}.json"))
            rows = model_replay.replay(_load(f"{folder}{sub}auto_check{tag}.json"), prof, True)
            within += sum(abs(r["ms"] / r["replayed_ms"] - 1) <= 0.15 for r in rows)
            recorded += sum(abs(r["ms"] / r["predicted_ms"] - 1) <= 0.15 for r in rows)
            total += len(rows)
    _says(f"{within} of\n{total} rows of two runs within 15%, where the model of the day had "
          f"{recorded}")


def test_auto_figures_after_the_emulator_fix_are_the_runs_on_file():
    folder = "h200x2_issue41_emulator_fix/"
    runs = [_load(f"{folder}auto_check{tag}.json")["meta"] for tag in ("", "_25gbps", "_50gbps")]
    worst = [f"{m['worst_auto_over_best']:.2f}" for m in runs]
    _says(f"auto within {worst[0]}, {worst[1]} and {worst[2]} of the\nbest")
    within = [m["rows_model_within_15pct"].split(" of ")[0] for m in runs]
    _says(f"the model within 15% in {within[0]},\n{within[1]} and {within[2]} of 32 rows")
    seconds = _first_use_seconds(runs)
    _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]}")
    rows = [r for m in ("", "_25gbps", "_50gbps")
            for r in _load(f"{folder}auto_check{m}.json")["rows"] if "measured_over_predicted" in r]
    big = [r["measured_over_predicted"] for r in rows if r["per_gpu"] == 32768]
    small = [r["measured_over_predicted"] for r in rows if r["per_gpu"] == 8192]
    machine = [r["measured_over_predicted"] for r in _load(f"{folder}auto_check.json")["rows"]
               if r["per_gpu"] == 32768 and "measured_over_predicted" in r]
    _says(f"the 32K rows run {_span(big)}\nof their predictions ({_span(machine)} on the machine)")
    _says(f"the 8K rows {_span(small)}")
    rejected = _load("h200x2_issue41_host_hidden_rejected/auto_check.json")["meta"]
    _says(f"({rejected['rows_model_within_15pct'].split(' of ')[0]} of 32 rows,\nauto "
          f"{rejected['worst_auto_over_best']:.2f};")
    (test,) = [x for x in (RESULTS / folder / "gpu_tests_megatron_first_use.txt").read_text()
               .splitlines() if x.startswith("first call with the measurement")][:1]
    _says(f"({test.split(': ')[1].split(';')[0]} with the call on 2x H200")


def test_merge_at_plan_figures_are_the_run_on_file():
    folder = "h200x2_issue39_merge_at_plan/"

    def row(side):
        rows = _load(f"{folder}documents_32k_{side}.json")["rows"]
        return next(r for r in rows if r["mix"] == "uniform"
                    and r["method"] == "burst whole_docs, new pack each call")

    before, after = row("before"), row("after")
    _says(f"(mean {before['ms']:.2f} to {after['ms']:.2f} ms, the slowest call "
          f"{before['ms_max']:.1f}\nto {after['ms_max']:.1f} ms)")


def test_pack_zigzag_table_and_figures_are_the_run_on_file():
    """The layouts' table is `benchmarks/layouts_table.py` of the run on file, and the text's
    ranges are read from the same JSON."""
    import importlib.util

    folder = RESULTS / "h100x2_issue39_own_launch"
    spec = importlib.util.spec_from_file_location(
        "layouts_table", RESULTS.parent / "layouts_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.table(str(folder / "documents_pack_zigzag.json")).split("\n", 2)[2]
    for line in table.strip().splitlines():
        _says(line)
    rows = [r for r in _load("h100x2_issue39_own_launch/documents_pack_zigzag.json")
            ["rows"] if r["method"].startswith("burst ")]

    def pick(per_gpu=None, heads=None, mixes=("lognormal", "uniform"), method=""):
        return [r for r in rows if (per_gpu is None or r["per_gpu"] == per_gpu)
                and (heads is None or r["heads"] == heads) and r["mix"] in mixes
                and r["method"].startswith(method)]

    small_new = pick(heads="16:4", method="burst whole_docs, new pack each")
    small_graph = pick(heads="16:4", method="burst pack_zigzag+graph, new pack each")
    _says(f"rows go from {_span([r['efficiency_vs_1gpu'] for r in small_new])} (whole_docs, "
          f"a new pack each call) to {_span([r['efficiency_vs_1gpu'] for r in small_graph])}")
    _says(f"host time from {_span([r['host_ms'] for r in small_new], '{:.1f}')} ms to "
          f"{_span([r['host_ms'] for r in small_graph])} ms")
    tiny = [r for r in pick(mixes=("tiny",), method="burst pack_zigzag")
            if "same pack" not in r["method"]]
    _says(f"packs of tiny documents run at {_span([r['efficiency_vs_1gpu'] for r in tiny])}")
    shown = lambda found: [r for r in found if "same pack" not in r["method"]]  # noqa: E731
    big_whole = shown(pick(16384, "32:8", method="burst whole_docs"))
    big_graph = shown(pick(16384, "32:8", method="burst pack_zigzag+graph"))
    _says(f"reaches {_span([r['efficiency_vs_1gpu'] for r in big_whole])}, `pack_zigzag` with "
          f"graphs reaches {_span([r['efficiency_vs_1gpu'] for r in big_graph])}")
    errors = [float(x) for line in (folder / "gpu_tests.txt").read_text().splitlines()
              if line.startswith("{'case'")
              for x in __import__("re").findall(r"'err_\w+': ([0-9.e-]+)", line)]
    _says(f"relative errors {min(errors):.1e} to {max(errors):.1e}".replace("e-0", "e-"))


def _kernel_profile(path: str) -> tuple[float, dict]:
    """(ms per call in kernels other than NCCL's, kernel name -> [(launches, ms)]) of a
    ``benchmarks/kernel_profile.py`` table (NCCL's time includes waiting for the peer)."""
    kernels: dict = {}
    for line in (RESULTS / path).read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[1].replace(".", "").isdigit():
            kernels.setdefault(cells[0], []).append((float(cells[1]), float(cells[2])))
    work = sum(ms for name, got in kernels.items() if not name.startswith("nccl")
               for _, ms in got)
    return work, kernels


def test_pack_zigzag_reasons_are_the_profiles_and_probe_on_file():
    """The 'where it stands' paragraph: the kernel profiles and the diagonal probe, read
    from their files."""
    before, k_before = _kernel_profile("h100x2_issue39_kernel_profile/before_merge/"
                                       "pack_zigzag.txt")
    after, _ = _kernel_profile("h100x2_issue39_kernel_profile/after_merge/pack_zigzag.txt")
    own, _ = _kernel_profile("h100x2_issue39_own_launch/kprof/pack_zigzag.txt")
    whole, _ = _kernel_profile("h100x2_issue39_own_launch/kprof/whole_docs.txt")
    _says(f"pack_zigzag first took {before:.1f} ms per call against whole_docs' {whole:.1f}")
    ((launches, merges),) = k_before["_merge_kernel"]
    _says(f"The merges were three of {merges / launches:.2f} ms each")
    assert launches == 3.0
    _says(f"nothing of: {after:.1f} ms")
    _says(f"(rounded once either way): {own:.1f} ms")
    probe = _load("h100x2_issue39_diagonal_grid/diagonal_grid.json")["rows"]
    cases: dict = {}
    for r in probe:
        cases.setdefault((r["chunk"], r["heads"], r["mix"]), {})[r["variant"]] = r["ms"]
    usual = [v["padded"] / v["docs"] for (_, _, mix), v in cases.items() if mix != "tiny"]
    tiny = [v["padded"] / v["docs"] for (_, _, mix), v in cases.items() if mix == "tiny"]
    _says(f"costs {round(100 * min(usual) - 100)}-{round(100 * max(usual) - 100)}% over a call")
    _says(f"({min(tiny):.1f}-{max(tiny):.1f}x)")

    def effs(folder):
        return {(r["per_gpu"], r["heads"], r["mix"]): r["efficiency_vs_1gpu"]
                for r in _load(f"{folder}/documents_pack_zigzag.json")["rows"]
                if r["method"] == "burst whole_docs, new pack each call"}

    runs = [effs(f) for f in ("h100x2_issue39_pack_zigzag_spans", "h100x2_issue39_after_merge",
                              "h100x2_issue39_own_launch")]
    moved = max(abs(a[k] - b[k]) for a in runs for b in runs for k in a)
    assert 0.15 < moved <= 0.2 + 0.005, moved  # "move by up to 0.2 between sessions"


def test_issue39_captured_pack_figures_are_the_run_on_file():
    folder = "h100x2_issue39_after_merge/"
    rows = _load("h100x2_issue39_own_launch/documents_pack_zigzag.json")["rows"]

    def get(per_gpu, layout):
        return next(r for r in rows if r["per_gpu"] == per_gpu and r["heads"] == "16:4"
                    and r["mix"] == "uniform"
                    and r["method"] == f"burst {layout}, new pack each call")

    g8, g16 = get(8192, "pack_zigzag+graph"), get(16384, "pack_zigzag+graph")
    w8, w16 = get(8192, "whole_docs"), get(16384, "whole_docs")
    _says(f"at 8K/GPU 16:4 d64 uniform {g8['efficiency_vs_1gpu']:.2f} of one GPU's varlen "
          f"kernel against whole_docs' {w8['efficiency_vs_1gpu']:.2f} in the same run")
    _says(f"at 16K {g16['efficiency_vs_1gpu']:.2f} against {w16['efficiency_vs_1gpu']:.2f}")
    _says(f"the replay's host time {g8['host_ms']:.2f} and {g16['host_ms']:.2f} ms per call")
    plain = _load(folder + "h100x2_host_time.json")["rows"]

    def figure(case, mode, key="efficiency"):
        return next(r[key] for r in plain if r.get("case") == case and r["mode"] == mode)

    heads = ("MHA 32:32 d128", "GQA 32:8 d128", "GQA 16:4 d64")
    at = lambda n, mode: " / ".join(  # noqa: E731
        f"{figure(f'causal {h}, {n}/GPU', mode):.2f}" for h in heads)
    _says(f"{at(8192, 'eager')} eager and {at(8192, 'CUDA graph')} in a CUDA graph")
    _says(f"at 32K/GPU {at(32768, 'eager')} eager")
    sdpa = figure("1 GPU SDPA (cuDNN), the whole sequence", "eager", "host_ms")
    ring = figure("burst causal, ring bwd", "eager", "host_ms")
    burst = figure("burst causal, burst bwd", "eager", "host_ms")
    _says(f"one GPU's SDPA call took {sdpa:.2f} ms of host time")
    _says(f"a CP=2 call on tiny tensors {ring:.2f} / {burst:.2f} ms (ring / burst backward)")


def test_auto_figures_after_the_sibling_check_are_the_runs_on_file():
    folder = "h200x2_issue41_sibling/"

    def metas(side):
        return [_load(f"{folder}{side}/auto_check{t}.json")["meta"]
                for t in ("", "_25gbps", "_50gbps")]

    def worst(ms):
        return [f"{m['worst_auto_over_best']:.2f}" for m in ms]

    def within(ms):
        return [m["rows_model_within_15pct"].split(" of ")[0] for m in ms]

    before, after = metas("before"), metas("after")
    _says(f"auto was within {worst(before)[0]}, {worst(before)[1]} and {worst(before)[2]} of "
          f"the best")
    _says(f"within {worst(after)[0]}, {worst(after)[1]} and {worst(after)[2]} of the best in "
          f"every cell")
    _says(f"the model within 15% in {within(after)[0]}, {within(after)[1]} and "
          f"{within(after)[2]} of 32 rows ({within(before)[0]}, {within(before)[1]} and "
          f"{within(before)[2]} before")
    seconds = []
    for m in after:
        (line,) = [x for x in m["auto_log"] if "at first use" in x]
        seconds.append(line.split(" in ")[1].split(" at first use")[0])
    _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]}")


def test_megatron_pack_zigzag_figures_are_the_run_on_file():
    runs = {r["name"]: r for r in _load(
        "h100x2_issue39_megatron_pack_zigzag/megatron_graphs_documents.json")["runs"]}
    zig = runs["small CP=2, documents pack_zigzag, eager"]
    whole = runs["small CP=2, documents whole_docs, eager"]
    one = runs["small CP=1, documents whole_docs, eager"]
    _says(f"CP=2 takes {zig['steady_ms']:.0f} ms per iteration in pack_zigzag against "
          f"{whole['steady_ms']:.0f} in whole_docs and {one['steady_ms']:.0f} at CP=1")
    gap = max(abs(a - b) for a, b in zip(zig["losses"], one["losses"]))
    gap_whole = max(abs(a - b) for a, b in zip(whole["losses"], one["losses"]))
    _says(f"its losses follow CP=1's within {gap:.1e} over {len(zig['losses'])} iterations "
          f"(whole_docs' within {gap_whole:.1e}")
    assert all(runs[n]["rc"] != 0 for n in runs if "CUDA graphs" in n)  # as the README says


def test_megatron_pack_zigzag_graphed_figures_are_the_run_on_file():
    runs = {r["name"]: r for r in _load(
        "h100x2_issue39_megatron_graphs/megatron_graphs_documents.json")["runs"]}
    assert all(r["rc"] == 0 for r in runs.values())
    g2 = runs["small CP=2, documents pack_zigzag, CUDA graphs (local)"]
    e2 = runs["small CP=2, documents pack_zigzag, eager"]
    w2 = runs["small CP=2, documents whole_docs, eager"]
    e1 = runs["small CP=1, documents whole_docs, eager"]
    g1 = runs["small CP=1, documents pack_zigzag, CUDA graphs (local)"]
    _says(f"in CUDA graphs, CP=2 takes {g2['steady_ms']:.0f} ms per iteration in pack_zigzag "
          f"against {e2['steady_ms']:.0f} eager in the same layout and {w2['steady_ms']:.0f} "
          f"eager in whole_docs; CP=1 takes {e1['steady_ms']:.0f} eager (whole_docs) and "
          f"{g1['steady_ms']:.0f} in graphs (pack_zigzag)")
    _says(f"captured CP=2 is {e1['steady_ms'] / g2['steady_ms']:.2f}x CP=1's eager step and "
          f"{g1['steady_ms'] / g2['steady_ms']:.2f}x its captured step")
    _says(f"eager CP=2 {e1['steady_ms'] / e2['steady_ms']:.2f}x (target >= 1.7x")
    old = {r["name"]: r for r in _load(
        "h100x2_issue39_megatron_pack_zigzag/megatron_graphs_documents.json")["runs"]}
    moved = max(abs(runs[n]["steady_ms"] / r["steady_ms"] - 1) for n, r in old.items()
                if r.get("steady_ms"))
    _says(f"eager figures differ by up to {100 * moved:.0f}%")
    gap = max(abs(a - b) for a, b in zip(g2["losses"], g1["losses"]))
    _says(f"losses follow the graphed CP=1 run's within {gap:.1e} over {len(g2['losses'])} "
          f"iterations")


def test_auto_figures_on_h100_are_the_runs_on_file():
    metas = [_load(f"h100x2_issue41_h100/auto_check{t}.json")["meta"]
             for t in ("", "_25gbps", "_50gbps")]
    assert all("H100" in m["device"] for m in metas)
    worst = [f"{m['worst_auto_over_best']:.2f}" for m in metas]
    within = [m["rows_model_within_15pct"].split(" of ")[0] for m in metas]
    seconds = []
    for m in metas:
        (line,) = [x for x in m["auto_log"] if "at first use" in x]
        seconds.append(line.split(" in ")[1].split(" at first use")[0])
    _says(f"(`benchmarks/results/h100x2_issue41_h100/`, 2x H100, one session, the same check): "
          f"within {worst[0]}, {worst[1]} and {worst[2]} of the best in every cell")
    _says(f"the model within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows "
          f"(target: every row, missed); first use {seconds[0]}, {seconds[1]} and {seconds[2]}")


def test_megatron_own_launch_figures_are_the_runs_on_file():
    folder = "h100x2_issue39_own_launch/"
    graphs = {r["name"]: r for r in _load(
        folder + "megatron_graphs/megatron_graphs_documents.json")["runs"]}
    cp2 = {r["name"]: r for r in _load(
        folder + "megatron_cp2/megatron_graphs_documents.json")["runs"]}
    assert all(r["rc"] == 0 for r in [*graphs.values(), *cp2.values()])
    g2 = graphs["small CP=2, documents pack_zigzag, CUDA graphs (local)"]
    g1 = graphs["small CP=1, documents pack_zigzag, CUDA graphs (local)"]
    e2 = cp2["small CP=2, documents pack_zigzag, eager"]
    c2 = cp2["small CP=2, documents pack_zigzag, CUDA graphs (local)"]
    gap = max(abs(a - b) for a, b in zip(g2["losses"], g1["losses"]))
    _says(f"captured CP=2 {g2['steady_ms']:.0f} ms against captured CP=1 {g1['steady_ms']:.0f} "
          f"ms in one run, {g1['steady_ms'] / g2['steady_ms']:.2f}x (target >= 1.85x: missed), "
          f"losses within {gap:.1e}")
    _says(f"CP=2 pack_zigzag {e2['steady_ms']:.0f} ms eager against {c2['steady_ms']:.0f} ms "
          f"captured in the other")


def test_auto_model_misses_on_h100_are_the_run_on_file():
    rows = [r for r in _load("h100x2_issue41_h100/auto_check.json")["rows"]
            if r.get("predicted_ms")]
    flat = "ulysses 1 x flat ring 2, backward "

    def case(r):
        return r["per_gpu"], r["heads"], r["mask"]

    slower = []
    for r in rows:
        if r["topology"].endswith(flat + "burst"):
            ring = [x for x in rows if case(x) == case(r) and x["topology"].endswith(flat + "ring")]
            assert all(x["predicted_ms"] == r["predicted_ms"] for x in ring)  # "alike"
            slower.append(r["ms"] / min(x["ms"] for x in ring) - 1)
    assert len(slower) >= 8 and min(slower) > 0
    _says(f"the burst backward ran {100 * min(slower):.0f}-{100 * max(slower):.0f}% slower than "
          f"the ring backward in every case")
    short = [r["ms"] / r["predicted_ms"] - 1 for r in rows
             if r["per_gpu"] == 32768 and r["topology"].endswith(flat + "ring")]
    _says(f"it predicts the 32K flat-ring rows (ring backward) {100 * min(short):.0f}-"
          f"{100 * max(short):.0f}% short")


def test_bf16_wire_figures_are_the_runs_on_file():
    folder = "h100x2_issue39_wire/"

    def efficiency(which: str) -> dict:
        rows = _load(f"{folder}{which}/host_time.json")["rows"]
        return {(r["case"], r["mode"]): r["efficiency"] for r in rows if r.get("efficiency")}

    cases = [f"causal {h}, 8192/GPU" for h in ("MHA 32:32 d128", "GQA 32:8 d128",
                                                "GQA 16:4 d64")]
    for mode, words in (("eager", "eager"), ("CUDA graph", "in a CUDA graph")):
        before, after = (" / ".join(f"{efficiency(w)[c, mode]:.3f}" for c in cases)
                         for w in ("before", "after"))
        _says(f"{words} {before} before and {after} after")

    def pack(which: str) -> float:
        (r,) = [r for r in _load(f"{folder}{which}/documents.json")["rows"]
                if r["per_gpu"] == 16384 and r["heads"] == "32:8" and r["mix"] == "uniform"
                and r["method"] == "burst pack_zigzag+graph, new pack each call"]
        return r["efficiency_vs_1gpu"]

    _says(f"uniform: {pack('before'):.2f} before, {pack('after'):.2f} after")
    nccl = []
    for which in ("before", "after"):
        text = (RESULTS / f"{folder}{which}/kprof/pack_zigzag.txt").read_text()
        (line,) = [x for x in text.splitlines() if x.startswith("| ncclDevKernel_SendRecv")]
        nccl.append(line.split("|")[3].strip())
    _says(f"NCCL's kernels in such a call: {nccl[0]} ms before, {nccl[1]} after")
    busy = []
    for rank in (0, 1):
        first = (RESULTS / f"{folder}timeline/pack_zigzag+graph_timeline_rank{rank}.txt"
                 ).read_text().splitlines()[0]
        busy.append(float(first.split("running ")[1].split(" ms")[0]))
    (one,) = [r for r in _load(f"{folder}after/documents.json")["rows"]
              if r["per_gpu"] == 16384 and r["heads"] == "32:8" and r["mix"] == "uniform"
              and r["method"] == "1 GPU varlen flash, new pack each call"]
    _says(f"take {_span(busy, '{:.1f}')} ms a GPU where one GPU runs the whole pack in "
          f"{one['ms']:.2f} ms, so {_span([one['ms'] / 2 / b for b in busy])} at best")
    runs = {r["name"]: r for r in _load(
        f"{folder}megatron_graphs/megatron_graphs_documents.json")["runs"]}
    g2, g1 = (runs[f"small CP={c}, documents pack_zigzag, CUDA graphs (local)"] for c in (2, 1))
    _says(f"CP=2 {g2['steady_ms']:.0f} ms against CP=1 {g1['steady_ms']:.0f} ms, "
          f"{g1['steady_ms'] / g2['steady_ms']:.2f}x (target >= 1.85x: missed)")
    assert "24 of 32 tensors bit for bit" in (RESULTS / f"{folder}gpu_test_wire.txt").read_text()


def _auto_three(folder: str) -> tuple[list, list, list, list, list]:
    """The three auto_check runs of ``folder`` (the machine's links, 25 and 50 GB/s): the
    runs, and each one's rows of the model within 15%, worst auto/best (as the README
    rounds it) and first use's seconds; and the machine's 8K causal measured/predicted."""
    runs = [_load(f"{folder}auto_check{t}.json") for t in ("", "_25gbps", "_50gbps")]
    metas = [r["meta"] for r in runs]
    assert all("H100" in m["device"] for m in metas)
    within = [m["rows_model_within_15pct"].split(" of ")[0] for m in metas]
    worst = [f"{m['worst_auto_over_best']:.2f}" for m in metas]
    seconds = [[x for x in m["auto_log"] if "at first use" in x][0].split(" in ")[1]
               .split(" s at first use")[0] for m in metas]
    causal = [r["measured_over_predicted"] for r in runs[0]["rows"]
              if "measured_over_predicted" in r and r["per_gpu"] == 8192
              and r["mask"] == "causal"]
    return runs, within, worst, seconds, causal


def test_time_model_after_the_settled_clock_is_the_runs_on_file():
    runs, within, worst, seconds, causal = _auto_three("h100x2_issue41_wire/final/")
    _says(f"The model within 15% in {within[0]}, {within[1]} and {within[2]} of 32")
    _says(f"auto within {worst[0]}, {worst[1]} and {worst[2]} of the best")
    _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]} s (target 10 s: met)")
    _says(f"the 8K causal rows run {_span(causal)} of their predictions on the machine")
    docs = [r["measured_over_predicted"] for r in runs[1]["rows"]
            if "measured_over_predicted" in r and r["per_gpu"] == 8192
            and r["mask"] == "documents" and r["method"].startswith(("flat", "auto"))]
    _says(f"the 8K document rows at 25 GB/s {_span(docs)}")
    burst = sorted(r["measured_over_predicted"] for run in runs for r in run["rows"]
                   if r["method"].startswith("flat ring 2, burst"))
    _says(f"four of the flat ring's burst backward rows {_span(burst[-4:])}")


def test_upstream_patch_figures_on_h100_are_the_runs_on_file():
    folder = "h100x2_upstream_issue39_42/"
    gaps, ms = {}, {}
    for case in ("prefix-LM", "pack_zigzag"):
        up, own = _load(f"{folder}upstream_{case}.json")["runs"]
        assert "upstream" in up["name"] and up["rc"] == own["rc"] == 0
        gaps[case] = max(abs(a - b) for a, b in zip(up["losses"], own["losses"]))
        ms[case] = (up["steady_ms"], own["steady_ms"])
    def sci(x: float) -> str:  # 1.2e-4, as the README writes it
        mantissa, exponent = f"{x:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"

    _says(f"gives the entry point's losses within {sci(gaps['prefix-LM'])} over 6 iterations")
    _says(f"within {sci(gaps['pack_zigzag'])} ({ms['pack_zigzag'][0]:.0f} and "
          f"{ms['pack_zigzag'][1]:.0f} ms per iteration)")


def test_time_model_with_new_packs_is_the_runs_on_file():
    runs, within, worst, seconds, causal = _auto_three("h100x2_issue41_new_packs/b_ccc1172/")
    _says(f"The model within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows "
          f"(machine, 25 and 50 GB/s")
    _says(f"auto within {worst[0]}, {worst[1]} and {worst[2]} of the best (target 1.05: "
          f"missed in two 8K document cells")
    _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]} s (target 10 s: met)")
    _says(f"the 8K causal rows run {_span(causal)} of their predictions on the machine")
    rows = [r for r in runs[0]["rows"] if "measured_over_predicted" in r]
    docs = [r["measured_over_predicted"] for r in rows
            if r["per_gpu"] == 32768 and r["mask"] == "documents"]
    _says(f"the 32K document rows {_span(docs)}")
    before = _load("h100x2_issue41_interleaved/auto_check.json")["meta"]["auto_log"]
    slow = [x for x in before if "at first use" in x][0].split(" in ")[1].split(" s at")[0]
    _says(f"most of first use's {slow} s")


def test_auto_with_rotated_rounds_is_the_runs_on_file():
    runs, within, worst, seconds, _ = _auto_three("h100x2_issue41_new_packs/d_4d2299b/")
    _says(f"auto within {worst[0]}, {worst[1]} and {worst[2]} of the best (target 1.05: met "
          f"in every cell, at 50 GB/s by {runs[2]['meta']['worst_auto_over_best']:.3f})")
    assert max(r["meta"]["worst_auto_over_best"] for r in runs) <= 1.05
    docs8 = [r["auto_over_best"] for r in runs[0]["rows"] if r["method"] == "auto"
             and r["per_gpu"] == 8192 and r["mask"] == "documents"]
    _says(f"missed ran {docs8[0]:.2f} and {docs8[1]:.2f} on the machine")
    rows = [r for r in runs[0]["rows"] if "measured_over_predicted" in r]
    _says("the 32K document rows now run " + _span(
        [r["measured_over_predicted"] for r in rows
         if r["per_gpu"] == 32768 and r["mask"] == "documents"]))
    _says(f"The model within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows")
    causal8 = [r for r in rows if r["per_gpu"] == 8192 and r["mask"] == "causal"]
    flat = [r["measured_over_predicted"] for r in causal8 if r["method"].startswith("flat")
            and r["measured_over_predicted"] > 1.15]
    ulysses = [r["measured_over_predicted"] for r in rows
               if r["per_gpu"] == 8192 and r["method"].startswith("ulysses")
               and r["measured_over_predicted"] > 1.15]
    _says(f"8K causal rows run {_span(flat)} and the Ulysses rows {_span(ulysses)}")
    _says(f"First use {seconds[0]}, {seconds[1]} and {seconds[2]} s (target 10 s: met)")
    up, own = _load("h100x2_upstream_issue39_42/upstream_shared-question.json")["runs"]
    assert "upstream" in up["name"] and up["rc"] == own["rc"] == 0
    gap = max(abs(a - b) for a, b in zip(up["losses"], own["losses"]))
    assert 1.15e-4 <= gap < 1.25e-4  # "within 1.2e-4"
    _says(f"within 1.2e-4 too ({up['steady_ms']:.0f} and {own['steady_ms']:.0f} ms per "
          f"iteration)")


def test_ulysses_one_alltoall_is_the_runs_on_file():
    folder = "h100x2_ulysses_one_alltoall/"
    ms = {run: [r["ms"] for r in _load(f"{folder}auto_check_{run}.json")["rows"]
                if r["method"].startswith("ulysses")]
          for run in ("before1", "after1", "before2", "after2")}
    before, after = ms["before1"] + ms["before2"], ms["after1"] + ms["after2"]
    faster = sum(a < b for a, b in zip(after, before))
    _says(f"averaged {sum(before) / 8:.2f} ms before and {sum(after) / 8:.2f} ms after "
          f"(faster in {faster} of 8 pairs)")


def test_host_breakdown_this_session_is_the_run_on_file():
    ops = _load("h100x2_issue39_header_pool_rejected/host_ops.json")
    blocks, calls = ops["building_blocks_us"], {c["case"]: c for c in ops["calls"]}
    host = [calls[c]["host_ms"] for c in ("plain causal, ring bwd", "plain causal, burst bwd",
                                          "new whole_docs pack each call")]
    _says(f"{host[0]:.2f} ms for the plain ring, {host[1]:.2f} ms for the burst backward, "
          f"{host[2]:.2f} ms for a new whole_docs pack")
    post = {k: f"{v['median_us']:.0f}"
            for k, v in calls["plain causal, ring bwd"]["posting"].items()}
    _says(f"costs {post['post_ops']} us of host time in the process group's calls (`send` "
          f"{post['send']} us, `recv` {post['recv']} us, `_end_coalescing` "
          f"{post['_end_coalescing']} us), against {blocks['hop via pg coalescing + wait']:.0f} "
          f"us for a lone hop")
    _says(f"({blocks['header pass, pooled rows and event']:.1f} against "
          f"{blocks['header pass, pinned rows and event made anew']:.1f} us a pass")


def test_captured_mask_families_are_the_runs_on_file():
    rows = {r["family"]: r for f in ("slice_masks_graph", "slice_masks_graph_b")
            for r in _load(f"h100x2_issue42_captured/{f}.json")["rows"]}
    for name, words in (("causal_document", "causal documents"),
                        ("shared_question", "shared question"),
                        ("block_causal_document", "block-causal documents")):
        r = rows[name]
        _says(f"{words} {r['efficiency_fwd']:.2f} -> {r['efficiency_graph_fwd']:.2f}")
        assert r["efficiency_graph_fwd"] >= 0.75 > r["efficiency_fwd"]
    rest = [rows[n]["efficiency_graph_fwd"] for n in ("causal_blockwise", "sliding_window",
                                                       "global_sliding_window",
                                                       "sliding_window_causal")]
    _says(f"blockwise stay below ({_span(rest)} captured)")
    docs = [rows[n] for n in ("causal_document", "shared_question", "causal_blockwise",
                              "block_causal_document")]
    fresh = [r["burst_fresh"]["tflops"] for r in docs]
    same = [r["burst"]["fwd_bwd_tflops"] for r in docs]
    graph = [r["burst_graph"]["fwd_bwd_tflops"] for r in docs]
    _says(f"at {_span(fresh, '{:.0f}')} TFLOP/s per GPU with a new pack every call (eager) "
          f"against {_span(same, '{:.0f}')} on one mask eager and {_span(graph, '{:.0f}')} "
          f"captured")


def test_home_halves_rejection_is_the_runs_on_file():
    folder = "h100x2_issue39_home_halves_rejected/"
    eff = {}
    for which in ("before", "after"):
        for r in _load(f"{folder}{which}/host_time.json")["rows"]:
            if r.get("part") == "efficiency" and "/GPU" in r["case"]:
                eff[which, r["case"].split(", ")[1].split("/")[0], r["case"].split(" d")[0]
                    .split("causal ")[1], r["mode"]] = r["efficiency"]
    heads = ("MHA 32:32", "GQA 32:8", "GQA 16:4")
    for n, mode in (("8192", "eager"), ("8192", "CUDA graph"), ("32768", "eager")):
        _says(" / ".join(f"{eff['before', n, h, mode]:.3f}" for h in heads))
    _says(f"GQA 32:8 went {eff['before', '8192', 'GQA 32:8', 'CUDA graph']:.3f} -> "
          f"{eff['after', '8192', 'GQA 32:8', 'CUDA graph']:.3f}")
    idle = [(RESULTS / f"{d}timeline/pack_zigzag+graph_timeline_rank0.txt").read_text()
            .splitlines()[0] for d in ("h100x2_issue39_wire/", folder)]
    parse = [[float(w) for w in line.replace(",", "").split() if w.replace(".", "").isdigit()]
             for line in idle]  # wall, kernels, idle (ms a call)
    _says(f"idled {parse[0][2]:.3f} -> {parse[1][2]:.3f} ms a call while its kernels ran "
          f"{parse[0][1]:.2f} -> {parse[1][1]:.2f} ms")
    _says(f"rose {parse[0][0]:.2f} -> {parse[1][0]:.2f} ms")


def test_flex_band_figures_are_the_runs_on_file():
    """FlexAttention for the window bands: the first run timed one tree twice (its "before"
    JSON lists the bands only the "after" tree ran); the second, off / on / off, is what the
    README quotes, each side's package on file."""
    void = "h100x2_issue42_flex_bands_rejected"
    data = {side: _load(f"{void}/slice_masks_graph_{side}.json") for side in ("before", "after")}
    assert data["before"]["meta"]["flex_bands"] == data["after"]["meta"]["flex_bands"]
    _says("timed the FlexAttention tree on both sides")
    folder = "h100x2_issue42_flex_bands"
    runs = {}
    for name in ("flex_off_1", "flex_on", "flex_off_2"):
        d = _load(f"{folder}/{name}.json")
        assert d["meta"]["package"].endswith(".flex/megatron_burst" if name == "flex_on"
                                             else "main/megatron_burst")
        assert bool(d["meta"]["flex_bands"]) == (name == "flex_on")
        assert all(b["passed"] for b in d["meta"]["flex_bands"] or [])
        runs[name] = {r["family"]: r for r in d["rows"]}
    order = ("flex_off_1", "flex_on", "flex_off_2")
    for family, words in (("sliding_window", "ms (sliding window)"),
                          ("sliding_window_causal", "(causal window)"),
                          ("global_sliding_window", "(global window)")):
        ms = [runs[n][family]["burst_graph"]["fwd_ms"] for n in order]
        assert ms[1] < min(ms[0], ms[2])
        _says(" / ".join(f"{x:.3f}" for x in ms) + f" {words}")
        eff = " / ".join(f"{runs[n][family]['efficiency_graph_fwd']:.2f}" for n in order)
        _says(eff)


def test_row_span_figures_are_the_runs_on_file():
    """The README's paragraph on hops that carry spans: bytes and times from the GPU run's
    files (each side's JSON names the package it ran), rows from the CPU planner's."""
    folder = "h100x2_issue42_row_spans"

    def rows(run: str) -> dict:
        data = _load(f"{folder}/{run}.json")
        tree = ".before/megatron_burst" if run.endswith("before") else "main/megatron_burst"
        assert data["meta"]["package"].endswith(tree), (run, data["meta"]["package"])
        return {r["family"]: r for r in data["rows"]}

    nv = {side: rows(f"nvlink_{side}") for side in ("before", "after")}
    fwd = {side: {n: r["sent_mb"]["forward"] for n, r in runs.items()}
           for side, runs in nv.items()}
    assert fwd["before"]["sliding_window"] == fwd["before"]["sliding_window_causal"]
    assert fwd["after"]["sliding_window"] == fwd["after"]["sliding_window_causal"]
    _says(f"The busiest rank's forward sends {fwd['before']['sliding_window']:.1f} MB before "
          f"and {fwd['after']['sliding_window']:.1f} MB after for both sliding windows, "
          f"{fwd['after']['block_causal_document']:.1f} MB for block-causal documents")
    _says(f"({fwd['before']['sliding_window']:.1f} MB a rank's forward to "
          f"{fwd['after']['sliding_window']:.1f} MB at 8K/GPU)")  # the peers' table
    graph = [nv[s]["sliding_window"]["burst_graph"]["fwd_bwd_ms"] for s in ("before", "after")]
    _says(f"(captured fwd+bwd, sliding window {graph[0]:.3f} -> {graph[1]:.3f} ms)")
    for backward, cases in (("ring", (("sliding_window", "ms (sliding window)"),
                                      ("sliding_window_causal", "(causal window)"),
                                      ("block_causal_document", "(block-causal documents)"))),
                            ("burst", (("sliding_window", "and"),
                                       ("block_causal_document", "")))):
        runs = {s: rows(f"emulated12.5_{backward}_{s}") for s in ("before", "after")}
        for name, after_words in cases:
            b, a = (runs[s][name]["burst"]["fwd_bwd_ms"] for s in ("before", "after"))
            assert a < b
            _says(f"{b:.3f} -> {a:.3f} {after_words}")
    planner = {side: {(r["family"], r["world"]): r["received_over_read"]
                      for r in _load(f"cpu_issue42_row_spans/{name}.json")["rows"]}
               for side, name in (("before", "ring_rows_before"), ("after", "ring_rows"))}
    for name in ("sliding_window", "sliding_window_causal", "block_causal_document"):
        assert planner["after"][(name, 2)] == 1.0
    _says(f"(1.0x; sliding window {planner['before'][('sliding_window', 2)]}x before, causal "
          f"window {planner['before'][('sliding_window_causal', 2)]}x, block-causal documents "
          f"{planner['before'][('block_causal_document', 2)]}x)")
    _says(f"(sliding window {planner['before'][('sliding_window', 4)]}x -> "
          f"{planner['after'][('sliding_window', 4)]}x)")


def _mask_pricing(run: str) -> tuple[str, list[dict]]:
    """(the table mask_pricing_table.py makes from a run's files, its rows as dicts); the
    table is the one on file."""
    import contextlib
    import importlib.util
    import io

    path = RESULTS.parent / "mask_pricing_table.py"
    spec = importlib.util.spec_from_file_location("mask_pricing_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = RESULTS / "h100x2_issue41_mask_pricing" / run
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        module.main(str(folder))
    assert text.getvalue() == (folder / "mask_pricing.md").read_text()
    cols = ("family", "share", "measured", "before", "err_before", "after", "err_after")
    rows = [dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
            for line in text.getvalue().splitlines()
            if line.startswith("| ") and not line.startswith("| family")]
    return text.getvalue(), rows


def test_mask_pricing_is_the_runs_on_file():
    tables = {run: _mask_pricing(run) for run in ("run_1377cd6", "run_74588ed")}
    for text, rows in tables.values():
        assert "within the model's 15%: 1 of 12 before, 7 of 12 after" in text
    first, second = ({r["family"]: r for r in rows} for _, rows in tables.values())
    _says("in 7 of 12 families in both runs, against 1 of 12 before")
    _says(f"(causal_blockwise {first['causal_blockwise']['err_after']} and "
          f"{second['causal_blockwise']['err_after']}, block-causal documents "
          f"{second['block_causal_document']['err_after']} in the second run)")
    windows = sorted((run[n]["err_after"] for run in (first, second)
                      for n in ("sliding_window", "sliding_window_causal")),
                     key=lambda e: float(e.strip("%")))
    _says(f"windows ({windows[0]} to {windows[-1]})")
    _says(f"prefix-LM documents ({first['prefix_lm_document']['err_after']} and "
          f"{second['prefix_lm_document']['err_after']})")
    ratios = []
    for run, name in (("run_1377cd6", "a"), ("run_74588ed", "a"), ("run_74588ed", "b")):
        rows = _load(f"h100x2_issue41_mask_pricing/{run}/auto_check_8k_{name}/auto_check.json")[
            "rows"]
        cell = [r for r in rows if r["heads"] == "32:8" and r["mask"] == "documents"]
        auto = next(r for r in cell if r["method"] == "auto")
        ratios.append(auto["ms"] / min(r["ms"] for r in cell if r["method"] != "auto"))
    _says("32:8 documents " + ", ".join(f"{x:.2f}" for x in ratios[:-1])
          + f" and {ratios[-1]:.2f}")
    # Before: the check's line in an earlier run of the session (every mask as full).
    log = (RESULTS / "h100x2_issue42_flex_bands_rejected/slice_masks_graph_after_log.txt"
           ).read_text()
    assert "predicted 29.66 ms, measured 8.64 ms" in log
    _says("predicted at 29.7 ms and measured 8.6 ms")


def _replay_rows(run: str, mode: str) -> dict:
    rows = _load(f"h100x2_issue39_replay/{run}/{mode}/host_time.json")["rows"]
    return {r["case"]: r for r in rows if r.get("mode") == "eager"}


def _pack_zigzag_fresh(mode: str) -> dict:
    """run1's pack_zigzag eager efficiency, a new pack every call, by (tokens, heads, mix),
    from the table ``layouts_table.py`` makes of its file."""
    import importlib.util

    path = RESULTS.parent / "layouts_table.py"
    spec = importlib.util.spec_from_file_location("layouts_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.table(str(RESULTS / f"h100x2_issue39_replay/run1/{mode}/documents.json"))
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].endswith("K"):
            found[tuple(cells[:3])] = cells[5].split()[0]
    return found


def test_replay_figures_are_the_runs_on_file():
    """The README's replay paragraph and the results folder's tables, from the runs' files."""
    ring, d64 = "burst causal, ring bwd", "causal GQA 16:4 d64, 8192/GPU"
    runs = {(run, mode): _replay_rows(run, mode) for run in ("run1", "run2")
            for mode in ("off", "auto")}
    host = [f"{runs[run, 'off'][ring]['host_ms']:.3f} -> {runs[run, 'auto'][ring]['host_ms']:.3f}"
            for run in ("run1", "run2")]
    _says(f"{host[0]} and {host[1]} ms (ring backward, two runs")
    eff = [f"{runs[run, 'off'][d64]['efficiency']:.3f} -> "
           f"{runs[run, 'auto'][d64]['efficiency']:.3f}" for run in ("run1", "run2")]
    _says(f"GQA 16:4 d64, {eff[0]} and {eff[1]} of one GPU's kernel")
    mha = runs["run1", "off"]["causal MHA 32:32 d128, 8192/GPU"]["efficiency"], \
        runs["run1", "auto"]["causal MHA 32:32 d128, 8192/GPU"]["efficiency"]
    gqa = runs["run2", "off"]["causal GQA 32:8 d128, 8192/GPU"]["efficiency"], \
        runs["run2", "auto"]["causal GQA 32:8 d128, 8192/GPU"]["efficiency"]
    _says(f"(MHA {mha[0]:.3f} -> {mha[1]:.3f} in the first run, GQA {gqa[0]:.3f} -> "
          f"{gqa[1]:.3f} in the second")
    off, auto = _pack_zigzag_fresh("off"), _pack_zigzag_fresh("auto")
    key_u, key_l = ("8K", "16:4 d64", "uniform"), ("8K", "32:8 d128", "lognormal")
    _says(f"8K/GPU {off[key_u]} -> {auto[key_u]} (16:4 d64 uniform) and {off[key_l]} -> "
          f"{auto[key_l]} (32:8 d128 lognormal;")
    table = (RESULTS / "h100x2_issue39_replay" / "README.md").read_text()
    for (tokens, heads, mix), value in off.items():
        assert f"| {tokens} | {heads} | {mix} | {value} | {auto[tokens, heads, mix]} |" in table


def _checks_rows(call: str, which: str) -> dict:
    """(heads, mix, method) -> row of a documents.py run of the replay-checks session."""
    rows = _load(f"h100x2_issue39_replay_checks/{call}/{which}/documents.json")["rows"]
    return {(r["heads"], r["mix"], r["method"]): r for r in rows}


def _checks_step(name: str) -> int:
    (run,) = _load(f"h100x2_issue39_replay_checks/{name}.json")["runs"]
    assert run["rc"] == 0, run
    return round(run["steady_ms"])


def test_replay_checks_figures_are_the_runs_on_file():
    """The README's paragraph on the host work outside the replayed passes, from the files."""
    before, after = _checks_rows("call4", "before"), _checks_rows("call4", "after")
    fresh, b2b = "burst pack_zigzag, new pack each call", \
        "burst pack_zigzag, new packs back to back (no sync)"
    eff = lambda rows, mix, method: f"{rows['16:4', mix, method]['efficiency_vs_1gpu']:.2f}"  # noqa
    host = lambda rows: f"{rows['16:4', 'uniform', fresh]['host_ms']:.2f}"  # noqa
    _says(f"16:4 d64: {eff(before, 'uniform', fresh)} -> {eff(after, 'uniform', fresh)} of one "
          f"GPU's varlen kernel (uniform; host {host(before)} -> {host(after)} ms a call) and "
          f"{eff(before, 'lognormal', fresh)} -> {eff(after, 'lognormal', fresh)} (lognormal)")
    _says(f"{eff(before, 'uniform', b2b)} -> {eff(after, 'uniform', b2b)} and "
          f"{eff(before, 'lognormal', b2b)} -> {eff(after, 'lognormal', b2b)}: there the GPU")
    one = after["16:4", "uniform", "1 GPU varlen flash, new pack each call"]["ms"]
    _says(f"({after['16:4', 'uniform', b2b]['ms']:.2f} ms against one GPU's {one:.2f} for the "
          f"whole pack, uniform)")
    cp2, cp1 = _checks_step("call4/megatron_CP2"), _checks_step("call4/megatron_CP1")
    _says(f"CP=2 {cp2} ms a step against CP=1's {cp1} ms, {cp1 / cp2:.2f}x")
    _says(f"({_checks_step('call5/megatron_CP2_before')} ms before, in another machine "
          f"session of the same kind, where CP=1 took {_checks_step('call1/megatron_cp1')}; "
          f"{_checks_step('call1/megatron_replay_off')} ms with replay off")


def _upstream_replay(name: str) -> list[dict]:
    runs = _load(f"h100x2_issue39_upstream_replay/{name}.json")["runs"]
    assert all(r["rc"] == 0 for r in runs), runs
    return runs


def test_upstream_replay_figures_are_the_runs_on_file():
    """The README's sentences on the loss checks, the interleaved pipeline and the step trace,
    from the files."""
    ms = lambda runs: [round(r["steady_ms"]) for r in runs]  # noqa: E731
    last = lambda runs: [r["losses"][-1] for r in runs]  # noqa: E731
    checks = _upstream_replay("call2/upstream_zigzag_checks")
    before = _upstream_replay("call1/upstream_documents_pack_zigzag_eager")
    (up, own), (up_loss, own_loss) = ms(checks), last(checks)
    _says(f"the two ways in took {up} and {own} ms a step with the\n   same losses ({up_loss} "
          f"and {own_loss} after 12 iterations), where they took {ms(before)[0]} and "
          f"{ms(before)[1]} ms\n   before")
    interleaved = last(_upstream_replay("call2/upstream_interleaved"))
    _says(f"losses {interleaved[0]} and {interleaved[1]} through both\n   ways in")
    summary = _load("h100x2_issue39_upstream_replay/call1/trace_summary_rank0.json")
    _says(f"its GPU was busy {summary['gpu_busy_ms']:.1f} ms of the\ntraced "
          f"{summary['span_ms']:.1f} ms")
    cp2, cp1 = (round(_upstream_replay(f"call2/megatron_CP{n}")[0]["steady_ms"]) for n in (2, 1))
    _says(f"CP=2 took {cp2} ms against CP=1's {cp1} ({cp1 / cp2:.2f}x")


def test_agree_readback_figures_are_the_runs_on_file():
    """The README's paragraph on the argument check of a new whole_docs pack, from the files."""
    def fresh(run: str, heads: str) -> str:
        rows = _load(f"h100x2_issue41_agree_readback/{run}.json")["rows"]
        (row,) = [r for r in rows if r["heads"] == heads
                  and r["method"] == "burst whole_docs, new pack each call"]
        return f"{row['ms']:.2f}"

    for heads, words in (("16:4", "16:4 d64"), ("32:8", "32:8 d128")):
        _says(f"{fresh('docs_1first', heads)} / {fresh('docs_3first', heads)} ms against "
              f"{fresh('docs_2off', heads)} / {fresh('docs_4off', heads)} ({words})"
              if heads == "16:4" else
              f"{fresh('docs_1first', heads)} / {fresh('docs_3first', heads)}\nagainst "
              f"{fresh('docs_2off', heads)} / {fresh('docs_4off', heads)} ({words})")
    ratios = [row["auto_over_best"] for run in ("auto_1first", "auto_2off", "auto_3first",
                                                 "auto_4off")
              for row in _load(f"h100x2_issue41_agree_readback/{run}.json")["rows"]
              if row.get("auto_over_best")]
    _says(f"moved between {min(ratios):.2f} and {max(ratios):.2f}")


def test_host_channel_figures_are_the_runs_on_file():
    """The README's paragraph on the check over the gloo twin, posted while planning."""
    folder = "h100x2_issue41_host_channel"
    exchange = {r["case"]: r["host_ms_median"]
                for r in _load(f"{folder}/exchange/host_exchange.json")["rows"]}
    _says(f"one exchange cost the host {exchange['gloo twin, busy']:.3f} ms over the twin "
          f"against {exchange['NCCL group, busy']:.3f} ms over NCCL with 2 ms of work queued "
          f"on the GPU, and {exchange['gloo twin, idle']:.3f} against "
          f"{exchange['NCCL group, idle']:.3f} ms with the GPU idle")
    def ms(run: str, heads: str, method: str) -> str:
        (row,) = [r for r in _load(f"{folder}/{run}.json")["rows"]
                  if r["heads"] == heads and r["method"] == method]
        return f"{row['ms']:.2f}"

    phases = [line.split(" ", 2) for line in
              (RESULTS / folder / "overlap" / "phases.txt").read_text().splitlines()]
    before = [json.loads(p[2])["check"] for p in phases
              if p[0] == "before" and json.loads(p[2])["channel"] == "gloo"]
    after = [json.loads(p[2])["check"] + json.loads(p[2])["post"] for p in phases
             if p[0] == "after" and json.loads(p[2])["channel"] == "gloo"]
    _says(f"fell from {min(before):.2f}-{max(before):.2f} ms to "
          f"{min(after):.2f}-{max(after):.2f} ms over the twin")
    for heads, words in (("32:8:128", "32:8 d128"), ("16:4:64", "16:4 d64")):
        walls = {tree: [json.loads(p[2])["wall_call"] for p in phases if p[0] == tree
                        and p[1] == heads and json.loads(p[2])["channel"] == "gloo"]
                 for tree in ("before", "after")}
        _says(f"from {min(walls['before']):.2f}-{max(walls['before']):.2f} to "
              f"{min(walls['after']):.2f}-{max(walls['after']):.2f} ms ({words})")
    repeated = [ms(f"overlap/docs_{r}_{t}_{c}", "16:4", "burst whole_docs, same pack repeated")
                for r in (1, 2) for t in ("before", "after") for c in ("gloo", "group")]
    _says(f"moved between {min(repeated, key=float)} and {max(repeated, key=float)} ms at "
          f"16:4 d64")

    b2b = "burst whole_docs, new packs back to back (no sync)"
    _says(f"took {ms('docs_1gloo', '32:8', b2b)} and {ms('docs_3gloo', '32:8', b2b)} ms over "
          f"the twin against {ms('docs_2group', '32:8', b2b)} and "
          f"{ms('docs_4group', '32:8', b2b)} over NCCL")
    steps = [megatron_step(f"{folder}/megatron/cp2_{i}_{c}.json")
             for i, c in enumerate(("group", "gloo", "group", "gloo"), 1)]
    _says("CP=2 step in turn: " + ", ".join(steps) + " ms over NCCL, the twin, NCCL, the twin")


def megatron_step(name: str) -> str:
    """The steady ms a step of a megatron_graphs.py result's one run."""
    (run,) = _load(name)["runs"]
    return f"{run['steady_ms']:.0f}"


def test_the_settings_table_names_every_setting():
    """Every ``MEGATRON_BURST_*`` variable the package reads has its row in the README's
    settings table, with the default the code has."""
    import re

    from megatron_burst.comm import emulated_nodes, settings
    from .readme import REPO

    names = {v for k, v in vars(settings).items() if k.endswith("_ENV")} | {emulated_nodes.ENV}
    text = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(MEGATRON_BURST_\w+)` \| ([^|]+) \|", text, re.M))
    assert set(rows) == names, sorted(names ^ set(rows))
    defaults = settings.BurstSettings()
    assert rows[settings.AGREE_ENV].strip() == f"`{defaults.agree}`"
    assert rows[settings.HOST_CHANNEL_ENV].strip() == f"`{defaults.host_channel}`"
    assert rows[settings.REPLAY_ENV].strip() == f"`{defaults.replay}`"
    assert rows[settings.TIMEOUT_ENV].strip() == f"`{defaults.timeout_s:g}`"
    assert rows[settings.PREFETCH_ENV].strip() == f"`{int(defaults.prefetch)}`"
    assert rows[settings.MEASURE_ENV].strip() == f"`{'on' if defaults.auto_measure else 'off'}`"


# ---------------------------------------------- issue 39's table, one machine session (final)

FINAL39 = RESULTS / "h100x2_issue39_final"


def test_issue39_final_table_is_the_runs_on_file():
    """Every line of the table ``benchmarks/issue39_table.py`` makes from the session's JSON."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "issue39_table", RESULTS.parent / "issue39_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for line in module.table(FINAL39).splitlines():
        _says(line)


def test_issue39_final_reasons_are_the_profile_and_runs_on_file():
    import re

    from .test_host_path import BUDGETS

    text = (FINAL39 / "cp1" / "newpack_cprofile.txt").read_text()
    new_part = text.split("=== same")[0]
    medians = re.findall(r"=== (new|same): host ms profiled median [\d.]+, unprofiled median "
                         r"([\d.]+)", text)
    got = dict(medians)
    _says(f"host ms unprofiled, median, {got['new']} for a new pack against\n{got['same']} "
          f"for the same pack again")

    def per_call(function: str) -> str:  # cumulative seconds over the 30 profiled calls
        line = next(x for x in new_part.splitlines() if x.rstrip().endswith(f"({function})"))
        return f"{float(line.split()[3]) / 30 * 1e3:.2f}"

    _says(f"the plan's build {per_call('build_plan')} ms, the ranks' agreement "
          f"{per_call('_posted')} ms ({per_call('wait_bounded')} of it waiting")
    _says(f"the placement of the documents {per_call('placement')} ms, and the three hops' "
          f"posts {per_call('post_ops')} ms")
    host = {r["case"] + r["mode"]: r for r in _load(
        "h100x2_issue39_final/micro/host_time_after.json")["rows"]}
    eager = host["causal GQA 16:4 d64, 8192/GPUeager"]
    _says(f"host time ({eager['host_ms']:.2f} ms) is most of its wall time "
          f"({eager['wall_ms']:.2f} ms)")
    ring, sdpa = (host[case + "eager"]["host_ms"] for case in (
        "burst causal, ring bwd", "1 GPU SDPA (cuDNN), the whole sequence"))
    _says(f"costs\n{ring:.2f} ms of host time against one GPU's SDPA at {sdpa:.2f} ms")
    replayed = {r["case"]: r for r in _load(
        "h100x2_issue39_final/micro/host_time_replay.json")["rows"] if r["mode"] == "eager"}
    _says(f"the same call costs {replayed['burst causal, ring bwd']['host_ms']:.2f} ms "
          f"(target 0.6), and the 8K 16:4 d64 row goes from {eager['efficiency']:.2f} to "
          f"{replayed['causal GQA 16:4 d64, 8192/GPU']['efficiency']:.2f}")
    _says(f"{BUDGETS['plain ring']:,} / {BUDGETS['new pack']:,} Python\n  calls for a plain")


def test_four_gpu_figures_are_the_runs_on_file():
    checks = (RESULTS / "h100x4_checks" / "checks4" / "windows_4gpu.md").read_text()
    sliding = next(x for x in checks.splitlines() if x.startswith("| sliding_window |"))
    _says(f"{sliding.split('|')[-2].split('/')[0].strip()} MB forward for the sliding window")
    rows = {side: _load(f"h100x4_area_pieces_rejected/global_{side}.json")["rows"][0]
            for side in ("before", "after", "before2")}
    _says(f"leaves the largest rank {rows['before']['balance_area']:.3f}x the mean area")
    _says(f"{rows['after']['balance_area']:.3f}x the mean, but captured fwd+bwd efficiency "
          f"{rows['before']['efficiency_graph_fwd_bwd']:.2f} -> "
          f"{rows['after']['efficiency_graph_fwd_bwd']:.2f}")
    assert abs(rows["before2"]["efficiency_graph_fwd_bwd"]
               - rows["before"]["efficiency_graph_fwd_bwd"]) < 0.02  # the machine held still


def test_run_figures_are_the_runs_on_file():
    def ratio(side: str, family: str, world: int) -> float:
        name = "ring_rows" + ("_before" if side == "before" else "")
        rows = _load(f"cpu_issue42_runs/{name}.json")["rows"]
        return next(r["received_over_read"] for r in rows
                    if r["family"] == family and r["world"] == world)

    slide = [(ratio("before", "sliding_window", w), ratio("after", "sliding_window", w))
             for w in (4, 8)]
    _says(f"{slide[0][0]}x -> {slide[0][1]}x on 4 ranks and {slide[1][0]}x -> {slide[1][1]}x "
          f"on 8")
    _says(f"(global window {ratio('before', 'global_sliding_window', 2)}x and shared question "
          f"{ratio('before', 'shared_question', 2)}x before)")
    assert all(r["received_over_read"] == 1.0 for r in _load(
        "cpu_issue42_runs/ring_rows.json")["rows"] if r["world"] == 2)


def test_runs_on_gpus_are_the_runs_on_file():
    """The runs' GPU check: the tables in its folder's README are ``runs_table.py``'s of the
    JSON on file, and the figures the README quotes are those runs'."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "runs_table", RESULTS.parent / "runs_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    folder = RESULTS / "gpu_issue42_runs"
    notes = (folder / "README.md").read_text()
    for machine in ("h200x4", "h100x2_masks"):
        for line in table.rows(folder / machine):
            assert line in notes, line

    def family(side: str, name: str, machine: str = "h200x4") -> dict:
        rows = _load(f"gpu_issue42_runs/{machine}/nvlink_{side}.json")["rows"]
        return next(r for r in rows if r["family"] == name)

    for name in ("sliding_window", "block_causal_document"):
        b, a, b2 = (family(side, name) for side in ("before", "after", "before2"))
        _says(f"{b['sent_mb']['forward']:.1f} / {b['sent_mb']['backward']:.1f} -> "
              f"{a['sent_mb']['forward']:.1f} / {a['sent_mb']['backward']:.1f}")
        _says(f"{b['burst_graph']['fwd_bwd_ms']:.2f} / {b2['burst_graph']['fwd_bwd_ms']:.2f} -> "
              f"{a['burst_graph']['fwd_bwd_ms']:.2f} ms")
    for side in ("before", "after", "before2"):
        meta = _load(f"gpu_issue42_runs/h200x4/nvlink_{side}.json")["meta"]
        assert meta["package"].endswith(
            (".before/megatron_burst" if side != "after" else "main/megatron_burst"))
    glob = [next(r for r in _load(f"gpu_issue42_runs/h100x2_masks/emulated12.5_{s}.json")["rows"]
                 if r["family"] == "global_sliding_window") for s in ("before", "after")]
    _says(f"global window's fwd+bwd went {glob[0]['burst']['fwd_bwd_ms']:.2f} -> "
          f"{glob[1]['burst']['fwd_bwd_ms']:.2f} ms")


def test_queued_link_figures_are_the_runs_on_file():
    """Issue 41's queued links and trip home: the counts, ratios and latencies the README
    quotes are the JSON and profiles on file."""
    folder = "h100x2_issue41_queued/"
    runs = [_load(f"{folder}auto_check{tag}.json") for tag in ("", "_25gbps", "_50gbps")]
    within = [int(r["meta"]["rows_model_within_15pct"].split()[0]) for r in runs]
    _says(f"the model within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows")
    worst = [r["meta"]["worst_auto_over_best"] for r in runs]
    _says(f"auto within {worst[0]:.2f}, {worst[1]:.2f} and {worst[2]:.2f} of the best")
    now, before = (_load(f"{folder}{name}.json")["intra"]["latency_us"]
                   for name in ("profile", "before_profile"))
    _says(f"latency came out {now:.1f} us where one synced hop at a time gave {before:.1f}")
    emulated = _load(f"{folder}profile_25gbps.json")["inter"]["latency_us"]
    earlier = _load("h100x2_issue41_new_packs/d_4d2299b/profile_25gbps.json")["inter"]
    _says(f"25 GB/s link's {emulated:.1f} us where it gave {earlier['latency_us']:.1f}")
    causal = [r["ms"] / r["predicted_ms"] for r in runs[0]["rows"]
              if r["per_gpu"] == 8192 and r["mask"] == "causal" and "ulysses" not in r["method"]]
    _says(f"8K causal rows at\n{min(causal):.2f}-{max(causal):.2f} of their predictions")
    docs = [r["ms"] / r["predicted_ms"] for run in runs[1:] for r in run["rows"]
            if r["per_gpu"] == 8192 and r["mask"] == "documents" and r["heads"] == "32:32"
            and "ulysses" not in r["method"]]
    _says(f"run {min(docs):.2f}-{max(docs):.2f} of their predictions")
    import re

    first = [re.search(r"in ([0-9.]+) s at first use", (RESULTS / folder / f"auto_check{t}_log.txt")
                       .read_text()).group(1) for t in ("", "_25gbps", "_50gbps")]
    _says(f"First use {first[0]}, {first[1]} and {first[2]} s.")


def _paired_over_same(run: dict) -> dict:
    """(tokens, heads, mask) -> auto's per-round time over its topology forced, the median."""
    cells: dict = {}
    for r in run["rows"]:
        cells.setdefault((r["per_gpu"], r["heads"], r["mask"]), []).append(r)
    out = {}
    for key, rows in cells.items():
        auto = next(r for r in rows if r["method"] == "auto")
        same = next(r for r in rows if r["method"] != "auto"
                    and r.get("topology") == auto["topology"])
        out[key] = statistics.median(a / b for a, b in zip(auto["rounds_ms"], same["rounds_ms"]))
    return out


def _three_runs_said(folder: str) -> list[dict]:
    """``auto_check_three.sh``'s runs in ``folder`` (machine, 25, 50 GB/s), after checking
    the README says their worst auto / best, rows within 15% and first-use seconds."""
    runs = [_load(f"{folder}auto_check{t}.json") for t in ("", "_25gbps", "_50gbps")]
    worst = [f"{r['meta']['worst_auto_over_best']:.2f}" for r in runs]
    _says(f"Auto within {worst[0]}, {worst[1]} and {worst[2]} of the best forced topology")
    within = [r["meta"]["rows_model_within_15pct"].split(" of ")[0] for r in runs]
    _says(f"within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows")
    seconds = _first_use_seconds([r["meta"] for r in runs])
    _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]}")
    return runs


def test_settled_check_figures_are_the_runs_on_file():
    folder = "h100x2_issue41_settled/"
    tags = ("", "_25gbps", "_50gbps")
    runs = _three_runs_said(folder)
    before = [_load(f"{folder}before_margin/auto_check{t}.json")["meta"] for t in tags]
    was = [f"{m['worst_auto_over_best']:.2f}" for m in before]
    _says(f"{was[0]}, {was[1]} and {was[2]} in the run before these changes")
    misses = [r["measured_over_predicted"] for run in runs for r in run["rows"]
              if abs(r.get("measured_over_predicted", 1) - 1) > 0.15]
    assert all(r["method"].startswith("ulysses") and r["mask"] == "documents"
               and r["per_gpu"] == 8192 for run in runs for r in run["rows"]
               if abs(r.get("measured_over_predicted", 1) - 1) > 0.15)
    _says(f"Ulysses with documents at 8K ({_span(misses)})")
    docs = [v for run in runs for (n, _, mask), v in _paired_over_same(run).items()
            if n == 8192 and mask == "documents"]
    _says(f"runs {(min(docs) - 1) * 100:.1f}-{(max(docs) - 1) * 100:.1f}% slower than its")
    profiles = [_load(f"{folder}profile{t}.json") for t in tags]
    ratios = [p["pack_call_overhead_us"] / p["call_overhead_us"] for p in profiles]
    _says(f"it came out {_span(ratios, '{:.1f}')} times a tiny plain call's, with no cost per "
          f"document")
    assert all(p["pack_doc_overhead_us"] == 0 for p in profiles)


def test_ulysses_order_figures_are_the_runs_on_file():
    folder = "h100x2_ulysses_order/"
    ms = {}
    for which in ("before", "after"):
        for r in _load(f"{folder}{which}/attention.json")["rows"]:
            ms[which, r["per_gpu"], r["heads"], r["method"][:10]] = r["total_ms"]
    for n, heads, said in ((8192, "32:32", "2 at 8K tokens a GPU went "), (8192, "32:8", ""),
                           (32768, "32:32", "at 32K\n"), (32768, "32:8", "and ")):
        before, after = ms["before", n, heads, "burst usp "], ms["after", n, heads, "burst usp "]
        _says(f"{said}{before:.2f} -> {after:.2f}".strip())
    _says(f"The flat ring ({ms['after', 8192, '32:32', 'burst (rin']:.2f} and "
          f"{ms['after', 8192, '32:8', 'burst (rin']:.2f} ms at 8K)")


def _host_repeat(folder: str) -> dict:
    """Each host figure over the truth it stands for (8 documents, auto_check's mix), and the
    medians of the first two pack series, over every measurement of both processes."""
    out: dict = {"ring pack": [], "ulysses pack": [], "few": [], "many": [], "causal": []}
    for p in (1, 2):
        for row in _load(f"{folder}/host_repeat_p{p}.json")["rows"]:
            f, t = row["fields"], row["truth"]
            for name, prefix, truth in (("ring pack", "", "ring_pack_ms"),
                                        ("ulysses pack", "ulysses_", "ulysses_pack_ms")):
                figure = (f[f"{prefix}pack_call_overhead_us"]
                          + 8 * f[f"{prefix}pack_doc_overhead_us"])
                out[name].append(figure / 1e3 / t[truth])
            out["few"].append(statistics.median(row["raw_ms"][2]))
            out["many"].append(statistics.median(row["raw_ms"][3]))
            out["causal"].append(t["ring_causal_ms"])
    return out


def test_real_pack_figures_are_the_runs_on_file():
    folder = "h100x2_issue41_real_packs/"
    before, after = _host_repeat(folder + "host_repeat_ff72cd2"), _host_repeat(
        folder + "host_repeat_8a056d2")
    _says(f"read cheaper than 2 documents (medians {_span(before['many'])} ms against "
          f"{_span(before['few'])})")
    _says(f"Ulysses' pack figure read {_span(before['ulysses pack'])} of the 8K pack")
    was, now = (statistics.median(x["ulysses pack"]) for x in (before, after))
    _says(f"Ulysses' figure now reads {_span(after['ulysses pack'])} of its truth (median "
          f"{now:.2f}, was {was:.2f})")
    runs = _three_runs_said(folder)
    misses = [r for run in runs for r in run["rows"]
              if abs(r["measured_over_predicted"] - 1) > 0.15]
    assert all(r["per_gpu"] == 8192 and r["method"] != "ulysses 2 x ring 1" for r in misses)
    assert all(run["meta"]["emulated"] for run in runs if any(
        abs(r["measured_over_predicted"] - 1) > 0.15 for r in run["rows"]))
    _says(f"priced high ({_span([r['measured_over_predicted'] for r in misses])})")
    latency = _load(f"{folder}profile_25gbps.json")["inter"]["latency_us"]
    _says(f"read the link's latency as {latency:.0f} us")
    per_call = {layers: [r["ms"] for r in _load(f"{folder}trace_ff72cd2/{sub}auto_check.json")
                         ["rows"] if r["method"] == "flat ring 2, ring bwd"]
                for layers, sub in ((1, ""), (8, "layers8/"))}
    _says(f"the flat ring takes {_span(per_call[8])} ms a call at 8K documents against "
          f"{_span(per_call[1])} with a new pack every call")


def test_real_packs_second_run_is_on_file():
    folder = "h100x2_issue41_real_packs/"
    text = " ".join((RESULTS / folder / "README.md").read_text().split())

    def _folder_says(phrase: str) -> None:
        assert " ".join(phrase.split()) in text, f"{folder}README.md should say: {phrase}"

    tags = ("", "_25gbps", "_50gbps")
    runs = [_load(f"{folder}again_bd57e09/auto_check{t}.json") for t in tags]
    worst = " / ".join(f"{r['meta']['worst_auto_over_best']:.3f}" for r in runs)
    within = " / ".join(r["meta"]["rows_model_within_15pct"].split(" of ")[0] for r in runs)
    seconds = " / ".join(x.removesuffix(" s") for x in _first_use_seconds([r["meta"]
                                                                           for r in runs]))
    _folder_says(f"| 4 `again_bd57e09/` | {worst} | {within} of 32 | {seconds} s |")
    w = [f"{r['meta']['worst_auto_over_best']:.3f}" for r in runs]
    n = [r["meta"]["rows_model_within_15pct"].split(" of ")[0] for r in runs]
    _says(f"auto within {w[0]}, {w[1]} and {w[2]}, the model within 15% in {n[0]}, {n[1]} and "
          f"{n[2]} of 32 rows")
    misses = [r["measured_over_predicted"] for run in runs for r in run["rows"]
              if abs(r["measured_over_predicted"] - 1) > 0.15]
    assert all(r["per_gpu"] == 8192 and r["mask"] == "documents" for run in runs
               for r in run["rows"] if abs(r["measured_over_predicted"] - 1) > 0.15)
    _folder_says(f"its seven misses are all 8K\n  documents ({_span(misses)})")
    assert len(misses) == 7
    packs = [_load(f"{folder}{sub}profile{t}.json")["pack_call_overhead_us"] / 1e3
             for sub in ("again_bd57e09/", "") for t in tags]
    _folder_says(f"host at {_span(packs[:3])} ms (run 3: {_span(packs[3:])})")
    hosts = [r["host_ms"] for r in runs[0]["rows"] if r["per_gpu"] == 8192
             and r["mask"] == "documents" and r["method"].startswith("flat ring")]
    _folder_says(f"documents took {_span(hosts)} on the host")
    checks = [c for run in runs for r in run["rows"] if r["method"] == "auto"
              for c in r["checks"]]
    kept = sum(c["kept"] == c["chosen"] for c in checks)
    _folder_says(f"Checks kept the model's choice in\n  {kept} of {len(checks)} cells")
    (held,) = [c for r in runs[2]["rows"] if r["method"] == "auto" and r["per_gpu"] == 8192
               and r["heads"] == "32:8" and r["mask"] == "documents" for c in r["checks"]]
    again, first, other = held["chosen_again_ms"], held["measured_ms"], held["runner_up_ms"]
    assert first < other < again * (1 - 0.03) and held["kept"] == held["chosen"]
    _folder_says(f"the choice timed {first:.2f} ms, the runner-up {other:.2f}, the\n  choice again "
          f"{again:.2f}")


def test_cold_first_use_phases_are_the_run_on_file():
    log = (RESULTS / "h100x2_issue41_real_packs/first_use_phases/gpu_tests.txt").read_text()
    line = next(x for x in log.splitlines() if "at first use (" in x)
    seconds = line.split(" in ")[1].split(" at first use")[0]
    parts = line.split("at first use (")[1].split(")")[0].replace(" s,", ",")
    _says(f"first use in a cold process took {seconds} ({parts}")


def test_the_model_given_each_row_s_host_is_the_replay_of_the_runs_on_file():
    import sys

    sys.path.insert(0, str(RESULTS.parent))
    import model_replay
    from megatron_burst.decide.timing import Profile

    counts = []
    for sub in ("", "again_bd57e09/"):
        for tag in ("", "_25gbps", "_50gbps"):
            folder = f"h100x2_issue41_real_packs/{sub}"
            prof = Profile.from_json(_load(f"{folder}profile{tag}.json"))
            rows = model_replay.replay(_load(f"{folder}auto_check{tag}.json"), prof, True)
            counts.append(sum(abs(r["ms"] / r["replayed_ms"] - 1) <= 0.15 for r in rows))
    _says(f"the model comes within 15% in {counts[0]}, {counts[1]} and {counts[2]} of 32 rows "
          f"of the first run and {counts[3]}, {counts[4]} and {counts[5]} of the second")


def _figure_over_truth(folder: str) -> list[float]:
    """Median over a ``host_repeat.py`` run's measurements of each host figure over the 8K
    truth it stands for: ring call, Ulysses call, ring pack, Ulysses pack (8 documents)."""
    ratios: list[list[float]] = [[], [], [], []]
    for row in _load(f"{folder}/host_repeat.json")["rows"]:
        f, t = row["fields"], row["truth"]
        for i, (figure, truth) in enumerate((
                (f["call_overhead_us"], t["ring_causal_ms"]),
                (f["ulysses_call_overhead_us"], t["ulysses_causal_ms"]),
                (f["pack_call_overhead_us"] + 8 * f["pack_doc_overhead_us"], t["ring_pack_ms"]),
                (f["ulysses_pack_call_overhead_us"] + 8 * f["ulysses_pack_doc_overhead_us"],
                 t["ulysses_pack_ms"]))):
            ratios[i].append(figure / 1e3 / truth)
    return [statistics.median(r) for r in ratios]


def test_call_shape_runs_are_on_file():
    """The host timed at the call's shape: its figures against the tiny calls', the three
    runs on 2x H200 and on 2x H100, and the cold first use, as the README says them."""
    host = "h200x2_issue41_call_shape/host/"
    for sub, said in (("call", "read {}, {}, {} and {} of the 8K truths"),
                      ("tiny", "where the tiny calls read\n{}, {}, {} and {} in the same call")):
        _says(said.format(*(f"{x:.2f}" for x in _figure_over_truth(host + sub))))
    line = next(x for x in (RESULTS / host / "gpu_tests.txt").read_text().splitlines()
                if "at first use (" in x)
    seconds = line.split(" in ")[1].split(" at first use")[0]
    parts = line.split("at first use (")[1].split(")")[0].replace(" s,", ",")
    _says(f"a Megatron layer's first use in a cold process took {seconds} ({parts}")
    tags = ("", "_25gbps", "_50gbps")
    for folder in ("h200x2_issue41_call_shape/", "h100x2_issue41_call_shape/"):
        runs = [_load(f"{folder}auto_check{t}.json") for t in tags]
        worst = [f"{r['meta']['worst_auto_over_best']:.3f}" for r in runs]
        within = [r["meta"]["rows_model_within_15pct"].split(" of ")[0] for r in runs]
        seconds = _first_use_seconds([r["meta"] for r in runs])
        _says(f"auto within {worst[0]}, {worst[1]} and {worst[2]}")
        _says(f"the model within 15% in {within[0]}, {within[1]} and {within[2]} of 32 rows")
        _says(f"first use {seconds[0]}, {seconds[1]} and {seconds[2]}")
        assert all(float(w) <= 1.05 for w in worst)
    misses = [row["measured_over_predicted"] for run in runs for row in run["rows"]
              if abs(row["measured_over_predicted"] - 1) > 0.15]  # the H100 runs
    assert len(misses) == 5 and all(m > 1 for m in misses)
    _says(f"Its five misses\nare 8K documents priced low ({_span(misses)})")
    ring = [next(r["ms"] for r in _load(f"{f}auto_check.json")["rows"]
                 if r["per_gpu"] == 8192 and r["heads"] == "32:8" and r["mask"] == "documents"
                 and r["method"] == "flat ring 2, ring bwd")
            for f in ("h100x2_issue41_real_packs/", "h100x2_issue41_real_packs/again_bd57e09/",
                      "h100x2_issue41_call_shape/")]
    _says(f"took {ring[0]:.2f},\n{ring[1]:.2f} and {ring[2]:.2f} ms in three runs of 2x H100")


def test_band_union_and_heavy_rows_are_the_runs_on_file():
    """The forward calls the planner makes before and after bands are one call, and the
    rejected heavy rows' run, as the README says them."""
    folder = "cpu_issue42_band_union/"
    busiest = {}
    for name in ("calls_before", "calls"):
        for r in _load(f"{folder}{name}.json")["rows"]:
            busiest[name, r["family"], r["world"]] = r["busiest"]
    changed = {(f, w) for (n, f, w) in busiest if n == "calls"
               and busiest["calls", f, w] != busiest["calls_before", f, w]}
    assert changed == {("sliding_window", 2), ("global_sliding_window", 2),
                       ("global_sliding_window", 4)}
    said = [f"{busiest['calls_before', f, w]} -> {busiest['calls', f, w]}" for f, w in (
        ("sliding_window", 2), ("global_sliding_window", 2), ("global_sliding_window", 4))]
    _says(f"The busiest rank's forward calls: {said[0]} for the sliding window on 2\n"
          f"ranks, {said[1]} and {said[2]} for the global window on 2 and 4 ranks.")
    runs = {s: _load(f"h200x2_issue42_heavy_rows_rejected/{s}.json")["rows"][0]
            for s in ("before", "after", "before2")}
    assert [r["balance_area"] for r in runs.values()][1] == 1.0
    fwd = {s: r["burst_graph"]["fwd_ms"] for s, r in runs.items()}
    both = {s: r["burst_graph"]["fwd_bwd_ms"] for s, r in runs.items()}
    assert fwd["after"] > max(fwd["before"], fwd["before2"])
    _says(f"captured forward {fwd['before']:.3f} and {fwd['before2']:.3f} ms before, "
          f"{fwd['after']:.3f} after (fwd+bwd {both['before']:.3f} and {both['before2']:.3f},\n"
          f"{both['after']:.3f})")
    _says(f"the backward's busiest rank sent {runs['before']['sent_mb']['backward']:.1f} MB "
          f"before, {runs['after']['sent_mb']['backward']:.1f} after")
    _says(f"which holds {runs['before']['balance_area']:.3f}x\nthe mean area")


def test_the_summary_s_auto_and_mask_figures_are_the_runs_on_file():
    """The README's opening bullets: auto's worst cell over the two machine kinds' runs at
    the call's shape, and the families where burst_attn beats PyTorch's Flex CP."""
    worst = max(_load(f"{folder}auto_check{t}.json")["meta"]["worst_auto_over_best"]
                for folder in ("h200x2_issue41_call_shape/", "h100x2_issue41_call_shape/")
                for t in ("", "_25gbps", "_50gbps"))
    _says(f"within {math.ceil(worst * 100) / 100:.2f} of the best forced topology in every "
          "cell on\n2 H200 and on 2 H100")
    rows = _load("h200x2_issue42_flex_cp/slice_masks.json")["rows"]
    faster = sum(r["burst"]["fwd_bwd_tflops"] > r["torch_flex_cp"]["fwd_bwd_tflops"]
                 for r in rows)
    words = {10: "ten", 11: "eleven", 12: "twelve"}
    _says(f"faster than PyTorch's FlexAttention CP in {words[faster]} of its "
          f"{words[len(rows)]}\nfamilies on 2 H200")


def _captured_fwd(folder: str) -> dict:
    """{(family, run): captured forward ms} of a before / after / before-again call."""
    return _sides(f"{folder}/masks2", lambda r: r["burst_graph"]["fwd_ms"])


def _sides(prefix: str, get) -> dict:
    """{(family, run): get(row)} of a before / after / before-again call's JSON files."""
    return {(r["family"], s): get(r) for s in ("before", "after", "before2")
            for r in _load(f"{prefix}/{s}.json")["rows"]}


def _before_after(ms: dict, family: str) -> str:
    return (f"{ms[family, 'before']:.3f} / {ms[family, 'before2']:.3f} -> "
            f"{ms[family, 'after']:.3f}")


def test_the_h100_mask_table_and_its_counts_are_the_run_on_file():
    """The counts the text gives of the run before the last table (2x H100, with eager calls
    back to back) and of the one before it (same package, no back-to-back column)."""
    run = {r["family"]: r for r in _load("h100x2_issue42_table_head/chained/sm.json")["rows"]}
    before = {r["family"]: r for r in _load("h100x2_issue42_table_head/sm.json")["rows"]}
    assert _at_least(run, 0.75) == [5, 11, 9, 12] and _at_least(before, 0.75) == [5, 11, 12, 12]
    low = [(f, r["efficiency_graph_fwd"]) for f, r in run.items()
           if r["efficiency_graph_fwd"] < 0.75]
    low_before = [(f, r["efficiency_graph_fwd"]) for f, r in before.items()
                  if r["efficiency_graph_fwd"] < 0.75]
    assert [f for f, _ in low] == ["sliding_window_causal"]
    assert [f for f, _ in low_before] == ["shared_question"]
    _says(f"(the causal window at {low[0][1]:.3f} here, shared question at "
          f"{low_before[0][1]:.3f}\nthere)")
    bwd = [r["efficiency_graph_bwd"] for r in run.values()]
    _says(f"backward reaches it in all twelve ({min(bwd):.2f}-{max(bwd):.2f})")
    chained = {f: (r["efficiency_chained_fwd"], r["efficiency_chained_bwd"])
               for f, r in run.items()}
    below = {f: fwd for f, (fwd, _) in chained.items() if fwd < 0.75}
    assert len(chained) - len(below) == 8 and min(b for _, b in chained.values()) >= 0.75
    assert set(below) == {"causal_document", "shared_question", "causal_blockwise",
                          "block_causal_document"}
    _says("forward reaches it in eight families and the eager backward in all twelve "
          f"({min(b for _, b in chained.values()):.2f}-{max(b for _, b in chained.values()):.2f})")
    _says(f"block-causal documents: {min(below.values()):.2f}-{max(below.values()):.2f})")
    graph = [run[f]["efficiency_graph_fwd"] for f in below]
    _says(f"captured, the same four read {min(graph):.2f}-{max(graph):.2f}")
    _says("the eager forward reaches 0.75 in five families in both runs and the backward in "
          "nine and\ntwelve")
    err = max(r["rel_err_vs_one_gpu"] for r in [*run.values(), *before.values()])
    _says(f"Every family is within {err:.1e}".replace("e-0", "e-") + " of one GPU's output.")
    fresh = {f: (r["burst"]["fwd_bwd_tflops"], r["burst_fresh"]["tflops"])
             for f, r in run.items() if r.get("burst_fresh")}
    worst = max(same / new for same, new in fresh.values())
    assert max(fresh, key=lambda f: fresh[f][0] / fresh[f][1]) == "prefix_lm_document"
    words = [f"{name} {fresh[f][0]:.0f} -> {fresh[f][1]:.0f}" for f, name in (
        ("prefix_lm_document", "prefix-LM documents"), ("full_document", "full documents"),
        ("shared_question", "shared question"))]
    _says(f"still costs up to\n{worst:.1f}x the same mask: {words[0]} TFLOP/s per GPU, "
          f"{words[1]},\n{words[2]}")
    old = {r["family"]: r for r in _load("h100x2_issue42_table/sm.json")["rows"]}
    was = old["prefix_lm_document"]
    _says(f"({was['burst']['fwd_bwd_tflops'] / was['burst_fresh']['tflops']:.1f}x in the run "
          "at `675b9ce`)")
    _says("eager calls back to back, as a model's\n  layers make them, the backward in all "
          "twelve, the forward in eight in one run and seven\n  in the last")


def test_the_band_union_merges_and_first_writes_are_the_runs_on_file():
    """The before / after figures of the band union, the merge kernel and the first writes
    on 2x H100, and the profile that led to them, as the README says them."""
    ms = _captured_fwd("h100x2_issue42_band_union")
    _says(f"forward went {_before_after(ms, 'sliding_window')} ms (sliding window) and "
          f"{_before_after(ms, 'global_sliding_window')} (global\nwindow)")
    _says(f"ranks ({_before_after(ms, 'sliding_window_causal')})")
    profile = (RESULTS / "h100x2_issue42_profile/profile.txt").read_text()
    merge_ms = {}
    for part in profile.split("===== ")[1:]:
        fwd = part.split("--- forward x5: by CUDA time")[1].split("--- forward x5: by CPU")[0]
        line = next(x for x in fwd.splitlines() if x.strip().startswith("_merge_kernel"))
        own = line.split()[6]  # self CUDA, over 5 calls: "3.536ms" or "313.636us"
        merge_ms[part.split(":")[0]] = float(own[:-2]) / (5 if own.endswith("ms") else 5e3)
    _says(f"spending {merge_ms['causal_blockwise']:.2f} and "
          f"{merge_ms['global_sliding_window']:.2f} ms a call")
    rate = {s: {(r["rows"], r["acc"]): r for r in
                _load(f"h100x2_issue42_merges/first_writes/merge_{s}/merge_rate.json")["rows"]}
            for s in ("before", "after")}
    bf, fp = (8192, "bfloat16"), (8192, "float32")
    _says(f"8,192 rows merge in {rate['after'][bf]['merge_us']:.0f} us into bf16 "
          f"({rate['before'][bf]['merge_us']:.0f} before) and {rate['after'][fp]['merge_us']:.0f}"
          f" us into fp32 ({rate['before'][fp]['merge_us']:.0f}),\n"
          f"{rate['after'][bf]['merge_over_add']:.2f}x and "
          f"{rate['after'][fp]['merge_over_add']:.2f}x the time")
    ms = _captured_fwd("h100x2_issue42_merges")
    _says(f"forward of causal blockwise {_before_after(ms, 'causal_blockwise')} ms, the global "
          f"window {_before_after(ms, 'global_sliding_window')},\nprefix-LM causal "
          f"{_before_after(ms, 'prefix_lm_causal')}, shared question "
          f"{_before_after(ms, 'shared_question')}")
    ms = _captured_fwd("h100x2_issue42_first_writes")
    _says(f"causal blockwise {_before_after(ms, 'causal_blockwise')} ms; the\nother families")


def test_the_first_call_output_and_a_new_masks_cost_are_the_runs_on_file():
    """The before / after figures of a pass's first call kept as its output, the copy it
    saved, and what a new mask costs, taken apart, as the README says them."""
    ms = _captured_fwd("h100x2_issue42_home_output")
    _says(f"of the causal window {_before_after(ms, 'sliding_window_causal')} ms, the "
          f"two-sided window {_before_after(ms, 'sliding_window')},")
    copies = (RESULTS / "h100x2_issue42_home_output/copies_before.txt").read_text()
    line = next(x for x in copies.split("copies, casts and fills")[1].splitlines()
                if "[[1, 8192, 64, 128], [1, 8192, 64, 128]" in x)
    _says(f"({line.split()[2]} us over 5 forwards)")
    after = (RESULTS / "h100x2_issue42_home_output/copies_after.txt").read_text()
    assert "[1, 8192, 64, 128]" not in after.split("copies, casts and fills")[1]
    ms = _captured_fwd("h100x2_issue42_home_output_packs")
    _says(f"causal documents {_before_after(ms, 'causal_document')};")
    cost = _load("h100x2_issue42_home_output_packs/new_mask_cost.json")["families"]
    mean = lambda rows, key: sum(key(r) for r in rows) / len(rows)  # noqa: E731
    host = [mean(rows, lambda r: r["new"][0]) - mean(rows, lambda r: r["third"][0])
            for rows in cost.values()]
    rate = [1 - mean(rows, lambda r: r["tflops_new"]) / mean(rows, lambda r: r["tflops_kept"])
            for rows in cost.values()]
    pfx = cost["prefix_lm_document"]
    fixed = _load("h100x2_issue42_home_output_packs/masks2/before.json")["rows"]
    fixed = next(r for r in fixed if r["family"] == "prefix_lm_document")
    percent = _span([x * 100 for x in rate], "{:.0f}")
    _says(f"{_span(host, '{:.1f}')} ms of host time, {percent}% of the rate "
          f"(prefix-LM documents {mean(pfx, lambda r: r['tflops_new']):.0f} against "
          f"{mean(pfx, lambda r: r['tflops_kept']):.0f} TFLOP/s")
    _says(f"prefix-LM documents {mean(pfx, lambda r: r['tflops_kept']):.0f}\nwith its plan kept "
          f"against {fixed['burst']['fwd_bwd_tflops']:.0f} on one fixed mask")


def test_the_causal_windows_later_captured_efficiency_is_the_runs_on_file():
    """The causal window's captured forward efficiency in the runs after its output stopped
    being copied (the home_output run's 'after', the flex-1024 run's two 'before' runs)."""
    runs = [("h100x2_issue42_home_output", "after"),
            ("h100x2_issue42_flex_1024_rejected", "before"),
            ("h100x2_issue42_flex_1024_rejected", "before2")]
    eff = [next(r for r in _load(f"{folder}/masks2/{side}.json")["rows"]
                if r["family"] == "sliding_window_causal")["efficiency_graph_fwd"]
           for folder, side in runs]
    _says(f"it read {eff[0]:.2f},\n{eff[1]:.2f} and {eff[2]:.2f} in three later runs")
    now = [next(r for r in _load(f"h100x2_issue42_table_head/{name}")["rows"]
                if r["family"] == "sliding_window_causal")["efficiency_graph_fwd"]
           for name in ("sm.json", "chained/sm.json")]
    _says(f"then {now[0]:.2f} and {now[1]:.2f} in these two")
    old = next(r for r in _load("h100x2_issue42_table/sm.json")["rows"]
               if r["family"] == "sliding_window_causal")["efficiency_graph_fwd"]
    _says(f"read {old:.2f} in the run at `675b9ce`")


def test_the_flex_1024_trial_is_the_run_on_file():
    """The FlexAttention trial for 1,024-row bands, not kept, as the README says it."""
    ms = _captured_fwd("h100x2_issue42_flex_1024_rejected")
    _says(f"its captured\nforward read {_before_after(ms, 'sliding_window_causal')} ms")


def test_the_host_parts_of_a_forward_are_the_run_on_file():
    """The host's parts of an eager slice-mask forward, as the README gives them, are
    ``benchmarks/host_parts.py``'s run on file (back to back, rank 0)."""
    rows = _load("h100x2_issue42_host_parts/host_parts.json")["rows"]
    b2b = [r["back_to_back"] for r in rows]

    def span(values) -> str:
        values = [x for x in values if x > 0]
        return f"{min(values):.2f}-{max(values):.2f}"

    part = lambda name: span(r["parts_ms"].get(name, 0) for r in b2b)  # noqa: E731
    packs = [r["parts_ms"].get(n, 0) for r in b2b for n in ("pack K/V", "pack edges")]
    share = [sum(v for k, v in r["parts_ms"].items() if k != "NCCL calls") / r["host_ms"]
             for r in b2b]
    assert len(rows) == 6
    _says(f"{span(r['host_ms'] for r in b2b)} ms of host time a forward in the\nsix families "
          "timed")
    _says(f"the attention kernels' launches {part('kernel calls')} ms of it, the fused merge's\n"
          f"Triton launches {part('merge launches')}, packing K/V (or a window's edges) into one "
          f"message {span(packs)},\nposting a hop {part('post a hop')} (NCCL's own calls "
          f"{part('NCCL calls')} of that) and waiting for one {part('wait for a hop')}:\n"
          f"together {min(share) * 100:.0f}-{max(share) * 100:.0f}%")


def test_the_unsteady_machine_and_the_healthy_spread_are_the_logs_on_file():
    """The throttled machine's choice timed 25.2 then 68.6 ms and two checks switched; on
    the healthy runs on file the choice's two timings were at most 1.64x apart, but once
    (more than 2x, where the guard kept the model's choice)."""
    import re

    pattern = re.compile(r"measured ([\d.]+) ms \(.*?the choice again ([\d.]+) ms")
    hot = (RESULTS / "h100x2_issue42_throttled/sm_log.txt").read_text()
    pairs = {(float(a), float(b)) for a, b in pattern.findall(hot)}
    assert (25.22, 68.56) in pairs
    switched = {line for line in hot.splitlines() if "switched to" in line}
    assert len(switched) == 2
    _says("timed one choice 25.2 then 68.6 ms and switched two checks on such\ntimings")
    once = "h100x2_issue42_host_trims/masks2/before_log.txt"  # a healthy machine's outlier
    pairs = {(str(path), float(x), float(y)) for path in RESULTS.rglob("*.txt")
             if "throttled" not in str(path)
             for x, y in pattern.findall(path.read_text(errors="ignore"))}
    outliers = {p for p in pairs if max(p[1:]) / min(p[1:]) > 2}
    layer = "h200x2_issue42_in_layer/first_run/il_log.txt"  # a check inside a layer's steps
    assert sorted(where.split("results/")[-1] for where, _, _ in outliers) == [once, layer]
    (where, a, b), = [p for p in outliers if p[0].endswith(once)]
    (_, c, d), = [p for p in outliers if p[0].endswith(layer)]
    for log in (once, layer):
        assert "kept the model's choice" in (RESULTS / log).read_text()
    spread = [max(x, y) / min(x, y) for _, x, y in pairs - outliers]
    assert len(spread) > 50
    _says(f"on healthy machines the two were\nat most {max(spread):.2f}x apart")
    gate = (RESULTS / once).parent.joinpath("gate.txt").read_text().splitlines()[1:]
    idle = [line.split(",")[1].strip() for line in gate]
    _says(f"but twice: on a machine whose GPUs idled at {idle[0]} and {idle[1]} C")
    _says(f"one choice timed\n{a:.2f} then {b:.2f} ms")
    _says(f"one choice timed {c:.2f} then {d:.2f} ms; the guard kept the model's choice both "
          f"times")


def test_the_two_way_rounds_are_the_planner_runs_on_file():
    """The windows' steps, messages and rows before and after the two rounds, and the rest
    unchanged, as the README gives them."""
    def rows(name: str) -> dict:
        return {(r["family"], r["world"]): r
                for r in _load(f"cpu_issue42_two_way/{name}.json")["rows"]}

    before, after = rows("rounds_before"), rows("rounds")
    span = lambda xs: f"{min(xs)}-{max(xs)}"  # noqa: E731
    b4, b8 = (before[("sliding_window", w)] for w in (4, 8))
    a4, a8 = (after[("sliding_window", w)] for w in (4, 8))
    assert a8["two_way"] and a4["two_way"] and not b8["two_way"]
    _says(f"{max(b4['steps'])} steps -> {max(a4['steps'])} on 4 ranks and {max(b8['steps'])} -> "
          f"{max(a8['steps'])} on 8,\n{span(b8['messages'])} messages a rank -> "
          f"{span(a8['messages'])}, at most {max(b8['rows_sent']):,} rows sent -> "
          f"{max(a8['rows_sent']):,}")
    z4, z8 = (before[("window (1024, 0) zigzag", w)] for w in (4, 8))
    n4, n8 = (after[("window (1024, 0) zigzag", w)] for w in (4, 8))
    _says(f"took {max(z4['steps'])} steps on 4 ranks and {max(z8['steps'])}\non 8, with "
          f"{span(z8['messages'])} messages a rank and up to {max(z8['rows_sent']):,} rows "
          f"sent on 8; now {max(n4['steps'])} steps on either,\n{span(n8['messages'])} "
          f"messages, at most {max(n8['rows_sent']):,} rows")
    assert max(n8["steps"]) == max(n4["steps"]) == 3
    _says(f"zigzag causal window on 8 ranks: {max(z8['steps'])} steps to {max(n8['steps'])}")
    changed = sorted(key for key in after if after[key] != before[key])
    windows = ("sliding_window", "window (1024, 0) zigzag", "window (1024, 1024) zigzag",
               "window (1024, 1024) contiguous")
    assert changed == sorted([(name, w) for name in (*windows, "sliding_window_causal")
                              for w in (4, 8)]), changed
    assert all(after[(name, w)]["two_way"] for name in windows for w in (4, 8))
    causal = [(before[key], after[key]) for key in changed if key[0] == "sliding_window_causal"]
    # the causal window: the same steps, its messages dealt to other ranks (the order kept)
    assert all(max(b["steps"]) == max(a["steps"]) == 2 and not a["two_way"]
               and sorted(b["messages"]) == sorted(a["messages"]) for b, a in causal)


def test_the_window_layers_bytes_are_the_shipped_configs_header():
    """The gpt-oss-style config's window layers' bytes, as its header (written from the plan,
    ``tools.config_header``) gives them and the README quotes them."""
    from .readme import REPO

    header = (REPO / "configs/gptoss-style-dense-7b-128k.yaml").read_text()
    line = next(x for x in header.splitlines() if x.startswith("# Sliding-window layers"))
    fwd, bwd = line.split("sends ")[1].split(" forward")[0], line.split("and ")[1]
    assert (fwd, bwd) == ("256.00 KiB", "768.00 KiB")
    _says("send 256 KiB forward and 768 KiB backward a layer")


def test_a_window_wider_than_a_rank_takes_two_steps_each_way():
    """The README's "5 of 8 on 8 ranks in the tests": the planner's own count."""
    from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
    from megatron_burst.plan import mask_families as mf

    world, total = 8, 128  # 16 rows a rank, a window of 20 (tests/test_two_way_rounds.py)
    steps = {len(build_plan(plan_key("contiguous", world, (total,), mf.sliding_window(total, 20),
                                     1, RingKey(tuple(range(world)), r, None), "ring")
                            ).forward.steps) for r in range(world)}
    assert len(steps) == 1
    _says(f"takes two steps each way ({steps.pop()} of {world} on {world} ranks in the tests)")


def test_the_rounds_on_four_gpus_are_the_runs_on_file():
    """The README's 4x H100 figures of the rounds: the GPU test's errors and messages, the
    sliding window's bytes and captured efficiency, and the causal window layer's forward,
    before (twice) and after (`h100x4_issue42_rounds/`)."""
    folder = RESULTS / "h100x4_issue42_rounds"
    lines = [x for x in (folder / "tests/gpu_tests.txt").read_text().splitlines()
             if x.startswith("case=") and ("window_size-" in x or "sliding_window-" in x)]
    fields = [dict(kv.split("=") for kv in x.split()) for x in lines]
    assert len(fields) == 8 and "3 passed" in (folder / "tests/gpu_tests.txt").read_text()
    assert max(float(f["err_out"]) for f in fields) <= 2.5e-3
    assert max(float(f[g]) for f in fields for g in ("err_dq", "err_dk", "err_dv")) <= 3.2e-3
    assert {int(f["fwd_msgs"]) for f in fields} <= {1, 2}

    def window(layout: str, side: str) -> dict:
        rows = _load(f"h100x4_issue42_rounds/bench/{layout}_{side}.json")["rows"]
        return next(r for r in rows if r["family"] == "sliding_window")

    sides = ("before", "before2")
    mb = lambda r: f"{r['sent_mb']['forward']:.1f} / {r['sent_mb']['backward']:.1f}"  # noqa
    after = {lay: window(lay, "after") for lay in ("contiguous", "area")}
    assert mb(after["contiguous"]) == mb(after["area"])
    assert all(mb(window(lay, s)) == mb(window(lay, "before")) for lay in after for s in sides)
    _says(f"sends\n{mb(after['area'])} MB forward / backward ({mb(window('contiguous', 'before'))}"
          f" contiguous and {mb(window('area', 'before'))} area before)")
    graph = {f"{r['efficiency_graph_fwd']:.2f}" for r in after.values()}
    old = [window(lay, s)["efficiency_graph_fwd"] for lay in after for s in sides]
    assert len(graph) == 1
    _says(f"captured forward reads {graph.pop()} of one GPU on both layouts ({_span(old)} before)")
    bwd = [window(lay, s)["efficiency_graph_bwd"] for lay in after for s in (*sides, "after")]
    _says(f"the backward stays at {_span(bwd)}")

    def layer(side: str, method: str) -> dict:
        rows = _load(f"h100x4_issue42_rounds/bench/window1024_{side}.json")["rows"]
        return next(r for r in rows if r["method"] == f"burst ({method} bwd)")

    fwd = lambda s: [layer(s, m)["fwd_ms"] for m in ("ring", "burst")]  # noqa: E731
    sent = {layer(s, m)["fwd_MiB"] for s in ("after",) for m in ("ring", "burst")}
    was = {layer(s, m)["fwd_MiB"] for s in sides for m in ("ring", "burst")}
    _says(f"its forward takes {_span(fwd('after'))} ms ({_span(fwd('before') + fwd('before2'))} "
          f"before) and sends {sent.pop():.0f}\nMiB a rank ({was.pop():.0f})")
    _says(f"its forward {_span(fwd('before') + fwd('before2'))} ms to {_span(fwd('after'))}")


def test_the_rows_kept_apart_are_the_runs_on_file():
    """The README's before / after figures of the forward's rows kept apart in fp32
    (`h100x2_issue42_wide_rows/`): back-to-back and captured forward ms, and efficiency."""
    def row(side: str, family: str) -> dict:
        rows = _load(f"h100x2_issue42_wide_rows/masks2/{side}.json")["rows"]
        return next(r for r in rows if r["family"] == family)

    def fwd(family: str, part: str) -> str:
        b, a, b2 = (row(s, family)[part]["fwd_ms"] for s in ("before", "after", "before2"))
        assert a < min(b, b2), (family, part)
        return f"{b:.3f} / {b2:.3f} -> {a:.3f} ms"

    eff = [f"{row(s, 'causal_blockwise')['efficiency_chained_fwd']:.2f}"
           for s in ("before", "before2", "after")]
    _says(f"causal blockwise's forward back to back: {fwd('causal_blockwise', 'burst_chained')}"
          f", {eff[0]} / {eff[1]} -> {eff[2]} of\none GPU")
    _says(f"captured: {fwd('causal_blockwise', 'burst_graph')}")
    _says(f"the global window's forward back to back: "
          f"{fwd('global_sliding_window', 'burst_chained')}")
    _says(f"shared question's forward back to back: {fwd('shared_question', 'burst_chained')}")
    for side in ("before", "after", "before2"):
        assert all(r["rel_err_vs_one_gpu"] < 3.1e-3
                   for r in _load(f"h100x2_issue42_wide_rows/masks2/{side}.json")["rows"])


def test_the_rows_that_take_three_partials_are_the_plans(monkeypatch):
    """The README's "578 of that rank's 8,192 rows take three partials": causal blockwise at
    8K tokens per GPU on 2 ranks, as `benchmarks/slice_masks.py` builds it, planned here as
    the trace's package planned it: a ring's plan not carved (it carves since the
    twenty-eighth session, and its carved cores give some rows a fourth partial)."""
    import sys
    import zlib

    from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
    from megatron_burst.kernels import thresholds
    from megatron_burst.plan import mask_families as mf

    monkeypatch.setattr(thresholds, "CARVE_RINGS", False)

    from .readme import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    from slice_masks import knobs, pile_like

    total = 2 * 8192
    name = "causal_blockwise"
    mask = mf.family(name, pile_like(total, seed=zlib.crc32(name.encode())), **knobs(total, 1.0))
    wide = []
    for rank in range(2):
        plan = build_plan(plan_key("area", 2, (total,), mask, 1, RingKey((0, 1), rank, None),
                                   "ring"))
        assert plan.rows == 8192 and plan.forward.uses[0] <= 3
        wide.append(sum(b - a for a, b in plan.forward.wide_rows))
    assert wide == [578, 0], wide
    _says(f"{wide[0]} of that rank's\n{plan.rows:,} rows take three partials")


def test_the_last_h100_mask_table_and_its_timeline_are_the_run_on_file():
    """The README's slice-mask table is the last run's printout, row for row
    (`h100x2_issue42_table_wide/`); its counts, and the trace on the same machine."""
    run = _mask_table_said(RESULTS / "h100x2_issue42_table_wide/sm.md",
                           "h100x2_issue42_table_wide/sm.json")
    graph = {f: r["efficiency_graph_fwd"] for f, r in run.items()}
    assert [f for f, e in graph.items() if e < 0.75] == ["sliding_window_causal"]
    bwd = [r["efficiency_graph_bwd"] for r in run.values()]
    _says(f"the forward reaches the issue's 0.75 in eleven\nfamilies of twelve (the causal "
          f"window at {graph['sliding_window_causal']:.2f}) and the backward in all twelve "
          f"({min(bwd):.2f}-{max(bwd):.2f})")
    chained = {f: (r["efficiency_chained_fwd"], r["efficiency_chained_bwd"])
               for f, r in run.items()}
    back = [b for _, b in chained.values()]
    assert min(back) >= 0.75 and sum(f >= 0.75 for f, _ in chained.values()) == 7
    _says(f"the eager backward reaches it in all twelve ({min(back):.2f}-{max(back):.2f}) and "
          f"the eager forward\nin seven")
    names = (("causal_document", "causal documents"), ("shared_question", "shared question"),
             ("causal_blockwise", "causal blockwise"), ("global_sliding_window",
                                                         "the global window"),
             ("block_causal_document", "block-causal documents"))
    assert {f for f, (e, _) in chained.items() if e < 0.75} == {f for f, _ in names}
    words = [f"{name} {chained[f][0]:.2f}" for f, name in names]
    _says(f"Below it: {words[0]}, {words[1]}, {words[2]},\n{words[3]} and {words[4]}.")
    err = max(r["rel_err_vs_one_gpu"] for r in run.values())
    assert err < 3.1e-3
    timeline = {(r["family"], r["rank"]): r
                for r in _load("h100x2_issue42_table_wide/timeline.json")["rows"]}
    held = [timeline[k] for k in (("causal_blockwise", 0), ("block_causal_document", 0),
                                  ("causal_document", 1))]
    idle = [r["idle_ms"] for r in held]
    first = [r["delay_us"][0] for r in held]
    _says(f"the GPUs idle {min(idle):.2f}-{max(idle):.2f} ms a forward, their kernels starting "
          f"{min(first):.0f}-{max(first):.0f} us after launch at\n  the 10th percentile")
    ahead = [timeline[("shared_question", r)]["delay_us"][0] for r in (0, 1)]
    assert min(ahead) > 1000  # milliseconds ahead, at the 10th percentile
    others = [r for k, r in timeline.items() if r not in held and k[0] != "shared_question"]
    assert all(r["idle_ms"] < 0.25 for r in others) and len(others) == 3


def test_the_flaw_in_that_trace_is_the_trace_on_file():
    """The README's correction: in `timeline.md` only the first family (causal documents)
    ran cuDNN for its large blocks; every later family ran the flash kernel alone."""
    rows = _load("h100x2_issue42_table_wide/timeline.json")["rows"]
    assert rows[0]["family"] == "causal_document"
    with_cudnn = {r["family"] for r in rows if "cudnn" in r["kinds_us"]}
    assert with_cudnn == {"causal_document"}, with_cudnn
    _says("In `timeline.md` only causal\ndocuments, the first family, ran the table's kernels.")


HOST_TRIMS = "h100x2_issue42_host_trims"
TRIM_RUNS = (("before (run 1)", "hp/before"), ("after (run 2)", "hp/after"),
             ("after (run 3)", "hp2/after2"), ("before (run 4)", "hp2/before3"),
             ("after (run 5)", "hp2/after3"))


def test_the_host_trims_figures_are_the_runs_on_file():
    """The README's host a forward against kernel calls, before and after the trims, and the
    results folder's compare.md, rebuilt from the five host_parts runs."""
    import sys

    sys.path.insert(0, str(RESULTS.parent))
    from host_parts_compare import rows, table

    found = rows([(label, _load(f"{HOST_TRIMS}/{path}/host_parts.json"))
                  for label, path in TRIM_RUNS])
    assert (RESULTS / HOST_TRIMS / "compare.md").read_text().strip() == table(found)
    ratio = {}
    for r in found:
        ratio.setdefault((r["family"], r["run"].split()[0]), []).append(r["host_per_kernel"])
    said = []
    for family, name in (("causal_document", "causal documents"),
                         ("shared_question", "shared question"),
                         ("causal_blockwise", "causal blockwise"),
                         ("block_causal_document", "block-causal documents")):
        before, after = ratio[family, "before"], ratio[family, "after"]
        assert max(after) < max(before)  # each after run below the slower before run
        said.append(f"{name} {before[0]:.2f} / {before[1]:.2f} -> {_span(after)}")
    _says(f"{said[0]}, {said[1]}, {said[2]}, {said[3]}")


def test_the_host_trims_folders_tables_are_its_runs():
    """The results folder's README: its host-against-kernel-calls table (from the five runs)
    and its back-to-back forward table (from masks2/*.json)."""
    import sys

    sys.path.insert(0, str(RESULTS.parent))
    from host_parts_compare import rows

    text = " ".join((RESULTS / HOST_TRIMS / "README.md").read_text().split())
    found = rows([(label, _load(f"{HOST_TRIMS}/{path}/host_parts.json"))
                  for label, path in TRIM_RUNS])
    names = {"causal_document": "causal documents", "shared_question": "shared question",
             "causal_blockwise": "causal blockwise",
             "block_causal_document": "block-causal documents"}
    for family, name in names.items():
        mine = [r for r in found if r["family"] == family]
        before = ", ".join(f"{r['host_per_kernel']:.2f}" for r in mine
                           if r["run"].startswith("before"))
        after = ", ".join(f"{r['host_per_kernel']:.2f}" for r in mine
                          if r["run"].startswith("after"))
        assert f"| {name} | {before} | {after} |" in text, (name, before, after)
    sides = [{r["family"]: r for r in _load(f"{HOST_TRIMS}/masks2/{side}.json")["rows"]}
             for side in ("before", "after", "before2")]
    for family, name in names.items():
        cells = " | ".join(f"{s[family]['efficiency_chained_fwd']:.2f}" for s in sides)
        assert f"| {name} | {cells} |" in text, (name, cells)
    assert max(r["rel_err_vs_one_gpu"] for s in sides for r in s.values()) <= 2.6e-3
    bwd = [r[k] for s in sides for r in s.values()
           for k in ("efficiency_bwd", "efficiency_chained_bwd")]
    assert f"from {min(bwd):.2f} to {max(bwd):.2f}" in text


def test_the_fresh_timeline_is_the_run_on_file():
    """The rerun trace (every family fresh): one rank host-bound in each of the five families
    below the line, both busy elsewhere, as the README and the folder's README say it; and
    the merge's direct launch timed beside it."""
    folder = "h100x2_issue42_timeline_fresh"
    rows = {(r["family"], r["rank"]): r for r in _load(f"{folder}/timeline.json")["rows"]}
    below = ("causal_document", "shared_question", "causal_blockwise",
             "global_sliding_window", "block_causal_document")
    held = [max((rows[(f, r)] for r in (0, 1)), key=lambda x: x["idle_ms"]) for f in below]
    ahead = [rows[(h["family"], 1 - h["rank"])]["delay_us"][1] / 1e3 for h in held]
    windows = ("sliding_window", "sliding_window_causal")
    rest = [r for (f, _), r in rows.items() if f not in below and f not in windows]
    wins = [rows[(f, r)]["idle_ms"] for f in windows for r in (0, 1)]
    assert len(rows) == 24 and all("cudnn" in rows[(f, r)]["kinds_us"]
                                   for f in below[:3] + below[4:] for r in (0, 1))
    text = (f"one rank's GPU idles {_span([h['idle_ms'] for h in held])} ms a forward, its\n"
            f"kernels starting {_span([h['delay_us'][0] for h in held], '{:.0f}')} us after "
            f"launch at the 10th percentile, while the other rank's host\nruns "
            f"{_span(ahead, '{:.1f}')} ms ahead at the median; in the other seven both GPUs "
            f"idle at most {max(r['idle_ms'] for r in rest):.2f} ms a\nforward, but for the two "
            f"sliding windows ({_span([w for w in wins if w > 0.2])} ms)")
    _says(text)
    said = (RESULTS / folder / "README.md").read_text()
    assert " ".join(f"{_span([h['idle_ms'] for h in held])} ms a forward".split()) in \
        " ".join(said.split())
    launch = _load(f"{folder}/merge_launch.json")["rows"]
    assert all(r["adopted"] and r["same_bits"] for r in launch)
    direct = _span([r["direct_us"] for r in launch], "{:.1f}")
    triton = _span([r["tritons_us"] for r in launch], "{:.1f}")
    _says(f"{direct} us of host a launch against Triton's {triton}")


def test_the_priced_deal_trial_is_the_run_on_file():
    """The priced `area` deal, reverted, as the README says it (before / before again ->
    after, causal documents)."""
    folder = "h100x2_issue42_area_price_rejected"
    run = {side: next(r for r in _load(f"{folder}/{side}.json")["rows"]
                      if r["family"] == "causal_document")
           for side in ("before", "after", "before2")}

    def said(get) -> str:
        return _before_after(_sides(folder, get), "causal_document")

    assert run["before"]["balance_area"] == run["before2"]["balance_area"]
    _says(f"at an area\nbalance of {run['before']['balance_area']:.3f})")
    _says(f"the captured forward did run faster: "
          f"{said(lambda r: r['burst_graph']['fwd_ms'])} ms")
    _says(f"the backward's busiest rank sent {run['before']['sent_mb']['backward']:.1f} -> "
          f"{run['after']['sent_mb']['backward']:.1f} MB")
    _says(f"the captured forward +\nbackward took {said(lambda r: r['burst_graph']['fwd_bwd_ms'])}"
          f" ms (eager with a new pack every call, {said(lambda r: r['burst_fresh']['ms'])})")
    timeline = {(r["family"], r["rank"]): r["kinds_us"]
                for r in _load("h100x2_issue42_timeline_fresh/timeline.json")["rows"]}
    kernels = [sum(v for k, v in timeline[("causal_document", r)].items()
                   if k in ("flash", "cudnn")) / 1e3 for r in (0, 1)]
    _says(f"rank 0's attention kernels {kernels[0]:.2f} ms a\nforward against rank 1's "
          f"{kernels[1]:.2f}")


def test_the_flash_only_probe_is_the_run_on_file():
    """The flash-alone probe as the README says it: automatic (two runs) -> flash alone (two
    runs), back to back."""
    folder = "h100x2_issue42_flash_only"
    runs = {run: {r["family"]: r for r in _load(f"{folder}/{run}.json")["rows"]}
            for run in ("auto", "auto2", "flash", "flash2")}
    assert [_load(f"{folder}/{run}.json")["meta"]["kernel"] for run in runs] == \
        [None, None, "torch-flash", "torch-flash"]

    def said(family, get, fmt="{:.3f}") -> str:
        return " -> ".join(" / ".join(fmt.format(get(runs[run][family])) for run in pair)
                           for pair in (("auto", "auto2"), ("flash", "flash2")))

    fwd = lambda r: r["burst_chained"]["fwd_ms"]  # noqa: E731
    _says(f"went {said('block_causal_document', fwd)} ms "
          f"({said('block_causal_document', lambda r: r['efficiency_chained_fwd'], '{:.2f}')}"
          f" of one GPU)")
    _says(f"back to back "
          f"{said('block_causal_document', lambda r: r['burst_chained']['fwd_bwd_ms'])};")
    _says(f"back to back were slower ({said('causal_document', fwd)},\n"
          f"{said('causal_blockwise', fwd)})")


HOST_CORES = "h100x2_issue42_host_cores"
_PINNED_RUNS = {"fast": ("first/fast", "second/fast", "second/fast2"),
                "free": ("first/free", "second/free", "second/free2"), "slow": ("first/slow",)}


def _host_core_rows(way: str) -> list[dict]:
    """Every family row of ``way``'s runs (fast / free / slow) in the host-cores folder,
    each checked to have been pinned as its name says."""
    rows = []
    for run in _PINNED_RUNS[way]:
        data = _load(f"{HOST_CORES}/{run}.json")
        pinned = data["meta"]["pinned"]
        assert (pinned["which"] if pinned else "free") == way, run
        rows += data["rows"]
    return rows


def test_the_host_cores_runs_are_on_file():
    """The CPUs' spread, the counts at the line pinned fast and unpinned, and block-causal
    documents' two modes, as the README and the folder's README say them."""
    folder = " ".join((RESULTS / HOST_CORES / "README.md").read_text().split())
    cpus = _load(f"{HOST_CORES}/second/cpus_before.json")["rows"]
    every = [r["ms"] for r in cpus] + [r["ms_again"] for r in cpus]
    apart = max(max(r["ms"], r["ms_again"]) / min(r["ms"], r["ms_again"]) for r in cpus)
    _says(f"in {_span(every, '{:.1f}')} ms, and a CPU's two timings seconds apart\n"
          f"differed by up to {apart:.1f}x")
    assert f"twice: {_span(every, '{:.1f}')} ms" in folder
    assert f"differ by up to {apart:.1f}x" in folder
    met = {way: sum(r["efficiency_chained_fwd"] >= 0.75 for r in _host_core_rows(way))
           for way in ("fast", "free")}
    runs = {way: len(_host_core_rows(way)) for way in ("fast", "free")}
    _says(f"back in {met['fast']} of {runs['fast']} runs; unpinned, in {met['free']} of "
          f"{runs['free']}.")
    _says(f"those five\n  families met it in {met['fast']} of {runs['fast']} runs")
    assert f"met 0.75 in {met['fast']} of {runs['fast']} runs; unpinned, in {met['free']} " \
           f"of {runs['free']}" in folder
    blocks = [r for way in _PINNED_RUNS for r in _host_core_rows(way)
              if r["family"] == "block_causal_document"]
    at = [r for r in blocks if r["efficiency_chained_fwd"] >= 0.75]
    below = [r for r in blocks if r["efficiency_chained_fwd"] < 0.75]
    ms = lambda rows: [r["burst_chained"]["fwd_ms"] for r in rows]  # noqa: E731
    eff = lambda rows: [r["efficiency_chained_fwd"] for r in rows]  # noqa: E731
    _says(f"Block-causal documents took {_span(ms(at), '{:.3f}')} ms a\nforward in its runs "
          f"at or above the line ({_span(eff(at))} of one GPU) and {_span(ms(below), '{:.3f}')}"
          f" in those\nbelow ({_span(eff(below))})")
    both = [r["burst_chained"]["fwd_bwd_ms"] for r in blocks]
    _says(f"back to back took\n{_span(both, '{:.3f}')} ms in every run")
    assert f"(block-causal documents {_span(both, '{:.3f}')} ms)" in folder
    backward = [r["efficiency_chained_bwd"] for way in _PINNED_RUNS
                for r in _host_core_rows(way)]
    assert f"met 0.75 in every run ({_span(backward)})" in folder
    worst = max(r["rel_err_vs_one_gpu"] for way in _PINNED_RUNS for r in _host_core_rows(way))
    assert worst <= 2.6e-3 and "within 2.6e-3 of one GPU's" in folder


def test_the_host_cores_folder_table_is_the_runs():
    """Each cell of the folder's table: the family's forward ms and share of one GPU back to
    back, run by run in the order the table names them."""
    folder = (RESULTS / HOST_CORES / "README.md").read_text()
    names = {"block_causal_document": "block-causal documents",
             "causal_document": "causal documents", "shared_question": "shared question",
             "causal_blockwise": "causal blockwise",
             "global_sliding_window": "global sliding window"}
    for family, name in names.items():
        cells = []
        for way in ("fast", "free", "slow"):
            rows = [r for r in _host_core_rows(way) if r["family"] == family]
            cells.append(", ".join(f"{r['burst_chained']['fwd_ms']:.3f}" for r in rows)
                         + " / " + ", ".join(f"{r['efficiency_chained_fwd']:.2f}"
                                             for r in rows) if rows else "-")
        assert f"| {name} | {' | '.join(cells)} |" in folder, (name, cells)


def test_the_slow_cpus_captured_run_is_on_file():
    """The other machine's run pinned to its slowest CPUs, with the captured column: the
    eager and captured forward of block-causal documents, and every family captured."""
    data = _load(f"{HOST_CORES}/third/slow.json")
    assert data["meta"]["pinned"]["which"] == "slow" and "--graph" in data["meta"]["command"]
    rows = {r["family"]: r for r in data["rows"]}
    block = rows["block_causal_document"]
    said = (f"took {block['burst_chained']['fwd_ms']:.3f} ms back to back "
            f"({block['efficiency_chained_fwd']:.2f}) and {block['burst_graph']['fwd_ms']:.3f} "
            f"captured in CUDA graphs ({block['efficiency_graph_fwd']:.2f})")
    _says(said)
    captured = [r["efficiency_graph_fwd"] for r in rows.values()]
    assert len(captured) == 5 and min(captured) >= 0.75
    _says(f"all\nfive families ran at {_span(captured)} of one GPU")
    folder = " ".join((RESULTS / HOST_CORES / "README.md").read_text().split())
    pins = " / ".join(f"{ms:.1f}" for ms in data["meta"]["pinned"]["ms"])
    assert f"slowest CPUs ({pins} ms at the loop;" in folder
    assert f"forward took {block['burst_chained']['fwd_ms']:.3f} ms back to back " \
           f"({block['efficiency_chained_fwd']:.2f} of one GPU)" in folder
    assert f"ran at {_span(captured)} of one GPU there" in folder


def test_the_slice_plan_times_are_the_runs_on_file():
    """Planning before and after the numpy cut, as the README and the folder say it: the two
    families it names, and no family on either world slower (the slower rank of 0 and 1)."""
    runs = {side: {(r["family"], r["world"]): max(r["rank0_ms"], r["rank1_ms"])
                   for r in _load(f"cpu_slice_plans/{side}.json")["rows"]}
            for side in ("before", "after")}
    assert _load("cpu_slice_plans/before.json")["meta"]["package"].endswith(
        ".before48/megatron_burst")
    folder = " ".join((RESULTS / "cpu_slice_plans" / "README.md").read_text().split())
    for family, name in (("global_sliding_window", "global sliding window's plan"),
                         ("causal_blockwise", "causal blockwise's")):
        before, after = runs["before"][family, 8], runs["after"][family, 8]
        _says(f"{name} {before:.1f} -> {after:.1f}")
        assert f"{before:,.1f}" in folder and f"{after:.1f}" in folder
    slower = [key for key, ms in runs["after"].items()
              if round(ms, 1) > round(runs["before"][key], 1) + 0.1 + 1e-9]
    assert not slower, slower  # "no family on 2 or 8 ranks slower by more than 0.1 ms"


DIRECT_RUN = "h100x2_issue42_direct_run"


def test_the_direct_run_figures_are_the_runs_on_file():
    """The merge's direct `run`: the launch probe's span each way, the in-process A/B's
    ratios by family (the README groups all but block-causal documents and shared question),
    every way's bits, and the table's back-to-back forward, as the README and folder say."""
    launch = _load(f"{DIRECT_RUN}/gpu_tests/merge_launch.json")["rows"]
    direct = _span([r["direct_us"] for r in launch], "{:.1f}")
    theirs = _span([r["tritons_us"] for r in launch], "{:.1f}")
    assert all(r["adopted"] and r["same_bits"] for r in launch)
    _says(f"{direct} us a launch against Triton's\nown {theirs}")
    folder = " ".join((RESULTS / DIRECT_RUN / "README.md").read_text().split())
    assert f"direct {direct} us a launch against Triton's own {theirs}" in folder
    ab = _load(f"{DIRECT_RUN}/launch_ab.json")["rows"]
    assert all(r["same_bits"] and r["adopted"] == 4 for r in ab)
    ratio = lambda family: [r["ratio"] for r in ab if r["family"] == family]  # noqa: E731
    others = [x for f in ("causal_document", "causal_blockwise", "global_sliding_window")
              for x in ratio(f)]
    _says(f"the forward took\n{_span(ratio('block_causal_document'), '{:.3f}')} of the "
          f"runner's time in block-causal documents and {_span(others, '{:.3f}')} in three "
          f"other\nfamilies")
    _says(f"({_span(ratio('shared_question'), '{:.3f}')})")
    for family, words in (("block_causal_document", "block-causal documents"),
                          ("causal_document", "causal documents"),
                          ("shared_question", "shared question")):
        assert f"{words} {_span(ratio(family), '{:.3f}')}" in folder, family
    table = _load(f"{DIRECT_RUN}/table.json")["rows"]
    forward = [r["efficiency_chained_fwd"] for r in table]
    _says(f"back-to-back forward at {_span(forward)} of one GPU")
    below = {r["family"]: r["efficiency_chained_fwd"] for r in table
             if r["efficiency_chained_fwd"] < 0.75}
    assert sorted(below) == ["block_causal_document", "shared_question"], below
    _says(f"shared question ({below['shared_question']:.3f}) and block-causal documents "
          f"({below['block_causal_document']:.3f}) below the line")
    assert f"back-to-back forward {below['block_causal_document']:.3f}" in folder
    assert f"{below['shared_question']:.3f} (shared question)" in folder
    backward = [r["efficiency_chained_bwd"] for r in table]
    assert f"the backward {_span(backward)}" in folder
    assert max(r["rel_err_vs_one_gpu"] for r in table) <= 2.6e-3


def test_the_rows_without_blocks_plan_times_are_the_runs_on_file():
    """The two families the README names, before / after in both alternating runs; every
    other family within 0.2 ms of its before figure, but the one the folder names."""
    folder_name = "cpu_slice_plans_rows"
    runs = {w: {(r["family"], r["world"]): max(r["rank0_ms"], r["rank1_ms"])
                for r in _load(f"{folder_name}/{w}.json")["rows"]}
            for w in ("before", "after", "before2", "after2")}
    for w in ("before", "before2"):
        assert _load(f"{folder_name}/{w}.json")["meta"]["package"].endswith(
            ".before49/megatron_burst")
    folder = " ".join((RESULTS / folder_name / "README.md").read_text().split())
    for family, name in (("global_sliding_window", "the global sliding window"),
                         ("causal_blockwise", "causal blockwise")):
        ms = [f"{runs[w][family, 8]:.1f}" for w in ("before", "before2", "after", "after2")]
        said = f"{name} {ms[0]} / {ms[1]} -> {ms[2]} / {ms[3]}"
        _says(said)
        assert f"{name} on 8 ranks: {ms[0]} / {ms[1]} -> {ms[2]} / {ms[3]}" in folder
    named = {("global_sliding_window", 8), ("causal_blockwise", 8)}
    moved = {(key, w) for key in runs["before"] if key not in named for w in ("after", "after2")
             if abs(round(runs[w][key], 1) - round(runs["before"][key], 1)) > 0.2 + 1e-9}
    assert moved == {(("shared_question", 8), "after2")}, moved
    assert f"({runs['after2']['shared_question', 8]:.1f} against " \
           f"{runs['before']['shared_question', 8]:.1f} in the other three" in folder


H200_TABLE = "h200x2_issue42_table"
SPLITS = "h200x2_issue42_kernel_splits_rejected"
PLACEMENT = "h200x2_issue42_host_placement"


def _folder(name: str) -> str:
    return " ".join((RESULTS / name / "README.md").read_text().split())


def test_the_h200_table_figures_are_the_run_on_file():
    """The 2x H200 table's spans as the README and its folder give them: captured both ways
    and back-to-back backward in all twelve, back-to-back forward in eleven."""
    rows = _load(f"{H200_TABLE}/table/sm.json")["rows"]
    assert len(rows) == 12 and max(r["rel_err_vs_one_gpu"] for r in rows) <= 3.1e-3
    value = {r["family"]: r for r in rows}
    span = lambda key, skip=(): _span([r[key] for r in rows if r["family"] not in skip],  # noqa
                                      "{:.3f}")
    folder = _folder(H200_TABLE)
    for key, words in (("efficiency_graph_fwd", "forward reaches 0.75 of one GPU in all twelve "
                                                "families ({})"),
                       ("efficiency_graph_bwd", "backward too ({})"),
                       ("efficiency_chained_bwd", "the backward in all twelve ({})")):
        assert min(r[key] for r in rows) >= 0.75, key
        _says(words.format(span(key)))
    below = [f for f, r in value.items() if r["efficiency_chained_fwd"] < 0.75]
    assert below == ["block_causal_document"]
    bcd = value["block_causal_document"]
    _says(f"the forward in eleven ({span('efficiency_chained_fwd', below)})")
    _says(f"block-causal documents' host-bound forward at {bcd['efficiency_chained_fwd']:.3f} "
          f"({bcd['efficiency_graph_fwd']:.3f} captured)")
    assert f"the forward in eleven ({span('efficiency_chained_fwd', below)})" in folder
    assert sum(r["efficiency_fwd"] >= 0.75 for r in rows) == 5 and "in five families" in folder


def test_the_native_profile_shares_are_the_run_on_file():
    """The message group's and cuDNN's and the merge launches' spans over both ranks of the
    five families, as the README says them."""
    rows = _load("h200x2_issue42_native_profile/summary.json")["rows"]
    assert len(rows) == 10
    share = lambda *cats: [100 * sum(r["share"].get(c, 0) for c in cats)  # noqa: E731
                           for r in rows]
    messages = share("send", "pack", "wait", "headers", "consensus")
    _says(f"one hop's messages at {_span(messages, '{:.0f}')}% of a host-bound forward")
    _says(f"cuDNN's calls at {_span(share('cudnn'), '{:.0f}')}%")
    _says(f"the merge's launches at {_span(share('merge launch'), '{:.0f}')}%")
    folder = _folder("h200x2_issue42_native_profile")
    assert f"the deferred header check 1-2%: {_span(messages, '{:.0f}')}% together" in folder


def test_the_split_and_placement_ratios_are_the_runs_on_file():
    """The rejected kernel splits' worst forward + backward and the lone rule's finer span,
    the placements' span, and the neighbours' and the forward's times, as the README says."""
    worst = max(r["summary"][w]["fwd+bwd"]["ratio"] for name in ("split_ab", "split_ab_rest")
                for r in _load(f"{SPLITS}/{name}.json")["rows"] for w in r["summary"])
    _says(f"made forward + backward up to\n{worst:.3f}x slower")
    lone = [r["summary"]["2M lone"]["fwd"]["ratio"]
            for r in _load(f"{SPLITS}/finer/split_ab_lone.json")["rows"]]
    _says(f"gained nothing in 30 rounds ({_span(lone, '{:.3f}')} of\nthe package's forward)")
    placed = [r["ratio"][w] for call in ("three_ways", "four_ways", "settled")
              for r in _load(f"{PLACEMENT}/{call}/thread_ab.json")["rows"]
              for w in ("main", "alone")]
    _says(f"read {_span(placed, '{:.3f}')} of unpinned")
    bcd = [r["ms"]["free"] for call in ("three_ways", "four_ways")
           for r in _load(f"{PLACEMENT}/{call}/thread_ab.json")["rows"]
           if r["family"] == "block_causal_document" and r["rank"] == 0]
    _says(f"took {bcd[0]:.3f} ms\nin one call and {bcd[1]:.3f} in another")
    for target in _load(f"{PLACEMENT}/neighbours.json")["rows"]:
        assert min(target["spun"].values()) < sorted(target["alone"])[1] / 1.8


def _block_causal_and_others(rows: list) -> tuple[list, str]:
    """An A/B's block-causal documents rows by rank, and the other families' ratios' span."""
    bcd = sorted((r for r in rows if r["family"] == "block_causal_document"),
                 key=lambda r: r["rank"])
    return bcd, _span([r["ratio"] for r in rows if r["family"] != "block_causal_document"],
                      "{:.3f}")


def test_the_joined_home_figures_are_the_run_on_file():
    """Block-causal documents' ratio on both ranks and its first rank's times, the other
    families' span, every way's bits, as the README and the folder say."""
    rows = _load("h200x2_issue42_pieces/pieces_ab.json")["rows"]
    assert all(r["same_bits"] for r in rows)
    bcd, others = _block_causal_and_others(rows)
    assert all(r["joins"] for r in bcd)
    pair = f"{bcd[0]['ratio']:.3f} /\n{bcd[1]['ratio']:.3f}"
    _says(f"took {pair} of the time on its two ranks ({bcd[0]['ms']['written']:.3f} -> "
          f"{bcd[0]['ms']['joined']:.3f} ms)")
    _says(f"the other families {others}")
    assert f"read {others}" in _folder("h200x2_issue42_pieces")


def test_the_in_place_figures_are_the_run_on_file():
    """Block-causal documents' ratio on both ranks and its first rank's times, the other
    families' span and every family's bits, as the README and the folder say."""
    rows = _load("h200x2_issue42_in_place/in_place_ab.json")["rows"]
    assert all(r["admitted"] and r["diff"]["in place"] == 0.0 for r in rows)
    bcd, others = _block_causal_and_others(rows)
    _says(f"took {bcd[0]['ratio']:.3f} / {bcd[1]['ratio']:.3f} of the time on its two\nranks "
          f"({bcd[0]['ms']['packed']:.3f} -> {bcd[0]['ms']['in place']:.3f} ms)")
    _says(f"three other families {others}")
    assert f"the other three families {others}" in _folder("h200x2_issue42_in_place")
    last = (RESULTS / "h200x2_issue42_in_place" / "gpu_all_tests.txt").read_text().splitlines()
    passed, skipped = map(int, re.search(r"(\d+) passed, (\d+) skipped", last[-1]).groups())
    assert "failed" not in last[-1] and "error" not in last[-1]
    _says(f"Every GPU test\nfile passed with the form on ({passed} passed, {skipped} skipped")


def test_the_two_in_place_tables_are_the_runs_on_file():
    """Both readings: captured both ways and back-to-back backward in all twelve, the
    back-to-back forward in eleven with the family below and its figure, as said."""
    said = []
    for name in ("h200x2_issue42_table_in_place", "h200x2_issue42_table_in_place_again"):
        rows = _load(f"{name}/table/sm.json")["rows"]
        assert len(rows) == 12 and max(r["rel_err_vs_one_gpu"] for r in rows) <= 3.1e-3
        for key in ("efficiency_graph_fwd", "efficiency_graph_bwd", "efficiency_chained_bwd"):
            assert min(r[key] for r in rows) >= 0.75, (name, key)
        graph = [_span([r[k] for r in rows], "{:.3f}") for k in ("efficiency_graph_fwd",
                                                                 "efficiency_graph_bwd")]
        said.append(" / ".join(graph))
        below = [r for r in rows if r["efficiency_chained_fwd"] < 0.75]
        assert len(below) == 1
        said.append((below[0]["family"], f"{below[0]['efficiency_chained_fwd']:.3f}"))
    assert said[1] == ("causal_document", "0.719") and said[3][0] == "block_causal_document"
    _says(f"({said[0]}, then\n{said[2]})")
    _says(f"causal documents at {said[1][1]}")
    _says(f"then block-causal documents at\n{said[3][1]}")
    first = {r["family"]: r for r in _load("h200x2_issue42_table_in_place/table/sm.json")["rows"]}
    _says(f"{first['block_causal_document']['efficiency_chained_fwd']:.3f} on the first")


def test_the_dense_threshold_figures_are_the_runs_on_file():
    """The mended A/B's ways differ in bits and its ratios are the README's; the flawed
    run's ways were one plan (no difference at all), as its folder says."""
    rows = _load("h200x2_issue42_dense_threshold/split_ab.json")["rows"]
    assert all(r["max_rel_diff"] > 0 for r in rows)
    ratio = {(r["family"], r["rank"], w): s for r in rows for w, s in r["summary"].items()}
    cd, bcd = "causal_document", "block_causal_document"
    _says(f"(causal documents {ratio[cd, 0, '1048576:0']['fwd']['ratio']:.3f} at 1M")
    b = [ratio[bcd, rank, w]["fwd"]["ratio"] for rank in (0, 1)
         for w in ("1048576:0", "524288:0")]
    _says(f"block-causal documents {_span(b, '{:.3f}')})")
    both = [ratio[cd, rank, "1048576:0"]["fwd+bwd"]["ratio"] for rank in (0, 1)]
    _says(f"forward + backward faster ({_span(both, '{:.3f}')} at 1M)")
    one = [ratio[cd, 0, w]["1 GPU fwd"]["ms"] for w in ("2M", "1048576:0")]
    _says(f"(its forward {one[0]:.3f} ->\n{one[1]:.3f} ms)")
    flawed = _load("h200x2_issue42_fewer_flash_flawed/split_ab.json")["rows"]
    assert all(r["max_rel_diff"] == 0 for r in flawed)
    noise = [s[step]["ratio"] for r in flawed for s in r["summary"].values()
             for step in ("fwd", "fwd+bwd")]
    assert f"forwards: {_span(noise, '{:.3f}')}" in _folder("h200x2_issue42_fewer_flash_flawed")


def test_the_per_pass_threshold_figures_are_the_run_on_file():
    """The A/B of a threshold per pass: the CP=2 forward one plan (same bits), forward +
    backward and one GPU's figures as the README and its folder give them."""
    rows = _load("h200x2_issue42_dense_threshold_per_pass/split_ab.json")["rows"]
    assert all(r["max_rel_diff"] == 0 for r in rows)
    med = {r["family"]: r["summary"] for r in rows if r["rank"] == 0}
    both = {f: m["2M/1M"]["fwd+bwd"]["ratio"] for f, m in med.items()}
    blockwise = both.pop("causal_blockwise")
    _says(f"the CP=2 forward + backward took\n{_span(both.values(), '{:.3f}')} of the time in "
          f"four families and {blockwise:.3f} in causal blockwise")
    assert all(m["2M/1M"][s]["ms"] < m["2M"][s]["ms"] for m in med.values()
               for s in ("1 GPU fwd", "1 GPU fwd+bwd"))  # one GPU faster in every family
    one = med["block_causal_document"]
    _says(f"block-causal documents' forward {one['2M']['1 GPU fwd']['ms']:.3f} ->\n"
          f"{one['2M/1M']['1 GPU fwd']['ms']:.3f} ms")
    folder = _folder("h200x2_issue42_dense_threshold_per_pass")
    for f, name in (("causal_document", "causal documents"), ("full_document", "full documents")):
        assert f"| {name} | {med[f]['2M/1M']['fwd+bwd']['ratio']:.3f} |" in folder
    last = (RESULTS / "h200x2_issue42_dense_threshold_per_pass" / "gpu_all_tests.txt"
            ).read_text().splitlines()[-1]
    assert "94 passed, 3 skipped" in last and "failed" not in last


def test_the_per_pass_tables_are_the_runs_on_file():
    """Both readings: captured both ways in all twelve; back to back, the counts and the
    families below as the README says; the causal window's times against the last tables."""
    names = ("h200x2_issue42_table_per_pass", "h200x2_issue42_table_per_pass_again")
    tables = [{r["family"]: r for r in _load(f"{n}/table/sm.json")["rows"]} for n in names]
    for rows in tables:
        assert len(rows) == 12 and max(r["rel_err_vs_one_gpu"] for r in rows.values()) <= 3.1e-3
        for key in ("efficiency_graph_fwd", "efficiency_graph_bwd"):
            assert min(r[key] for r in rows.values()) >= 0.75
    graph = [_span([r["efficiency_graph_fwd"] for r in t.values()], "{:.3f}") for t in tables]
    _says(f"(the forward {graph[0]}, then {graph[1]})")
    count = [[sum(r[k] >= 0.75 for r in t.values()) for t in tables]
             for k in ("efficiency_chained_bwd", "efficiency_chained_fwd")]
    assert count == [[12, 10], [9, 8]]
    _says("the backward reaches it in twelve, then ten, and the forward in nine, then eight")
    for fam, name in (("causal_document", "causal\ndocuments"),
                      ("sliding_window_causal", "the causal sliding window"),
                      ("block_causal_document", "block-causal documents")):
        got = [t[fam]["efficiency_chained_fwd"] for t in tables]
        assert max(got) < 0.75
        _says(f"{name} ({got[0]:.3f}, {got[1]:.3f})")
    window = tables[0]["sliding_window_causal"]
    before = {r["family"]: r for r in
              _load("h200x2_issue42_table_in_place/table/sm.json")["rows"]}["sliding_window_causal"]
    ms = [r[k]["fwd_ms"] for k in ("burst_graph", "burst_chained") for r in (window, before)]
    _says(f"captured at its old speed ({ms[0]:.3f} ms\nagainst {ms[1]:.3f}) but back to back "
          f"at {ms[2]:.3f} ms against {ms[3]:.3f}")
    _says("On 2 H200, against one GPU\n  planned at its own best (a dense threshold per pass): "
          "captured, the forward and backward\n  in all twelve, in each of two runs; back to "
          "back, on two machines whose hosts were slow,\n  the backward in twelve and ten, the "
          "forward in nine and eight")


def test_the_deal_scan_figures_are_the_runs_on_file():
    """The best deal of causal documents and the package's own deal timed again, by the
    slower rank, as the README and the folder say."""
    import sys

    sys.path.insert(0, str(RESULTS.parent))
    import deal_scan

    rows = _load("h200x2_issue42_deal_scan/k4_slowest_rank.json")["rows"]
    med = deal_scan.slowest(rows)["causal_document"]
    best = min(med, key=lambda w: med[w]["fwd"][1])
    assert best == "0,1,2,7"
    _says(f"causal documents' best deal took {med[best]['fwd'][1]:.3f} of its\nforward time, "
          f"and the package's own deal, timed again under its chunks' name, "
          f"{med['0,1,3,7']['fwd'][1]:.3f}")
    assert f"read {med['0,1,3,7']['fwd'][1]:.3f} of itself" in _folder("h200x2_issue42_deal_scan")


IN_LAYER = "h200x2_issue42_in_layer"


def _in_layer(run: str) -> dict:
    return {r["family"]: r for r in _load(f"{IN_LAYER}/{run}.json")["rows"]}


def _slow(row: dict, key: str) -> float:
    return max(x["in_layer"][key] for x in row["burst_ranks"])


def test_the_in_layer_figures_are_the_runs_on_file():
    """The A/B of the forward's threshold inside a layer (three processes: 2M, 1M, 2M), the
    host ahead in every step, and the eleven families at their new plans, as the README and
    the folder say."""
    ab = [_in_layer(f"ab/il/in_layer_{i}_{area}")
          for i, area in ((1, 2097152), (2, 1048576), (3, 2097152))]
    before = _in_layer("before/il/in_layer")
    for rows in ab:
        assert all(x["in_layer"]["ahead_fwd"] == x["in_layer"]["ahead_bwd"] == 15
                   for r in rows.values() for x in r["burst_ranks"])
    assert all(abs(_slow(ab[0][f], "fwd_ms") / _slow(ab[2][f], "fwd_ms") - 1) <= 0.012
               for f in ab[0])
    folder = _folder(IN_LAYER)
    for fam, name in (("causal_document", "causal documents"),
                      ("block_causal_document", "block-causal documents"),
                      ("causal_blockwise", "causal blockwise")):
        ms = [_slow(rows[fam], "fwd_ms") for rows in ab]
        _says(f"{name} {ms[0]:.3f} / {ms[2]:.3f} -> {ms[1]:.3f}")
        eff = [rows[fam]["efficiency_in_layer_fwd"] for rows in ab]
        assert (f"{name} {ms[0]:.3f} / {ms[2]:.3f} -> {ms[1]:.3f} ms (efficiency {eff[0]:.3f} /"
                in folder or f"{name} {ms[0]:.3f} / {ms[2]:.3f} -> {ms[1]:.3f} ({eff[0]:.3f} /"
                in folder), name
    others = [f for f in ab[0] if f not in ("causal_document", "block_causal_document",
                                             "causal_blockwise")]
    assert len(others) == 4 and all(
        abs(_slow(ab[1][f], "fwd_ms") / _slow(r[f], "fwd_ms") - 1) <= 0.015
        for f in others for r in (ab[0], ab[2]))
    # The families at their new plans: ab's 1M run where the plan changed, before's elsewhere.
    now = {**{f: r for f, r in before.items() if f not in ab[1]}, **ab[1]}
    now.pop("prefix_lm_document")  # its plan changed and it was not in the A/B
    assert len(now) == 11
    low = {f: r["efficiency_in_layer_fwd"] for f, r in now.items()
           if r["efficiency_in_layer_fwd"] < 0.75}
    assert list(low) == ["shared_question"]
    sq = [r["shared_question"]["efficiency_in_layer_fwd"] for r in (before, *ab)]
    _says(f"shared question reading {low['shared_question']:.3f} "
          f"({_span(sq, '{:.3f}')} over four runs")
    _says(f"the backward\n{min(r['efficiency_in_layer_bwd'] for r in now.values()):.3f} or more")
    one = before["causal_document"]["one_gpu_plan"]["in_layer"]["fwd_ms"]
    alone = {r["family"]: r for r in _load(f"{IN_LAYER}/before/table/sm.json")["rows"]}
    _says(f"(one GPU's causal documents forward: {one:.3f} ms in the layer, "
          f"{alone['causal_document']['one_gpu_plan_chained']['fwd_ms']:.3f} ms alone)")


def test_the_table_after_the_forward_threshold_is_the_run_on_file():
    before, after = ({r["family"]: r for r in _load(f"{IN_LAYER}/{run}/table/sm.json")["rows"]}
                     for run in ("before", "after"))
    assert max(r["rel_err_vs_one_gpu"] for r in after.values()) <= 3.1e-3
    for fam, name in (("causal_document", "causal documents"),
                      ("block_causal_document", "block-causal documents")):
        _says(f"{name} {before[fam]['burst_graph']['fwd_ms']:.3f} ->\n"
              f"{after[fam]['burst_graph']['fwd_ms']:.3f}")
    bcd = [r["block_causal_document"] for r in (before, after)]
    _says(f"block-causal documents {bcd[0]['burst_chained']['fwd_ms']:.3f} -> "
          f"{bcd[1]['burst_chained']['fwd_ms']:.3f} ms, "
          f"{bcd[0]['efficiency_chained_fwd']:.2f} -> {bcd[1]['efficiency_chained_fwd']:.2f} "
          f"of one GPU")


def test_the_forward_plans_the_threshold_moves_are_the_ones_named():
    """At the issue's shape (8K tokens a GPU, 2 ranks) the forward threshold 2M -> 1M moves
    the plans of the six families the folder names, and block-causal documents' rank 0 makes
    10 forward calls where it would make 4 (9 and 5 before the area layout's cuts moved between
    slices), as the README says."""
    import sys

    from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key

    sys.path.insert(0, str(RESULTS.parent))
    from slice_masks import family_mask

    def forward(name, rank, dense):
        key = plan_key("area", 2, (16384,), family_mask(name, 16384), 1,
                       RingKey((0, 1), rank, None), "burst", dense_min_area=dense,
                       gpu_bound_min_area=2.0 ** 20)
        return [[(c.varlen, c.blocks) for c in s.calls] for s in build_plan(key).forward.steps]

    from megatron_burst.plan import mask_families as mf

    moved = [f for f in mf.FAMILIES
             if any(forward(f, r, 2.0 ** 21) != forward(f, r, 2.0 ** 20) for r in (0, 1))]
    assert moved == ["full_document", "causal_document", "shared_question", "causal_blockwise",
                     "prefix_lm_document", "block_causal_document"]
    assert ("six families change, counted on the CPU: full documents, causal documents, shared "
            "question, causal blockwise, prefix-LM documents and block-causal documents"
            in _folder(IN_LAYER))
    calls = [sum(map(len, forward("block_causal_document", 0, t))) for t in (2.0 ** 21, 2.0 ** 20)]
    assert calls == [4, 10]
    _says("its forward made\n9 kernel calls on rank 0 where it made 5; with the area layout's "
          "cuts between slices, since,\n10 where it would make 4")


def test_the_fresh_gradient_and_new_pack_figures_are_the_runs_on_file():
    """All twelve families at 0.75 in the layer with fresh gradients (and the two repeats of
    the three nearest the line); the new-pack forward and backward; the carving's gains on
    one GPU and its loss in a ring; the deal scan in the layer: as the README says."""
    fresh = _in_layer("fresh_grads/il/in_layer")
    assert len(fresh) == 12
    low_f = min(fresh.values(), key=lambda r: r["efficiency_in_layer_fwd"])
    low_b = min(fresh.values(), key=lambda r: r["efficiency_in_layer_bwd"])
    assert (low_f["family"], low_b["family"]) == ("shared_question", "causal_blockwise")
    reps = [_in_layer(f"fresh_grads/repeats/in_layer_{i}") for i in (1, 2)]
    _says(f"the forward {low_f['efficiency_in_layer_fwd']:.3f} or more (shared\nquestion; "
          f"{reps[0]['shared_question']['efficiency_in_layer_fwd']:.3f} and "
          f"{reps[1]['shared_question']['efficiency_in_layer_fwd']:.3f} in two more processes)")
    _says(f"the backward {low_b['efficiency_in_layer_bwd']:.3f} or more (causal\nblockwise; "
          f"{reps[0]['causal_blockwise']['efficiency_in_layer_bwd']:.3f} and "
          f"{reps[1]['causal_blockwise']['efficiency_in_layer_bwd']:.3f} in two more)")
    new = {r["family"]: r for r in _load(
        "h200x2_issue42_in_layer_new_packs/np/in_layer_new_packs.json")["rows"]}
    assert all(x["in_layer"]["ahead_fwd"] == 15 for r in new.values() for x in r["burst_ranks"])
    five = [r["efficiency_in_layer_fwd"] for f, r in new.items() if f != "full_document"]
    _says(f"the forward reads {_span(five)} of one GPU in five\nof the six families with "
          f"documents (full documents {new['full_document']['efficiency_in_layer_fwd']:.2f}), "
          f"the backward {_span([r['efficiency_in_layer_bwd'] for r in new.values()])}")
    one = [{r["family"]: r["one_gpu_plan"]["in_layer"] for r in _load(
        f"h200_issue42_carved_cores/np/in_layer_new_packs_1gpu_grain_{g}.json")["rows"]}
        for g in (0, 1024)]
    gain = {p: [1 - one[1][f][f"{p}_ms"] / one[0][f][f"{p}_ms"] for f in one[0]]
            for p in ("fwd", "bwd")}
    _says(f"the plan's forward ran {_span(gain['fwd'], '{:.0%}')[:-1].replace('%', '')}% "
          f"faster and its backward {_span(gain['bwd'], '{:.0%}')[:-1].replace('%', '')}%")
    ring = [{r["family"]: r for r in _load(
        f"h200x2_issue42_carved_cores_ring_rejected/np/in_layer_new_packs_grain_{g}.json")[
        "rows"]} for g in (1024, 0)]
    slower = [_slow(ring[0][f], "fwd_ms") / _slow(ring[1][f], "fwd_ms") for f in ring[0]]
    _says(f"made every new pack's forward {_span(slower, '{:.0f}')}x slower")
    scan = _load("h200x2_issue42_deal_scan_in_layer/ds/deal_scan.json")["rows"]

    def ratio(family, deal):
        ranks = [r["summary"] for r in scan if r["family"] == family]
        return max(s[deal]["fwd"]["ms"] for s in ranks) / max(
            s["package"]["fwd"]["ms"] for s in ranks)

    _says(f"the span\nmodel's picks read {ratio('causal_document', '0,2,3,7'):.3f} and "
          f"{ratio('shared_question', '0,1,6,7'):.3f} of the package's forward")
    best = [min(ratio(f, d) for d in scan[0 if f == "causal_document" else 1]["deals"])
            for f in ("causal_document", "shared_question")]
    _says(f"the best deals {best[0]:.3f} and {best[1]:.3f}")


def test_the_ring_carving_with_batch_strides_is_the_run_on_file():
    """The ring's carved forward before and after cuDNN's batch stride, and block-causal
    documents timed after another family, carved and not, as the README says."""
    before = {r["family"]: r for r in _load(
        "h200x2_issue42_carved_cores_ring_rejected/np/in_layer_new_packs_grain_1024.json")[
        "rows"]}
    now = [{r["family"]: r for r in _load(
        f"h200x2_issue42_carved_cores_ring_strides/np/in_layer_new_packs_grain_{g}.json")[
        "rows"]} for g in (1024, 0)]
    _says(f"causal documents' carved forward went {_slow(before['causal_document'], 'fwd_ms'):.1f}"
          f" -> {_slow(now[0]['causal_document'], 'fwd_ms'):.1f} ms")
    bcd = [now[i]["block_causal_document"] for i in (0, 1)]
    _says(f"block-causal documents {_slow(bcd[0], 'fwd_ms'):.3f} / {_slow(bcd[0], 'bwd_ms'):.3f}"
          f" ms\n(forward / backward) against {_slow(bcd[1], 'fwd_ms'):.3f} / "
          f"{_slow(bcd[1], 'bwd_ms'):.3f}")


STEADY = "h200x2_issue42_carved_rings_steady"


def _varlen_areas(mask, world: int) -> float:
    """Visible pairs a shape-free plan's forward leaves to varlen calls, over the ranks."""
    from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key

    total = 0
    for rank in range(world):
        ring = RingKey(tuple(range(world)), rank, None) if world > 1 else None
        plan = build_plan(plan_key("area", world, (16384,), mask, 1, ring, "ring"))
        total += sum(b.area for s in plan.forward.steps for c in s.calls if c.varlen
                     for b in c.blocks)
    return total


def test_the_rings_carved_steady_state_is_the_run_on_file():
    """Rings carved against not at the same grain (40 warm-up packs), the six families with
    documents carved, the varlen area block-causal documents' ring plans hold: as the README,
    the summary and the folder say."""
    import sys

    from megatron_burst.kernels import thresholds

    assert thresholds.CARVE_RINGS and thresholds.SHAPE_FREE_GRAIN == 1024
    carved, flat = ({r["family"]: r for r in _load(f"{STEADY}/call2/np/in_layer_new_packs_{n}"
                                                     ".json")["rows"]}
                    for n in ("carved_rings", "rings_not_carved"))
    assert all(x["in_layer"][f"ahead_{p}"] == 15 for run in (carved, flat) for r in run.values()
               for x in r["burst_ranks"] for p in ("fwd", "bwd"))
    gain = {p: [1 - _slow(carved[f], f"{p}_ms") / _slow(flat[f], f"{p}_ms") for f in flat]
            for p in ("fwd", "bwd")}
    assert min(gain["bwd"]) > -0.01  # "the same": causal documents +0.3%
    _says(f"the ring carved ran its forward\n{_span(gain['fwd'], '{:.0%}').replace('%', '', 1)}"
          f" faster than the ring not carved")
    _says(f"its backward the same to {max(gain['bwd']):.0%} faster")
    _says(f"(causal documents {_slow(carved['causal_document'], 'fwd_ms'):.3f} against "
          f"{_slow(flat['causal_document'], 'fwd_ms'):.3f} ms)")
    five = [r for f, r in carved.items() if f != "block_causal_document"]
    assert len(five) == 5
    fwd, bwd = (_span([r[f"efficiency_in_layer_{p}"] for r in five]) for p in ("fwd", "bwd"))
    bcd = carved["block_causal_document"]
    low = f"{bcd['efficiency_in_layer_fwd']:.2f} / {bcd['efficiency_in_layer_bwd']:.2f}"
    _says(f"the forward reads {fwd} of one GPU in five of the six families with\ndocuments and "
          f"the backward {bwd}; block-causal documents stays below, {low}")
    sys.path.insert(0, str(RESULTS.parent))
    from slice_masks import new_packs

    with even_chunks():  # as the ring was planned then
        ratios = [_varlen_areas(m, 2) / _varlen_areas(m, 1)
                  for m in new_packs("block_causal_document", 16384, 1.0, 3)]
    _says(f"held {_span(ratios, '{:.1f}')}x one GPU's varlen area")


SNAPPED = "h200x2_issue42_snapped_cuts"


def test_the_cuts_between_slices_are_the_runs_on_file():
    """The prototype's A/B, the package's six families with a new pack every step, its
    exactness, the fixed masks it moved, the varlen area now, and the first family's cold
    graphs: as the README and its summary say."""
    import sys

    proto, even = ({r["family"]: r for r in _load(f"{SNAPPED}/call3_prototype/np/in_layer_{n}"
                                                    ".json")["rows"]} for n in ("snap", "plain"))

    def eff(row):
        return f"{row['efficiency_in_layer_fwd']:.2f} / {row['efficiency_in_layer_bwd']:.2f}"

    for family, name in (("block_causal_document", "block-causal documents"),
                         ("causal_document", "causal documents"),
                         ("shared_question", "shared question"),
                         ("full_document", "full documents")):
        of = " of one GPU" if family == "block_causal_document" else ""
        _says(f"{name} {eff(proto[family])}{of} against {eff(even[family])}")
    rows = _load(f"{SNAPPED}/call4_package/np/in_layer_new_packs_snapped.json")["rows"]
    assert len(rows) == 6 and all(x["in_layer"][f"ahead_{p}"] == 15 for r in rows
                                  for x in r["burst_ranks"] for p in ("fwd", "bwd"))
    fwd, bwd = (_span([r[f"efficiency_in_layer_{p}"] for r in rows]) for p in ("fwd", "bwd"))
    assert min(r[f"efficiency_in_layer_{p}"] for r in rows for p in ("fwd", "bwd")) >= 0.75
    (bcd,) = [eff(r) for r in rows if r["family"] == "block_causal_document"]
    _says(f"forward at {fwd} and the backward at {bwd} in all six families with documents,\n"
          f"block-causal documents {bcd}")
    _says(f"the\n  forward at {fwd} and the backward at {bwd} in all six families with "
          f"documents\n  (block-causal documents {bcd}; it was")
    check = (RESULTS / SNAPPED / "call4_package/check_log.txt").read_text()
    worst = float(re.search(r"WORST (\S+) PASS", check).group(1))
    _says(f"four new packs each, worst {worst:.1e} (bf16)")
    fixed = _load(f"{SNAPPED}/call5_fixed_masks/il/in_layer.json")["rows"]
    table = _load(f"{SNAPPED}/call5_fixed_masks/table/sm.json")["rows"]
    assert len(fixed) == 6
    _says(f"the\nforward {_span([r['efficiency_in_layer_fwd'] for r in fixed])} and the "
          f"backward {_span([r['efficiency_in_layer_bwd'] for r in fixed])}")
    sys.path.insert(0, str(RESULTS.parent))
    from slice_masks import new_packs

    ratios = [_varlen_areas(m, 2) / _varlen_areas(m, 1)
              for m in new_packs("block_causal_document", 16384, 1.0, 3)]
    _says(f"now\nhold {_span(ratios, '{:.1f}')}x one GPU's varlen area")
    first = {n: {r["family"]: r for r in _load(f"{SNAPPED}/call2_bcd_first/np/in_layer_{n}"
                                                  ".json")["rows"]} for n in ("plain", "snap")}
    _says(f"(block-causal documents {eff(first['plain']['block_causal_document'])}, even "
          f"chunks, and {eff(first['snap']['block_causal_document'])} with the cuts moved)")
    _says(f"the table, captured, the forward "
          f"{_span([r['efficiency_graph_fwd'] for r in table])}\nand the backward "
          f"{_span([r['efficiency_graph_bwd'] for r in table])}")
    _says(f"each call synchronised, the forward {_span([r['efficiency_fwd'] for r in table])} "
          f"and the backward\n{_span([r['efficiency_bwd'] for r in table])}")
    (chained,) = [r["efficiency_chained_fwd"] for r in table
                  if r["family"] == "block_causal_document"]
    _says(f"stays host-bound\n({chained:.2f})")
    deal = _load("cpu_issue42_deal_cost/deal_cost.json")["rows"]
    spans = {(w, way): _span([r[way]["ms"] for r in deal if r["world"] == w])
             for w in (2, 8) for way in ("between_slices", "even_chunks")}
    _says(f"{spans[2, 'between_slices']} ms a new mask on 2 ranks against "
          f"{spans[2, 'even_chunks']} with even chunks, {spans[8, 'between_slices']} ms on 8\n"
          f"against {spans[8, 'even_chunks']}")


def test_the_kernel_kinds_and_the_mask_builders_are_the_runs_on_file():
    """Block-causal documents' flash time on the ring against one GPU's (the profile of
    call 4), and the two builders' CP=2 losses against CP=1's: as the README says."""
    rows = _load(f"{STEADY}/call4/kernel_kinds.json")["rows"]
    bcd = [r["ms_by_kind"] for r in rows if r["family"] == "block_causal_document"]
    ring = [r["ms_by_kind"] for r in rows
            if r["family"] == "block_causal_document" and r["where"].startswith("ring")]
    one = next(r["ms_by_kind"] for r in rows
               if r["family"] == "block_causal_document" and r["where"] == "one GPU")
    assert len(bcd) == 3 and len(ring) == 2
    assert sum(r["cudnn"] for r in ring) < one["cudnn"]
    _says(f"its two ranks' flash (varlen) kernels took\n"
          f"{sum(r['flash'] for r in ring) / one['flash']:.2f}x one GPU's time")
    run = _load("h200x2_issue42_mask_builders/mask_builders.json")
    gap = {r["builder"]: r for r in run["rows"]}
    assert all(r["ok"] and r["iterations"] == 8 for r in gap.values())
    assert [r["rc"] for r in run["runs"]] == [0, 0, 0, 0]
    _says(f"within {gap['prefix_lm']['gap']:.2e} (prefix-LM) and\n  "
          f"{gap['shared_question']['gap']:.2e} (shared question) over 8 iterations")


def test_the_prefix_lm_builder_both_ways_in_is_the_run_on_file():
    """Upstream pretrain_gpt.py with the patch against the entry point, CP=2, rings carving,
    and each against the entry point's CP=1: as the README and the folder say."""
    runs = _load("h200x2_issue42_mask_builders/upstream/upstream_prefix_lm.json")["runs"]
    up, own = (r["losses"] for r in runs)
    assert [r["rc"] for r in runs] == [0, 0] and len(up) == len(own) == 8
    assert "upstream" in runs[0]["name"] and "megatron_burst" in runs[1]["name"]
    one = next(r["losses"] for r in _load("h200x2_issue42_mask_builders/mask_builders.json")[
        "runs"] if r["name"] == "prefix_lm CP=1")
    both = max(abs(a - b) for a, b in zip(up, own))
    _says(f"upstream `pretrain_gpt.py` with the patch gives the entry point's losses within "
          f"{both:.2e}")
    folder = _folder("h200x2_issue42_mask_builders")
    assert f"within {both:.2e} of each other" in folder
    worst = max(abs(a - b) for run in (up, own) for a, b in zip(run, one))
    assert f"within {worst:.2e} of the entry point's CP=1" in folder
