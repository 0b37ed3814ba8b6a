"""The `megatron-burst` command: exit codes, messages naming the key, and the CPU run."""
from __future__ import annotations

import pytest

from megatron_burst.launch.cli import main
from megatron_burst.launch.config import load_config
from megatron_burst.launch.cpu_run import predicted_ring_bytes, run_cpu

from .conftest import REPO, TINY


def test_plan_prints_the_report(capsys):
    assert main(["plan", str(REPO / "configs" / "llama2-70b-128k.yaml")]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU" in out and "optimizer" in out and "burst attention" in out


@pytest.mark.parametrize("mutate, key", [
    (lambda r: r["training"].__setitem__("micro_batch", 1), "training.micro_batch"),
    (lambda r: r["model"].__setitem__("seq_length", 250), "model.seq_length"),
    (lambda r: r["model"].__setitem__("sliding_window", 64), "model.sliding_window"),
])
def test_bad_config_exits_2_naming_the_key(tiny_raw, write_config, capsys, mutate, key):
    mutate(tiny_raw)
    path = write_config(tiny_raw)
    for command in ("plan", "flags", "run"):
        assert main([command, str(path)]) == 2
        assert f"'{key}'" in capsys.readouterr().err


def test_flags_keep_vars(capsys):
    assert main(["flags", str(REPO / "configs" / "llama3-8b-32k.yaml"), "--keep-vars"]) == 0
    out = capsys.readouterr().out
    assert "--data-path '${DATA_PATH}'" in out and "--cp-comm-type burst" in out


def test_run_refuses_a_gpu_config_on_cpu(capsys):
    assert main(["run", "--cpu", str(REPO / "configs" / "llama2-7b-32k.yaml")]) == 2
    assert "'cluster.gpu'" in capsys.readouterr().err


def test_cpu_run_matches_cp1_and_counts_ring_bytes():
    """The tiny config for a few iterations: loss falls, equals the CP=1 run, bytes add up."""
    cfg = load_config(TINY)
    lines: list[str] = []
    main_run, ref = run_cpu(cfg, iters=4, echo=lines.append)
    assert len(main_run.losses) == 4 and main_run.losses[-1] < main_run.losses[0]
    assert ref is not None
    assert max(abs(a - b) for a, b in zip(main_run.losses, ref.losses)) < 1e-4
    assert (main_run.forward_bytes, main_run.backward_bytes) == predicted_ring_bytes(cfg, 4)
    assert any("loss vs CP=1" in line for line in lines)
