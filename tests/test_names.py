"""Every name a file reads from its module is defined there, in every Python file of the repo.

Why: the GPU tests, GPU benchmarks and GPU-only branches never run in CI, so a name left
behind by a move is found only at the next device run, which costs device time (the
fp32-wire test read ``call_plan`` after its import was changed to ``ring_rounds``, and failed
on 2x H100). ``symtable`` gives each scope's free names without running the file.
"""
from __future__ import annotations

import builtins
import symtable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("megatron_burst", "tests", "benchmarks", "scripts", "configs")
MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__path__", "__loader__",
                "__package__", "__builtins__"}


def undefined_names(source: str, filename: str) -> list[tuple[str, int, str]]:
    """(scope, line, name) for each name a scope reads from module level that the module
    never binds (assignment, import, def, class) and that is not a builtin."""
    top = symtable.symtable(source, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    bound |= set(dir(builtins)) | MODULE_NAMES
    found = []

    def walk(table: symtable.SymbolTable) -> None:
        at_top = table.get_type() == "module"
        for sym in table.get_symbols():
            free = sym.is_referenced() and (at_top or sym.is_global())
            if free and sym.get_name() not in bound:
                found.append((table.get_name(), table.get_lineno(), sym.get_name()))
        for child in table.get_children():
            walk(child)

    walk(top)
    return found


def python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_the_check_finds_a_name_left_behind_by_an_import_change():
    source = ("from megatron_burst.attention import ring_rounds\n\n"
              "def worker():\n    return call_plan._PLANS, ring_rounds\n")
    assert undefined_names(source, "example.py") == [("worker", 3, "call_plan")]
    fixed = source.replace("import ring_rounds", "import call_plan, ring_rounds")
    assert undefined_names(fixed, "example.py") == []


def test_the_check_reads_module_level_code_and_nested_scopes():
    source = "x = missing_a\n\ndef f():\n    def g():\n        return missing_b\n    return g\n"
    assert [name for *_, name in undefined_names(source, "e.py")] == ["missing_a", "missing_b"]
    assert undefined_names("def f(a):\n    b = a\n    return [b for _ in range(2)]\n",
                           "e.py") == []


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_file_reads_is_defined(path: Path):
    assert undefined_names(path.read_text(), str(path)) == [], path
