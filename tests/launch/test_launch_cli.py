"""The `megatron-burst` command: exit codes, one-line messages naming the key, and the CPU run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megatron_burst.megatron import environment
from megatron_burst.cli.parser import BROKEN_PIPE_STATUS, main
from megatron_burst.launch.config.schema import ConfigError, load_config
from megatron_burst.launch.run.flags import format_flags, megatron_flags
from megatron_burst.tools.cpu_run import (RankFailure, _raise_rank_failure, compare_losses,
                                          lr_at, predicted_ring_bytes, run_cpu,
                                          with_train_iters)

from .conftest import REPO, TINY

GPU_4 = REPO / "configs" / "llama3.2-1b-128k-4gpu.yaml"


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the command, expect exit 2 and one line on stderr (no traceback); return it."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_plan_prints_the_report(capsys):
    assert main(["plan", str(REPO / "configs" / "llama2-70b-128k.yaml")]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU" in out and "optimizer" in out and "burst attention" in out


@pytest.mark.parametrize("mutate, key", [
    (lambda r: r["training"].__setitem__("micro_batch", 1), "training.micro_batch"),
    (lambda r: r["model"].__setitem__("seq_length", 250), "model.seq_length"),
    (lambda r: r["model"].__setitem__("sliding_window", 64), "model.sliding_window"),
    (lambda r: r["model"].__setitem__("num_layers", -2), "model.num_layers"),
    (lambda r: r["model"].__setitem__("hidden_size", 0), "model.hidden_size"),
    (lambda r: r["training"].__setitem__("lr", -1), "training.lr"),
    (lambda r: r["training"].__setitem__("min_lr", 1.0), "training.min_lr"),
    (lambda r: r["training"].__setitem__("lr_warmup_iters", 40), "training.lr_warmup_iters"),
])
def test_bad_config_exits_2_naming_the_key(tiny_raw, write_config, capsys, mutate, key):
    mutate(tiny_raw)
    path = write_config(tiny_raw)
    for command in ("plan", "flags", "run"):
        assert f"'{key}'" in one_line_error(capsys, [command, str(path)])


@pytest.mark.parametrize("argv, named", [
    (["run", str(TINY), "--iters", "0"], "argument --iters: must be at least 1, got 0"),
    (["run", str(TINY), "--iters", "-5"], "argument --iters: must be at least 1, got -5"),
    (["run", str(TINY), "--iters", "ten"], "argument --iters: expected a whole number"),
    (["run", str(TINY), "--iters", "3"], "--iters 3 must be more than training.lr_warmup_iters"),
    (["plan", str(REPO / "configs")], "configs: is a directory; give one YAML config file"),
    (["plan", "no-such.yaml"], "no-such.yaml: no such config file"),
    (["flags", str(TINY), "--nodes", "0"], "argument --nodes: must be at least 1"),
    (["run"], "the following arguments are required: config"),
    (["launch", str(TINY)], "argument COMMAND: invalid choice: 'launch'"),
])
def test_bad_arguments_exit_2_in_one_line(capsys, argv, named):
    assert named in one_line_error(capsys, argv)


def test_plan_of_an_empty_or_broken_file_is_one_line(tmp_path, capsys):
    (tmp_path / "broken.yaml").write_text("model: [1, 2\nparallel: {}\n")
    assert "not valid YAML at line" in one_line_error(capsys, ["plan",
                                                              str(tmp_path / "broken.yaml")])


def test_flags_keep_vars_prints_what_a_shell_expands(capsys):
    assert main(["flags", str(REPO / "configs" / "llama3-8b-32k.yaml"), "--keep-vars"]) == 0
    out = capsys.readouterr().out
    assert "--data-path ${DATA_PATH:?" in out and '--tokenizer-model "${TOKENIZER_MODEL}"' in out

    def pasted(data_path: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"printf '%s\\n' {out}"], capture_output=True,
                              text=True, env={**os.environ, "DATA_PATH": data_path,
                                              "TOKENIZER_MODEL": "/t m"})

    # Pasted into a shell where the variables are set, the command carries their values: a
    # blend as its words, the tokenizer folder as one.
    words = pasted("0.7 /data/a 0.3 /data/b").stdout.splitlines()
    at = words.index("--data-path") + 1
    assert words[at:words.index("--split")] == ["0.7", "/data/a", "0.3", "/data/b"]
    assert words[words.index("--tokenizer-model") + 1] == "/t m"
    # An empty one stops the pasted command, naming it, instead of a bare --data-path.
    empty = pasted("")
    assert empty.returncode != 0 and "DATA_PATH" in empty.stderr and empty.stdout == ""


@pytest.mark.parametrize("data_path, named", [("", "is empty"), ("   ", "is empty"),
                                              ("0.7 /a 0.3", "got 3 words"),
                                              ("a 0.5 b 0.5", "weight-prefix pairs")])
def test_flags_refuse_a_data_path_megatron_would(capsys, monkeypatch, data_path, named):
    monkeypatch.setenv("DATA_PATH", data_path)
    monkeypatch.setenv("TOKENIZER_MODEL", "/t")
    err = one_line_error(capsys, ["flags", str(REPO / "configs" / "llama3-8b-32k.yaml")])
    assert "'data.data_path'" in err and named in err


def test_expanded_flags_keep_odd_characters_literal():
    cfg = load_config(REPO / "configs" / "llama3-8b-32k.yaml")
    text = format_flags(megatron_flags(cfg, env={"DATA_PATH": "/d/$x", "TOKENIZER_MODEL": "/t"}))
    assert "--data-path '/d/$x'" in text  # a value with '$' is not expanded again when pasted


def test_flags_piped_into_a_closed_reader_is_quiet():
    """`megatron-burst flags ... | head` must not end in a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "megatron_burst.cli", "flags", str(TINY)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == BROKEN_PIPE_STATUS and err == ""


def test_run_refuses_a_gpu_config_on_cpu(capsys):
    assert "'cluster.gpu'" in one_line_error(
        capsys, ["run", "--cpu", str(REPO / "configs" / "llama2-7b-32k.yaml")])


def test_dry_run_makes_the_checks_of_the_run(capsys):
    # On this CPU-only host the real run refuses a GPU config; --dry-run checks it all but
    # the GPUs, and says so (tests/launch/test_launch_login_checks.py: the checks).
    assert "'cluster.gpu'" in one_line_error(capsys, ["run", str(GPU_4)])
    main(["run", str(GPU_4), "--dry-run"])
    assert "not checked: the GPUs (1 x 4 h200-141gb; 0 here)" in capsys.readouterr().out
    assert main(["run", str(TINY), "--dry-run", "--iters", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would run: tiny-llama, 4 gloo ranks") and "5 iterations" in out


@pytest.fixture
def gpu_host(monkeypatch):
    """Pretend this host has 4 GPUs (nothing starts: these tests use --dry-run)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_gpu_run_without_megatron_training_says_what_it_needs(gpu_host, monkeypatch, capsys):
    # This host's megatron-core (0.16.1 on Python 3.11) has no megatron.training.
    pytest.importorskip("megatron.core")
    if environment.training_entry_point_problem() is None:
        pytest.skip("megatron.training imports here")
    err = one_line_error(capsys, ["run", str(GPU_4), "--dry-run"])
    assert "needs megatron.training" in err and "megatron-core >= 0.17" in err
    assert "Python >= 3.12" in err and "this environment has megatron-core" in err


def test_gpu_dry_run_prints_torchrun(gpu_host, monkeypatch, capsys):
    from megatron_burst.cli import run_command

    monkeypatch.setattr(run_command, "import_problem", lambda needs: None)
    assert main(["run", str(GPU_4), "--dry-run", "--iters", "5"]) == 0
    out = capsys.readouterr().out
    assert "torch.distributed.run" in out and "megatron_burst.megatron.pretrain_gpt" in out
    assert out.rstrip().endswith("--train-iters 5")
    eight = REPO / "configs" / "llama3.2-1b-256k-8gpu.yaml"
    assert "'cluster.gpus_per_node' is 8" in one_line_error(capsys, ["run", str(eight)])
    # A dry run where the GPUs are too few checks the rest, and says what it did not.
    from megatron_burst.launch import login_checks

    monkeypatch.setattr(login_checks, "missing_modules", lambda cfg: [])
    assert main(["run", str(eight), "--dry-run"]) == 0
    assert "not checked: the GPUs (1 x 8 h200-141gb; 4 here)" in capsys.readouterr().out


def test_entry_point_message_names_versions():
    message = environment.missing_training_message(ImportError("No module named x"))
    assert "megatron-core >= 0.17" in message and "Python >= 3.12" in message
    assert "Megatron-LM" in message and "\n" not in message


def test_learning_rate_never_rises_after_the_schedule():
    """`--iters` above train_iters stretches the decay (as Megatron's --train-iters does);
    past train_iters the rate stays at min_lr."""
    cfg = load_config(TINY)
    tr = cfg.training
    stretched = with_train_iters(cfg, 3 * tr.train_iters)
    rates = [lr_at(stretched, it) for it in range(3 * tr.train_iters)]
    after_warmup = rates[tr.lr_warmup_iters - 1:]
    assert all(a >= b for a, b in zip(after_warmup, after_warmup[1:]))
    assert rates[-1] == pytest.approx(tr.min_lr, rel=0.01)
    assert lr_at(cfg, tr.train_iters + 10) == pytest.approx(tr.min_lr)


def test_a_rank_config_error_surfaces_as_one():
    class Queue:
        items = [RankFailure(1, "'data.data_path': too short")]

        def empty(self):
            return not self.items

        def get(self):
            return self.items.pop()

    with pytest.raises(ConfigError, match="too short"):
        _raise_rank_failure(Queue(), 1, 3)


def test_loss_comparison_reports_early_and_whole_run():
    line = compare_losses([5.0] * 10 + [4.0, 3.0], [5.0] * 10 + [4.0, 3.5])
    assert line.startswith("loss vs CP=1: max |difference| 0.00e+00 over the first 10")
    assert "5.00e-01 over all 12 (at iteration 12)" in line
    assert "over all" not in compare_losses([1.0, 0.5], [1.0, 0.5])


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
    # Start-up is reported apart from training, for the reference run too.
    assert any(line.startswith("done: start-up") for line in lines)
    assert any(line.startswith("reference done: start-up") for line in lines)
    assert main_run.startup_seconds > 0 and ref.startup_seconds > 0


def test_entry_point_without_megatron_training_exits_in_one_line():
    """`python -m megatron_burst.megatron.pretrain_gpt` where megatron-core < 0.17."""
    import importlib.util

    pytest.importorskip("megatron.core")
    if importlib.util.find_spec("megatron.training") is not None:
        pytest.skip("megatron.training is installed here: the entry point would start")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m",
                           "megatron_burst.megatron.pretrain_gpt", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: megatron_burst.megatron.pretrain_gpt needs megatron.training")
