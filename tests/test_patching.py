"""``tests.patching.swap``: a test that replaces a name the package does not have fails."""
from __future__ import annotations

import pytest

from megatron_burst.attention import ring_rounds

from .patching import swap


def test_swap_refuses_a_name_the_module_does_not_have():
    with pytest.raises(AttributeError, match="_one_partial"):
        swap(ring_rounds, "_one_partial", lambda *args: (False, False))
    assert not hasattr(ring_rounds, "_one_partial")
    real = ring_rounds.one_partial_wire
    assert swap(ring_rounds, "one_partial_wire", None) is real
    assert swap(ring_rounds, "one_partial_wire", real) is None and ring_rounds.one_partial_wire is real


def test_every_swap_in_the_tests_names_what_its_module_has():
    """Each ``swap`` of a module's name, as written in a test file (GPU tests included, which
    CI never runs) names an attribute its module has now: a name moved elsewhere is caught
    on the CPU, not at the next GPU run (the fp32-wire test patched ``call_plan`` for
    sessions after the function moved to ``ring_rounds``)."""
    import importlib
    import re
    from pathlib import Path

    found = 0
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        text = path.read_text()
        imported = {}  # a module's name in the file -> its dotted path
        for package, names in re.findall(r"from (megatron_burst[\w.]*) import ([\w, ]+)", text):
            for alias in (n.strip() for n in names.split(",")):
                imported[alias] = f"{package}.{alias}"
        for alias, name in re.findall(r"\bswap\((\w+), \"(\w+)\"", text):
            if path.name == "test_patching.py" and name == "_one_partial":
                continue  # the refusal tested above
            assert alias in imported, f"{path.name}: swap({alias}, ...) of a module not imported"
            module = importlib.import_module(imported[alias])
            assert hasattr(module, name), f"{path.name}: {imported[alias]} has no {name!r}"
            found += 1
    assert found >= 15  # (the tests' swaps: every one was read)
