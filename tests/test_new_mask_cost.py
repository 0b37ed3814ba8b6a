"""benchmarks/new_mask_cost.py's table: means over each family's masks, as the JSON holds them."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_table_gives_each_familys_means():
    sys.path.insert(0, str(BENCH))
    try:
        cost = importlib.import_module("new_mask_cost")
    finally:
        sys.path.remove(str(BENCH))
    rows = [dict(area=1, new=(6.0, 20.0), again=(4.0, 16.0), third=(4.0, 15.0),
                 tflops_new=100.0, tflops_kept=140.0),
            dict(area=1, new=(8.0, 22.0), again=(5.0, 18.0), third=(6.0, 17.0),
                 tflops_new=120.0, tflops_kept=160.0)]
    meta = dict(device="GPU", world=2, torch="x", date="d", command="c")
    text = cost.table(meta, {"causal_document": rows})
    assert "| causal_document | 2 | 110 / 150 | 21.00 / 16.00 | 7.00 / 5.00 |" in text
