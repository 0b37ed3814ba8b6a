"""``benchmarks/host_parts.py``: its clocks wrap every part the ring calls and leave the
package as it was, and its CPU smoke run (2 gloo ranks) times each part of a forward."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
host_parts = pytest.importorskip("host_parts")


def test_the_clocks_wrap_each_part_and_restore_it():
    from megatron_burst.comm import messages

    before = {(o, a): (o.__dict__[a] if isinstance(o, type) else getattr(o, a))
              for o, a, _ in host_parts.PARTS}
    with host_parts.timing_parts() as spent:
        assert isinstance(messages.Packed.__dict__["holding"], classmethod)
        assert all((o.__dict__[a] if isinstance(o, type) else getattr(o, a)) is not raw
                   for (o, a), raw in before.items())
        import torch
        messages.Packed.holding([torch.zeros(2, 3)])
    assert spent["pack K/V"] > 0 and set(spent) == {"pack K/V"}
    assert all((o.__dict__[a] if isinstance(o, type) else getattr(o, a)) is raw
               for (o, a), raw in before.items())


def test_cpu_smoke_times_the_parts_of_a_forward(tmp_path):
    out = tmp_path / "hp"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/host_parts.py"),
                           "--cpu-smoke", "--families", "causal_document", "--out", str(out)],
                          timeout=300, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]  # why it failed (once in CI, not since)
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["rank"] for r in rows] == [0, 1]  # every rank's row, family by family
    row = rows[0]
    for way in ("idle", "back_to_back"):
        parts = row[way]["parts_ms"]
        assert parts["kernel calls"] > 0 and parts["post a hop"] >= parts["NCCL calls"] > 0
        assert row[way]["host_ms"] > parts["kernel calls"]
    assert row["back_to_back"]["wall_ms"] >= row["back_to_back"]["host_ms"]
    assert "| causal_document | 1 | " in out.with_suffix(".md").read_text()
