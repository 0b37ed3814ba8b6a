"""``benchmarks/native_profile.py``'s reading of py-spy's raw stacks (the GPU run itself needs
py-spy and CUDA): a sample counts only under the profiled forward, goes to the first
category its stack matches (the specific before the general), and the summary's shares
are the samples'. It and ``launch_ab.py`` refuse a count below one before starting ranks."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
native_profile = pytest.importorskip("native_profile")

PKG = "/r/megatron_burst"
FWD = "eager_forward (/r/benchmarks/native_profile.py:60)"


def _line(frames: list[str], n: int) -> str:
    return ";".join(["0x7f (libc.so.6)", "<module> (/r/benchmarks/native_profile.py:1)", FWD]
                    + frames) + f" {n}"


LINES = [
    _line([f"first_call_home ({PKG}/attention/home_output.py:9)",
           f"CudnnAttention.forward ({PKG}/kernels/cuda.py:61)", "cudnnExecute (libcudnn.so)"],
          5),
    _line([f"fold_rows ({PKG}/kernels/merge.py:3)", f"_launch ({PKG}/kernels/merge.py:9)",
           f"DirectLaunches.launch ({PKG}/kernels/triton_direct.py:4)"], 3),
    _line([f"fold_rows ({PKG}/kernels/merge.py:3)", f"_fusable ({PKG}/kernels/merge.py:5)"], 2),
    _line([f"PayloadRing.post ({PKG}/comm/rings.py:90)",
           f"post_ops ({PKG}/comm/messages.py:266)", "ncclSend (libnccl.so)"], 4),
    _line(["synchronize (/t/torch/cuda/__init__.py:3)"], 1),
    # outside the forward (the timing loop's synchronise) and a line py-spy could not write
    "<module> (/r/x.py:1);synchronize (/t/torch/cuda/__init__.py:3) 9",
    "garbage",
]


def test_samples_go_to_the_first_category_their_stack_matches():
    total, counts = native_profile.categorise(LINES)
    assert total == 15
    assert counts == {"cudnn": 5, "merge launch": 3, "merge": 2, "send": 4, "other": 1}


def test_fold_rows_is_not_a_view_and_the_marker_is_a_frame_of_its_own():
    """'_rows (' must start the function's name: ``fold_rows`` is a merge, not a view; and a
    function whose name ends in the marker's (``ms_a_forward``) is not the forward."""
    line = _line([f"fold_rows ({PKG}/kernels/merge.py:3)"], 1)
    assert native_profile.categorise([line])[1] == {"merge": 1}
    timing = "ms_a_forward (/r/benchmarks/native_profile.py:2);x (/r/y.py:1) 4"
    assert native_profile.categorise([timing], marker="forward (")[0] == 0


def test_the_summary_is_the_samples_shares(tmp_path):
    (tmp_path / "causal_r0.txt").write_text("\n".join(LINES) + "\n")
    (tmp_path / "causal_r0.json").write_text(json.dumps(dict(ms=1.5, cpu_ms=12.0)))
    text = native_profile.summarize(str(tmp_path))
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert [r["profile"] for r in rows] == ["causal_r0"] and rows[0]["samples"] == 15
    assert rows[0]["share"]["cudnn"] == pytest.approx(5 / 15)
    assert sum(rows[0]["share"].values()) == pytest.approx(1.0)
    assert "| causal_r0 | 15 | 1.500 | 33 | 0 |" in text
    assert (tmp_path / "summary.md").read_text().strip() == text


@pytest.mark.parametrize("script,option", [("native_profile.py", "--seconds"),
                                           ("launch_ab.py", "--calls")])
def test_a_count_below_one_is_refused_before_any_rank_starts(script, option):
    import subprocess

    path = Path(__file__).resolve().parents[1] / "benchmarks" / script
    done = subprocess.run([sys.executable, str(path), "--out", "/tmp/never", option, "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{option} must be at least 1, got 0" in done.stderr
