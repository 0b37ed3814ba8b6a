"""`run CONFIG --dry-run` for a GPU config on a machine without its GPUs (a login node):
everything but the GPUs is checked, every problem named in one line (issue 43)."""
from __future__ import annotations

import sys
import types

import pytest

from megatron_burst.cli.parser import main
from megatron_burst.launch import login_checks
from megatron_burst.launch.config.schema import load_config
from megatron_burst.launch.config.megatron_options import pinned_table

from .conftest import REPO

CONFIG = REPO / "configs" / "llama3-8b-32k.yaml"


@pytest.fixture
def login_node(tmp_path, monkeypatch):
    """A login node where the job's data and tokenizer are reachable, and the modules the
    job imports are found (this test machine lacks megatron.training)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(login_checks, "missing_modules", lambda cfg: [])
    for name in ("a.bin", "a.idx", "b.bin", "b.idx"):
        (tmp_path / name).write_text("")
    (tmp_path / "tokenizer").mkdir()
    monkeypatch.setenv("DATA_PATH", f"0.5 {tmp_path / 'a'} 0.5 {tmp_path / 'b'}")
    monkeypatch.setenv("TOKENIZER_MODEL", str(tmp_path / "tokenizer"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_gpu_config_is_checked_on_a_machine_without_gpus(login_node, capsys):
    assert main(["run", str(CONFIG), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "checked: config and plan:" in out and "fits" in out
    assert "checked: data: 2 dataset(s), tokenizer" in out
    assert "checked: the sbatch script" in out and "reads as bash" in out
    assert "checked: flags" in out and "checked: modules found: megatron.core" in out
    assert "not checked: the GPUs (1 x 8 a100-80gb; 0 here)" in out
    assert not (login_node / "runs").exists()  # nothing written, nothing started


@pytest.mark.parametrize("env, named", [
    ({"DATA_PATH": None}, "${DATA_PATH}, which is not set"),
    ({"DATA_PATH": "/nowhere/corpus"}, "/nowhere/corpus.bin is not a file here"),
    ({"TOKENIZER_MODEL": "/nowhere/tok"}, "/nowhere/tok does not exist here"),
])
def test_every_problem_is_named_in_one_line(login_node, capsys, monkeypatch, env, named):
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(login_checks, "missing_modules",
                        lambda cfg: ["einops does not import: install it"])
    assert main(["run", str(CONFIG), "--dry-run"]) == 2
    problems = capsys.readouterr().err.splitlines()
    assert len(problems) == 2 and all(p.startswith("problem: ") for p in problems)
    assert any(named in p for p in problems) and any("einops" in p for p in problems)


def test_modules_are_found_by_name_without_importing_them(tmp_path, monkeypatch):
    from megatron_burst.launch.run.runtime_deps import Need

    (tmp_path / "heavy_on_import.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    needs = [Need("heavy_on_import", "heavy", "train", "the run needs it"),
             Need("no_such_module_here", "nosuch", "train", "the run needs it too")]
    monkeypatch.setattr(login_checks, "run_needs", lambda cfg: needs)
    missing = login_checks.missing_modules(load_config(CONFIG))
    assert missing == [needs[1].missing()]
    assert "heavy_on_import" not in sys.modules


def test_megatron_parser_reads_the_whole_command_line(monkeypatch):
    """Where megatron.training imports, the run's flags go through its parser (here one built
    from the pinned table's options, as Megatron's would be), --burst-* included."""
    def add_megatron_arguments(parser):
        for option in pinned_table().dests:
            parser.add_argument(option, nargs="*")
        return parser

    fake = types.ModuleType("megatron.training.arguments")
    fake.add_megatron_arguments = add_megatron_arguments
    package = types.ModuleType("megatron.training")
    package.arguments = fake
    monkeypatch.setitem(sys.modules, "megatron.training", package)
    monkeypatch.setitem(sys.modules, "megatron.training.arguments", fake)
    env = {"DATA_PATH": "/d", "TOKENIZER_MODEL": "/t"}
    cfg = load_config(CONFIG)
    assert login_checks.parse_with_megatron(cfg, env) == ("flags parsed by the installed "
                                                          "Megatron's parser")
    import dataclasses

    newer = dataclasses.replace(cfg, megatron_args=["--flag-of-a-newer-megatron"])
    with pytest.raises(login_checks.LoginCheckError,
                       match="unrecognized arguments: --flag-of-a-newer-megatron"):
        login_checks.parse_with_megatron(newer, env)
