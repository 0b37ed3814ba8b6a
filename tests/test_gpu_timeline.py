"""``benchmarks/gpu_timeline.py``'s reading of a trace, on a trace made by hand: span, busy
and idle time over all streams, launch-to-start delays, and GPU time by kind."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_timeline import kind, read_trace  # noqa: E402


def _kernel(name, ts, dur, corr):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _launch(ts, corr):
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 3,
            "args": {"correlation": corr}}


def test_a_trace_read_per_call():
    events = [_launch(0, 1), _kernel("void pytorch_flash::flash_fwd_kernel<...>", 10, 100, 1),
              _launch(5, 2), _kernel("ncclDevKernel_SendRecv", 50, 100, 2),  # overlaps
              _launch(6, 3), _kernel("_merge_kernel", 200, 20, 3),  # 50 us idle before
              {"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 220,
               "dur": 10, "args": {}},
              {"cat": "cpu_op", "name": "aten::copy_", "ts": 0, "dur": 500, "args": {}}]
    got = read_trace(events, calls=2)
    assert got["span_ms"] == pytest.approx(220 / 1e3 / 2)
    assert got["busy_ms"] == pytest.approx(170 / 1e3 / 2)  # 10..150, 200..230
    assert got["idle_ms"] == pytest.approx(50 / 1e3 / 2)
    assert got["delay_us"] == [10, 45, 45]  # sorted 10, 45, 194: p10, p50, p90 by index
    assert got["kernels"] == 2
    assert got["kinds_us"] == {"flash": 50, "nccl": 50, "merge": 10, "copy DtoD": 5}


def test_kinds_and_an_empty_trace():
    assert kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "cudnn"
    assert kind("Memcpy HtoD (Pinned -> Device)") == "copy HtoD"
    assert kind("something else") == "other"
    with pytest.raises(ValueError, match="gpu_timeline"):
        read_trace([_launch(0, 1)], calls=1)
