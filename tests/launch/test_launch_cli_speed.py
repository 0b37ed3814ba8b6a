"""The CLI answers at once: --help, a bare call and config mistakes need no torch, and every
command and option says what it does."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from megatron_burst.cli.parser import build_parser, main

from .conftest import REPO, TINY

# Runs the CLI with the launch layer imported on its own: the parent package is a bare
# namespace, so what is measured is the launch layer's imports, whatever the attention core's
# package __init__ imports.
LAUNCH_ONLY = """
import json, sys, time, types
start = time.perf_counter()
package = types.ModuleType("megatron_burst")
package.__path__ = [sys.argv[1] + "/megatron_burst"]
sys.modules["megatron_burst"] = package
from megatron_burst.cli.parser import main
status = main(json.loads(sys.argv[2]))
print(json.dumps({"status": status, "seconds": time.perf_counter() - start,
                  "heavy": sorted(m for m in ("torch", "megatron", "numpy") if m in sys.modules)}),
      file=sys.stderr)
"""


def _launch_only(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", LAUNCH_ONLY, str(REPO), json.dumps(argv)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv, status", [
    (["--help"], 0),
    ([], 0),
    (["plan", "--help"], 0),
    (["slurm", "--help"], 0),
    (["plan", "no-such.yaml"], 2),
    (["flags", str(REPO / "configs")], 2),
    (["run", str(TINY), "--iters", "2"], 2),  # --iters within the warmup: refused first
    (["plan", str(TINY), "--nodes", "0"], 2),
    (["data", "corpus.jsonl"], 2),
])
def test_answers_without_torch_in_under_a_second(argv, status):
    result = _launch_only(argv)
    assert result["status"] == status
    assert result["heavy"] == [], f"{argv} imported {result['heavy']}"
    assert result["seconds"] < 1.0, result


def test_plan_and_flags_need_no_torch(tmp_path):
    for argv in (["plan", str(REPO / "configs" / "llama3-8b-128k.yaml")],
                 ["slurm", str(REPO / "configs" / "llama2-7b-32k.yaml"), "--nodes", "1",
                  "-o", str(tmp_path / "j.sbatch")],
                 ["flags", str(TINY)]):
        result = _launch_only(argv)
        assert (result["status"], result["heavy"]) == (0, []), (argv, result)


def test_console_script_imports_no_torch_for_help():
    """What `megatron-burst --help` imports, through the real package."""
    probe = ("import sys; from megatron_burst.cli.parser import main; main(['--help']); "
             "print('torch' in sys.modules, file=sys.stderr)")
    package_alone = subprocess.run([sys.executable, "-c", "import sys, megatron_burst; "
                                    "print('torch' in sys.modules)"], capture_output=True,
                                   text=True, cwd=REPO, timeout=120)
    assert package_alone.stdout.strip() == "False", "the package front door imports torch"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == "False"


def test_bare_call_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("plan", "flags", "run", "slurm", "data", "tune"):
        assert f"    {command} " in out, out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_and_option_has_help():
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) == {"plan", "flags", "run", "slurm", "data", "tune"}
    for name, command in commands.items():
        assert command.description, f"{name} has no description"
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
