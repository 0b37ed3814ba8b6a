"""Data flows one way: launch -> megatron -> the attention core, and no module imports itself
back through a circle (DESIGN.md's layers; issue 24's targets).

Every import in the package, at module level or inside a function, is read from the source
(``test_tools_layering._imports``) and mapped to the package module it names. Checked: no
circle among the modules; the core (the top level and ``comm``/``kernels``) imports nothing
from ``megatron``, ``launch`` or ``tools``; ``megatron`` imports neither ``launch``, ``tools``
nor the package's front door; and no module is longer than 350 lines. The emulator's switch
is the one exception to the first two (``SWITCH``).
"""
from __future__ import annotations

import pathlib

from .test_tools_layering import PACKAGE, _imports

NAME = PACKAGE.name


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _module_of(name: str) -> str | None:
    """The package module an imported name lives in (the longest module prefix)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


# The one edge from the core to a tool, made inside a function only when asked for: the
# emulator's switch (test_tools_layering checks it stays that way).
SWITCH = (f"{NAME}.link_emulation", f"{NAME}.tools.emulate")


def _edges() -> dict[str, set[str]]:
    edges = {}
    for module, path in MODULES.items():
        targets = {_module_of(name) for name, _ in _imports(path)}
        edges[module] = {t for t in targets if t and t != module and (module, t) != SWITCH}
    return edges


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("megatron", "launch", "tools") else "core"


def test_no_import_circle():
    edges = _edges()
    # A package's __init__ re-exporting its own modules is not a circle through them.
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}
    state, stack = {}, []

    def visit(m: str) -> None:
        state[m] = "open"
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == "open":
                raise AssertionError("import circle: " + " -> ".join(
                    stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_no_layer_imports_one_above_it():
    allowed = {"core": {"core"}, "megatron": {"core", "megatron"},
               "launch": {"core", "megatron", "launch", "tools"}, "tools": set()}
    offenders = []
    for module, targets in _edges().items():
        layer = _layer(module)
        if layer == "tools" or module == NAME:
            continue  # tools stand beside everything; the front door names the public API
        for t in targets:
            if _layer(t) not in allowed[layer] or (layer != "core" and t == NAME):
                offenders.append(f"{module} -> {t}")
    # launch may start tools only from the CLI's command modules (test_tools_layering).
    offenders = [o for o in offenders if not (o.startswith(f"{NAME}.launch.")
                                              and ".tools" in o.split(" -> ")[1])]
    assert offenders == [], offenders


def test_no_module_over_350_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > 350}
    assert long == {}
