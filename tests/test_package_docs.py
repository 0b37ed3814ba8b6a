"""The package's docstrings say what is there: the subpackages' module lists name their
modules, and every repository path a docstring or comment cites exists."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "megatron_burst"
# A path into the repository: one of its top-level folders, then at least one more part.
REPO_PATH = re.compile(r"\b((?:benchmarks|configs|docs|megatron_burst|patches|scripts|tests)"
                       r"/[\w./*-]*\w)")


@pytest.mark.parametrize("subpackage", ["launch", "megatron", "tools", "launch/config",
                                        "launch/planning",
                                        "launch/run", "launch/slurm", "launch/data"])
def test_a_subpackages_docstring_names_its_modules(subpackage):
    """And its own sub-packages: launch's docstring is the map of launch/."""
    folder = PACKAGE / subpackage
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    named = set(re.findall(r"`(\w+)`", doc))
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    modules |= {p.parent.name for p in folder.glob("*/__init__.py")}
    assert modules <= named, f"not in {subpackage}'s docstring: {sorted(modules - named)}"


def test_every_module_says_what_it_is_for():
    undocumented = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
                          if not ast.get_docstring(ast.parse(p.read_text())))
    assert undocumented == []


def _texts(path: pathlib.Path):
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc
    yield from (line[line.index("#"):] for line in source.splitlines() if "#" in line)


def test_cited_repository_paths_exist():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for text in _texts(path):
            for cited in REPO_PATH.findall(text):
                if "NAME" not in cited and not any(REPO.glob(cited)):  # NAME: a placeholder
                    missing.append(f"{path.relative_to(REPO)}: {cited}")
    assert not missing, missing
