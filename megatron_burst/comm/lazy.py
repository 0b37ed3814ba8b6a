"""Names a package exports on first use: the front door, ``comm`` and ``megatron`` use it.

Why: ``megatron-burst plan`` and ``flags`` read torch-free modules of these packages, and a
package's ``__init__`` runs before any of its modules; importing torch (seconds) or
megatron-core there would make every launch command pay for attention it never runs. This
module imports nothing beyond the standard library, and sits in the lowest layer so that
every package above can use it.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, where: dict[str, str]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``where`` maps each name to the module
    (relative to ``package``) that defines it; a name is imported when first read, then
    kept in the package's namespace."""
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where[name], package)
        value = getattr(module, name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(where))

    return __getattr__, __dir__
