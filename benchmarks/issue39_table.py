"""Issue 39's table from one machine session's runs: before, after, replayed, target.

    python benchmarks/issue39_table.py benchmarks/results/h100x2_issue39_final

Reads what ``benchmarks/run_2gpu_issue39_final.sh`` wrote (its parts ``micro``, ``megatron``
and ``cp1``, each a subfolder) and prints the README's table, every figure from a JSON file:
"before" is the package of the commit the issue measured, "after" this tree with its
defaults, "replay" this tree with ``MEGATRON_BURST_REPLAY=auto``. The CPU proxy's row is
read from ``cpu_issue39_proxy/`` beside the folder (``benchmarks/python_calls.py``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HOST = "| {} | {} | {} | {} | {} |"
NEW, SAME, B2B = ("new pack each call", "same pack repeated",
                  "new packs back to back (no sync)")
EIGHT_K = ("causal MHA 32:32 d128, 8192/GPU", "causal GQA 32:8 d128, 8192/GPU",
           "causal GQA 16:4 d64, 8192/GPU")


class Runs:
    """The session's JSON files by side."""

    def __init__(self, folder: Path):
        self.folder = folder

    def rows(self, name: str) -> list[dict]:
        return json.loads((self.folder / name).read_text())["rows"]

    def host(self, side: str, case: str, mode: str = "eager") -> dict | None:
        found = [r for r in self.rows(f"micro/host_time_{side}.json")
                 if r["case"] == case and r["mode"] == mode]
        return found[0] if found and "host_ms" in found[0] else None

    def pack(self, side: str, part: str, per_gpu: int, mix: str, method: str) -> dict | None:
        found = [r for r in self.rows(part.format(side=side))
                 if r["per_gpu"] == per_gpu and r["mix"] == mix and r["method"] == method]
        return found[0] if found else None

    def megatron(self, name: str) -> dict:
        runs = json.loads((self.folder / name).read_text())["runs"]
        return {r["name"]: r["steady_ms"] for r in runs}


def _f(row: dict | None, key: str, fmt: str = "{:.2f}") -> str:
    return fmt.format(row[key]) if row is not None and row.get(key) is not None else "-"


def host_rows(runs: Runs) -> list[str]:
    ring, burst = "burst causal, ring bwd", "burst causal, burst bwd"
    new = "burst whole_docs, new pack each call (eager only)"
    sdpa = "1 GPU SDPA (cuDNN), the whole sequence"

    def pair(mode: str, side: str) -> str:
        return f"{_f(runs.host(side, ring, mode), 'host_ms')} / " \
               f"{_f(runs.host(side, burst, mode), 'host_ms')}"

    sides = ("before", "after", "replay")
    return [
        HOST.format("host ms of one CP=2 call, tiny tensors, eager (ring / burst backward)",
                    *(pair("eager", s) for s in sides), "<= 0.6"),
        HOST.format("the same, a new `whole_docs` pack every call",
                    *(_f(runs.host(s, new), "host_ms") for s in sides), "<= 1.0"),
        HOST.format("one GPU's SDPA on the whole sequence, the host's floor (eager / graph)",
                    *(f"{_f(runs.host(s, sdpa), 'host_ms')} / "
                      f"{_f(runs.host(s, sdpa, 'CUDA graph'), 'host_ms')}" for s in sides), "-"),
        HOST.format("CUDA-graph replay of a CP=2 call, host ms (ring / burst backward)",
                    pair("CUDA graph", "before"), pair("CUDA graph", "after"),
                    "refused (replay on)", "keep"),
    ]


def efficiency_rows(runs: Runs) -> list[str]:
    def three(side: str, mode: str, cases=EIGHT_K) -> str:
        return " / ".join(_f(runs.host(side, c, mode), "efficiency") for c in cases)

    big = tuple(c.replace("8192", "32768") for c in EIGHT_K)
    return [
        HOST.format("8K/GPU causal, no documents, eager (MHA 32:32 / GQA 32:8 / GQA 16:4 d64)",
                    three("before", "eager"), three("after", "eager"),
                    three("replay", "eager"), ">= 0.90 / 0.90 / 0.80"),
        HOST.format("the same, CUDA graph", three("before", "CUDA graph"),
                    three("after", "CUDA graph"), "-", ">= 0.92"),
        HOST.format("32K/GPU causal, eager (MHA 32:32 / GQA 32:8 / GQA 16:4 d64)",
                    three("before", "eager", big), three("after", "eager", big), "-",
                    "no lower"),
    ]


def document_rows(runs: Runs) -> list[str]:
    small = "micro/documents_8k16k_{side}.json"
    big = "megatron/documents_32k_{side}.json"

    def eff(side: str, part: str, n: int, mix: str, layout: str, how: str) -> str:
        return _f(runs.pack(side, part, n, mix, f"burst {layout}, {how}"), "efficiency_vs_1gpu")

    def cell(side: str, n: int, how: str) -> str:
        layouts = {"before": ("whole_docs",), "after": ("whole_docs", "pack_zigzag"),
                   "replay": ("whole_docs", "pack_zigzag")}[side]
        return " / ".join(eff(side, small, n, "uniform", lay, how) for lay in layouts)

    def graph(n: int, how: str) -> str:
        return eff("after", small, n, "uniform", "pack_zigzag+graph", how)

    out = []
    for n, label, target in ((8192, "8K/GPU", ">= 0.60 eager, >= 0.80 captured"),
                             (16384, "16K/GPU", ">= 0.70 eager, >= 0.85 captured")):
        for how in (NEW, B2B, SAME):
            out.append(HOST.format(
                f"{label}, 16:4 d64 uniform, {how} (eager: whole_docs / pack_zigzag; "
                f"captured: pack_zigzag+graph)",
                cell("before", n, how), f"{cell('after', n, how)}; captured {graph(n, how)}",
                cell("replay", n, how), target if how == NEW else "-"))
    for how in (NEW, B2B, SAME):
        two = lambda side: " / ".join(  # noqa: E731
            eff(side, big, 32768, mix, "whole_docs", how) for mix in ("uniform", "lognormal"))
        out.append(HOST.format(f"32K/GPU, 32:8 d128, {how} (uniform / lognormal)",
                               two("before"), two("after"), "-",
                               ">= 0.90" if how != SAME else "-"))
    return out


def megatron_rows(runs: Runs) -> list[str]:
    before = {**runs.megatron("megatron/megatron_small_before.json"),
              **runs.megatron("cp1/megatron_cp1_before.json")}
    after = {**runs.megatron("megatron/megatron_small_after.json"),
             **runs.megatron("cp1/megatron_cp1_after.json")}
    replay = runs.megatron("megatron/megatron_small_replay.json")
    cp2, cp1 = "small 16K CP=2, document masks", "small 16K CP=1, document masks"

    def speedup(cp2_ms: float, cp1_ms: float) -> str:
        return f"{cp2_ms:.0f} vs {cp1_ms:.0f} ms: {cp1_ms / cp2_ms:.2f}x"

    plain2, plain1 = "small 16K CP=2", "small 16K CP=1"
    return [
        HOST.format("Megatron, own entry point, 4 layers / 1024 / 16:4, 16K, document masks: "
                    "CP=2 step vs CP=1 (eager)", speedup(before[cp2], before[cp1]),
                    speedup(after[cp2], after[cp1]), speedup(replay[cp2], after[cp1]),
                    ">= 1.7x"),
        HOST.format("the same without masks", f"CP=2 {before[plain2]:.0f} ms",
                    speedup(after[plain2], after[plain1]), "-", "-"),
    ]


def proxy_row(folder: Path) -> list[str]:
    """The CPU proxy, both packages counted by one code (``benchmarks/python_calls.py``),
    in the folder beside the session's: rank 0's calls."""
    side = {s: json.loads((folder.parent / "cpu_issue39_proxy" / f"{s}.json").read_text())
            ["ranks"][0] for s in ("before", "after")}
    return [HOST.format("CPU proxy: Python calls per CP=2 fwd+bwd on gloo, rank 0 (plain ring "
                        "/ plain burst / new pack)",
                        *(" / ".join(f"{side[s][k]:,}" for k in ("plain ring", "plain burst",
                                                                  "new pack"))
                          for s in ("before", "after")), "-", "<= 400 / - / 600")]


def table(folder: Path) -> str:
    runs = Runs(folder)
    head = ["| case | before (7b3f129) | after | after, replay auto | target |",
            "|---|---|---|---|---|"]
    return "\n".join(head + host_rows(runs) + efficiency_rows(runs) + document_rows(runs)
                     + megatron_rows(runs) + proxy_row(folder)) + "\n"


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1
                     else "benchmarks/results/h100x2_issue39_final")), end="")
