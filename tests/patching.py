"""Replacing a package name inside a rank's process, for tests that change one step of a
call. ``swap`` refuses a name the module does not have: assigning one creates it, the code
never reads it, and the test passes having patched nothing (the GPU bf16-wire test compared
the bf16 wire with itself that way once the function it replaced had moved)."""
from __future__ import annotations

from types import ModuleType
from typing import Any


def swap(module: ModuleType, name: str, value: Any) -> Any:
    """Set ``module.name`` to ``value`` and return what it was; AttributeError if the module
    has no such name."""
    if not hasattr(module, name):
        raise AttributeError(f"{module.__name__} has no {name!r} to replace: the test would "
                             f"patch nothing")
    old = getattr(module, name)
    setattr(module, name, value)
    return old
