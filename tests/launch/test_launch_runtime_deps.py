"""Every module a shipped config's run imports is in an install extra, `run --dry-run` imports
them, and the CPU job runs every topology kind the package ships (Ulysses, Ulysses x ring, the
double ring), as a fresh install with the README's extras has it."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import re

import pytest

from megatron_burst.megatron import environment
from megatron_burst.launch.run import runtime_deps
from megatron_burst.cli.parser import main
from megatron_burst.launch.config.schema import load_config
from megatron_burst.launch.config.burst import topology_of
from megatron_burst.tools.cpu_run import predicted_ring_bytes, run_cpu

from .conftest import CONFIGS, REPO, TINY


def _extras() -> dict[str, list[str]]:
    """setup.py's extras_require, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "setup")
    extras = next(k.value for k in call.keywords if k.arg == "extras_require")
    return ast.literal_eval(extras)


def _name(requirement: str) -> str:
    return re.split(r"[<>=;\[ ]", requirement, maxsplit=1)[0].lower()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_module_a_shipped_config_imports_is_in_its_extra(path):
    extras = _extras()
    for need in runtime_deps.run_needs(load_config(path)):
        names = [_name(r) for r in extras[need.extra]]
        assert _name(need.package) in names, (need, extras[need.extra])
        assert f".[{need.extra}]" in need.missing()


def test_hierarchical_topologies_need_einops_and_flat_rings_do_not():
    for path in CONFIGS:
        cfg = load_config(path)
        hierarchical = cfg.parallel.context > 1 and bool(topology_of(cfg).hierarchical_sizes)
        modules = [need.module for need in runtime_deps.run_needs(cfg)]
        assert ("einops" in modules) == hierarchical, path.name
    named = {p.stem for p in CONFIGS if "einops" in
             [n.module for n in runtime_deps.run_needs(load_config(p))]}
    assert named == {"llama2-7b-512k", "llama2-7b-1m", "llama2-13b-512k", "llama3-8b-512k",
                     "llama3-8b-1m"}


def _variant(tmp_path, name: str, **changes) -> str:
    """tiny-llama-cpu with another topology, written as a config file."""
    text = TINY.read_text()
    for key, value in changes.items():
        text = re.sub(rf"^(\s+{key}:)\s*\S+", rf"\1 {value}", text, count=1, flags=re.M)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


TOPOLOGIES = {  # the topology kinds the package ships, on the tiny model's 4 CPU ranks
    "ulysses": dict(ulysses_size=2),  # TP=2 x CP=2, all of CP in one all-to-all
    "ulysses-x-ring": dict(tensor=1, context=4, sequence_parallel="false", ulysses_size=2),
    "double-ring": dict(tensor=1, context=4, sequence_parallel="false", intra_node_size=2),
}


def test_dry_run_imports_what_the_topology_needs(tmp_path, monkeypatch, capsys):
    path = _variant(tmp_path, "double", **TOPOLOGIES["double-ring"])
    real = importlib.import_module

    def without_einops(name, package=None):
        if name == "einops":
            raise ModuleNotFoundError("No module named 'einops'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_einops)
    assert main(["run", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "einops does not import" in err
    assert "--hierarchical-context-parallel-sizes 2 2" in err and ".[megatron]" in err
    monkeypatch.setattr(importlib, "import_module", real)
    assert main(["run", path, "--dry-run"]) == 0


@pytest.mark.parametrize("kind", TOPOLOGIES)
def test_cpu_job_runs_every_topology_kind(tmp_path, kind, warm_cpu_ranks):
    """The job itself, as `megatron-burst run` starts it: losses equal the CP=1 run's."""
    cfg = load_config(_variant(tmp_path, kind, **TOPOLOGIES[kind]))
    assert runtime_deps.import_problem(runtime_deps.run_needs(cfg)) is None
    main_run, ref = run_cpu(cfg, iters=3, echo=lambda line: None)
    assert ref is not None and max(abs(a - b) for a, b in zip(main_run.losses, ref.losses)) < 1e-4
    assert (main_run.forward_bytes, main_run.backward_bytes) == predicted_ring_bytes(cfg, 3)


def test_training_message_names_the_megatron_that_imports(monkeypatch, tmp_path):
    """A Megatron-LM checkout on PYTHONPATH hides the installed wheel: name the checkout, and
    say a Python 3.12 one needs 3.12 when its import fails on typing.override."""
    core = tmp_path / "Megatron-LM" / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 19\nPATCH = 0\n")
    spec = importlib.machinery.ModuleSpec("megatron.core", None, origin=str(core / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setattr(environment, "_python", lambda: (3, 11))
    error = ImportError("cannot import name 'override' from 'typing'")
    message = environment.missing_training_message(error)
    assert f"Megatron-LM at {tmp_path / 'Megatron-LM'} (core 0.19.0)" in message
    assert "this Megatron needs Python >= 3.12" in message and "core_v0.17" in message
    assert "on Python 3.11" in message and "\n" not in message


def test_setup_declares_what_megatron_core_leaves_out():
    extras = _extras()
    assert {"einops", "triton", "megatron-core"} <= {_name(r) for r in extras["megatron"]}
    assert dataclasses.is_dataclass(runtime_deps.Need)
