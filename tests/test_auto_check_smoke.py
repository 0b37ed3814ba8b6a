"""``benchmarks/auto_check.py --smoke`` on two CPU ranks: the benchmark runs end to end and
its JSON says what it timed. Every method of a cell runs the same packs, each a new pack
(the same lengths in a new order), and every forced topology computes what auto's does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_auto_check_smoke_times_every_method_on_new_packs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEGATRON_BURST_EMULATE": ""}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          str(REPO / "benchmarks" / "auto_check.py"), "--smoke", "--trace",
                          "256", "--out", str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((tmp_path / "auto_check.json").read_text())
    cells: dict = {}
    for r in out["rows"]:
        cells.setdefault((r["per_gpu"], r["heads"], r["mask"]), []).append(r)
    assert len(cells) == 8
    for (per_gpu, heads, mask), rows in cells.items():
        auto, *forced = rows
        assert auto["method"] == "auto" and "topology" in auto and len(forced) >= 3
        assert all(r["ms"] > 0 and r["predicted_ms"] > 0 for r in rows)
        # smoke: 2 timed rounds asked, rounded up to a whole turn of the methods, so each
        # method starts a round once; the host's part of a call is within its wall time
        turn = len(rows)
        assert all(len(r["rounds_ms"]) == turn and 0 < r["host_ms"] <= r["ms"] for r in rows)
        assert all(r["rel_err_vs_auto"] < 1e-5 for r in forced), forced  # fp32, one pack
        if mask == "documents":
            # 1 warm-up and the rounds; the c-th call of every method the c-th order
            traced = turn if per_gpu == 256 else 0  # one more turn, under the profiler
            assert auto["packs"]["orders_run"] == 1 + turn + traced + 1  # and exactness's
            assert sorted(auto["packs"]["first"], reverse=True) == auto["packs"]["first"]
        # auto beside its own topology forced, per round (the same pack for both)
        assert auto["auto_over_same_paired"] > 0
    assert out["meta"]["worst_auto_over_same_paired"] > 0
    traces = sorted(p.name for p in (tmp_path / "trace").iterdir())
    assert traces == [f"256_{h}_documents_rank{r}.json" for h in ("4-2", "4-4") for r in (0, 1)]
    events = json.loads((tmp_path / "trace" / traces[0]).read_text())["traceEvents"]
    assert {"method:auto"} <= {e.get("name") for e in events}


def test_auto_check_times_a_models_layers_on_one_pack(tmp_path):
    """``--layers 3``: each timed round runs three attention calls on one pack (a model's
    layers share a micro-batch's pack), times per attention call, and every method still
    runs the same packs; a layer count below 1 is refused by name."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEGATRON_BURST_EMULATE": ""}
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            str(REPO / "benchmarks" / "auto_check.py"), "--smoke", "--masks", "documents",
            "--out", str(tmp_path)]
    run = subprocess.run(base + ["--layers", "3"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((tmp_path / "auto_check.json").read_text())
    cells: dict = {}
    for r in out["rows"]:
        cells.setdefault((r["per_gpu"], r["heads"]), []).append(r)
    assert len(cells) == 4
    for auto, *forced in cells.values():
        turn = 1 + len(forced)
        assert auto["packs"]["orders_run"] == 1 + turn + 1  # a pack a round, not a layer
        assert all(0 < r["host_ms"] <= r["ms"] for r in [auto, *forced])
        assert all(r["rel_err_vs_auto"] < 1e-5 for r in forced)
    bad = subprocess.run(base + ["--layers", "0"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "--layers must be at least 1" in bad.stderr
