"""CI runs the fused Triton merge without a GPU: Triton's interpreter, in a process of its
own (``tests/merge_interpreted.py`` and ``tests/fused_ring_interpreted.py`` say what they
check). Skipped where Triton is absent."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .readme import REPO


def test_the_fused_merge_under_tritons_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.merge_interpreted"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["against_float64:", "ok", "half_home_rounds_once:", "ok",
                                   "unseen_rows_left:", "ok", "unaligned_rows:", "ok",
                                   "offsets_and_writes:", "ok"]


def test_the_rings_folds_through_the_fused_merge_under_tritons_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.fused_ring_interpreted"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["causal_blockwise/2/ring:", "ok",
                                   "global_sliding_window/2/burst:", "ok",
                                   "causal_blockwise/3/ring:", "ok"]
