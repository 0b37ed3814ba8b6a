"""``benchmarks/slice_masks.py``'s back-to-back timing (``--chained``): the calls run back to
back and are synchronised once, the efficiency is against the one-GPU methods timed the same
way, and the table gains its column only where a run timed it (earlier tables print as
they did)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
slice_masks = pytest.importorskip("slice_masks")


def test_chained_timing_runs_every_call_back_to_back(monkeypatch):
    calls, syncs = [], []
    monkeypatch.setattr(slice_masks, "sync", lambda dev: syncs.append(len(calls)))
    ms = slice_masks.timed(lambda: calls.append(1), torch.device("cpu"), warmup=2, iters=5,
                           align=False, chained=True)
    assert len(calls) == 7 and syncs == [2, 7] and ms >= 0
    calls.clear(), syncs.clear()
    slice_masks.timed(lambda: calls.append(1), torch.device("cpu"), warmup=2, iters=5,
                      align=False)
    assert len(calls) == 7 and len(syncs) == 14  # each call synchronised before and after


def _speed(fwd, bwd):
    return dict(fwd_tflops=fwd, bwd_tflops=bwd, fwd_bwd_tflops=(fwd + bwd) / 2)


def _row(chained: bool) -> dict:
    row = dict(family="causal", slices=1, balance_area=1.0, balance_zigzag=1.0,
               burst=dict(_speed(50, 40), fwd_ms=1.0, fwd_bwd_ms=3.0),
               sent_mb=dict(forward=1.0, backward=2.0), rel_err_vs_one_gpu=1e-3,
               one_gpu_plan=_speed(100, 100), one_gpu_flex=_speed(80, 50))
    if chained:
        row.update(burst_chained=_speed(90, 45), one_gpu_plan_chained=_speed(120, 90),
                   one_gpu_flex_chained=_speed(60, 100))
    slice_masks._efficiency(row)
    return row


def test_back_to_back_efficiency_is_against_the_one_gpu_methods_back_to_back():
    row = _row(chained=True)
    assert row["efficiency_fwd"] == pytest.approx(0.5)
    assert row["efficiency_chained_fwd"] == pytest.approx(90 / 120)
    assert row["efficiency_chained_bwd"] == pytest.approx(45 / 100)  # the faster: Flex's
    assert "efficiency_chained_fwd" not in _row(chained=False)


def test_the_table_gains_the_column_only_where_it_was_timed():
    meta = dict(device="cpu", world=2, torch="x", date="d", tokens_per_gpu=8, heads="4:2",
                head_dim=16, dtype="float32", command="c")
    for chained, columns in ((False, 13), (True, 14)):
        lines = slice_masks.table(meta, [_row(chained)]).splitlines()
        header, rule, row = lines[3:6]
        assert header.count("|") == rule.count("|") == row.count("|") == columns + 1
        assert ("back-to-back efficiency" in header) is chained
    assert "| 0.75 / 0.45 |" in row


def test_gpu_health_reads_nvidia_smi_and_is_none_without_it(tmp_path, monkeypatch):
    """The result files' record of each GPU's temperature, clock and clock-event reasons
    (a throttled machine timed the backward 3-4x slow): read from nvidia-smi; None where
    there is none."""
    ranks = pytest.importorskip("ranks")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ranks.gpu_health() is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 36, 1980, 0x0000000000000000'\n"
                    "echo '1, 70, 1410, 0x0000000000000060'\n")
    fake.chmod(0o755)
    assert ranks.gpu_health() == [
        dict(index=0, temperature_c=36.0, sm_mhz=1980.0, clock_events="0x0000000000000000"),
        dict(index=1, temperature_c=70.0, sm_mhz=1410.0, clock_events="0x0000000000000060")]


def test_kernel_forces_burst_attn_s_kernel_on_every_rank(tmp_path):
    """``--kernel`` reaches burst_attn: a kernel that cannot run on the CPU ranks is refused
    there, naming it, on every rank (and nothing is written)."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "slice_masks.py"
    done = subprocess.run([sys.executable, str(script), "--cpu-smoke", "--families", "causal",
                           "--kernel", "cudnn", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert done.stderr.count("ValueError: kernel='cudnn' runs on ['cuda']") >= 2  # each rank
    assert not (tmp_path / "run.json").exists()
