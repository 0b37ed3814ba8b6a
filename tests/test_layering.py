"""The package's layers, read from its imports: data flows one way, and nothing circles back.

DESIGN.md's layers, bottom to top, each a folder of ``megatron_burst/``:

- ``comm``: a ring over a process group (and the link emulator that slows it on purpose);
- ``plan``: the plan data: layouts, a shard's segments, blocks, the ring schedule, packs;
- ``kernels``: local attention behind one protocol, the merge, varlen and pack kernel calls;
- ``decide``: the decision: bytes, seconds, the cluster view, the options and their resolver;
- ``attention``: the call path: ``burst_attn``, its preparation, agreement and the ring loops;
- ``megatron``: the Megatron-Core adapter and entry points;
- the front door (``megatron_burst/__init__.py``), which names the public API;
- ``launch``: configs, plans, flags, SLURM scripts, datasets, in sub-packages of their own
  (``LAUNCH_PARTS``, bottom to top, held to the same rule among themselves);
- ``tools``: the CPU run, tuning, the demo;
- ``cli``: the ``megatron-burst`` command, which starts launch steps and tools.

The core is the first five. A module may import its own layer and those below it, never one
above; there is no import circle among modules; no exceptions are listed. Every import is
read from the source, at module level or inside a function (a lazy import is still an edge).
"""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "megatron_burst"
NAME = PACKAGE.name
LAYERS = ["comm", "plan", "kernels", "decide", "attention", "megatron", "", "launch", "tools",
          "cli"]  # "" is the front door
CORE = LAYERS[:5]
# launch/'s sub-packages and the modules at its top, bottom to top: data writes datasets and
# needs none of the others; a config is read (config), planned (planning), started (run),
# scripted for SLURM (slurm), and checked from a login node (login_checks).
LAUNCH_PARTS = ["output_files", "data", "config", "planning", "run", "slurm", "login_checks"]
LAUNCH_TOP_MODULES = 4  # at most this many modules stay at the top of launch/


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: pathlib.Path) -> list[str]:
    """Absolute names of everything ``path`` imports: a module, or ``module.name`` for
    ``from module import name``, relative imports resolved as Python resolves them."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found += [f"{name}.{alias.name}" for alias in node.names]
    return found


def _module_of(name: str) -> str | None:
    """The package module an imported name lives in (the longest module prefix)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return None


def _edges() -> dict[str, set[str]]:
    return {m: {t for t in map(_module_of, imports_of(p)) if t and t != m}
            for m, p in MODULES.items()}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else ""


def test_every_module_is_in_a_layer():
    """Nothing lives loose at the top: a module outside the layers' folders has no place."""
    loose = sorted(m for m in MODULES if m != NAME and layer_of(m) == "")
    assert loose == []


def test_no_layer_imports_one_above_it():
    offenders = sorted(f"{m} -> {t}" for m, targets in _edges().items() for t in targets
                       if LAYERS.index(layer_of(t)) > LAYERS.index(layer_of(m)))
    assert offenders == []


def launch_part_of(module: str) -> str | None:
    """The part of launch/ a module belongs to (its sub-package, or itself at the top)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "launch" else None


def test_every_launch_module_is_in_a_part():
    """A new sub-package or top module of launch/ takes its place in LAUNCH_PARTS."""
    unplaced = sorted(m for m in MODULES if launch_part_of(m) not in (None, *LAUNCH_PARTS))
    assert unplaced == []


def test_no_launch_part_imports_one_above_it():
    offenders = sorted(f"{m} -> {t}" for m, targets in _edges().items() for t in targets
                       if launch_part_of(m) and launch_part_of(t)
                       and LAUNCH_PARTS.index(launch_part_of(t))
                       > LAUNCH_PARTS.index(launch_part_of(m)))
    assert offenders == []


def test_at_most_four_modules_stay_at_the_top_of_launch():
    top = sorted(p.name for p in (PACKAGE / "launch").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= LAUNCH_TOP_MODULES, top
    subpackages = {p.parent.name for p in (PACKAGE / "launch").glob("*/__init__.py")}
    assert subpackages | {name.removesuffix(".py") for name in top} == set(LAUNCH_PARTS)


def test_the_core_imports_no_megatron_core():
    """The attention core runs without megatron-core installed."""
    offenders = sorted(f"{m} -> {name}" for m, p in MODULES.items() if layer_of(m) in CORE
                       for name in imports_of(p) if name.split(".")[0] == "megatron")
    assert offenders == []


def test_no_import_circle():
    edges = _edges()
    # A package's __init__ naming its own modules is not a circle through them.
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in edges.items()}
    state: dict[str, str] = {}
    stack: list[str] = []

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


def test_no_module_over_350_lines_and_no_function_over_60():
    long_modules = {m: n for m, p in MODULES.items()
                    if (n := len(p.read_text().splitlines())) > 350}
    long_functions = sorted(
        f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for m, p in MODULES.items() for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 60)
    assert (long_modules, long_functions) == ({}, [])


def test_the_checker_resolves_relative_imports_as_python_does():
    """`from ..launch.config.schema import Config` in tools/ names launch's module, and a
    lazy import inside a function counts."""
    found = imports_of(PACKAGE / "tools" / "cpu_run.py")
    assert f"{NAME}.launch.config.schema.Config" in found
    assert _module_of(f"{NAME}.launch.config.schema.Config") == f"{NAME}.launch.config.schema"
    assert launch_part_of(f"{NAME}.launch.config.schema") == "config"


def test_the_core_reads_the_environment_in_one_module():
    """Settings are read once, into one validated value (``comm.settings``): no other module
    of the core layers or the Megatron adapter reads ``os.environ`` (issue 44 allows two)."""
    readers = sorted(m for m, p in MODULES.items() if layer_of(m) in LAYERS[:6]
                     and any(word in p.read_text() for word in ("os.environ", "getenv(")))
    assert readers == [f"{NAME}.comm.settings"], readers


def test_the_ranks_agree_through_one_module():
    """How agreement's numbers travel is stated once (``comm.consensus``): the device rule
    for a group's backend, the copy home behind an event, rank 0's value broadcast, the
    error as text (issue 44)."""
    rules = ('"nccl" in', "pin_memory=True", "broadcast_object_list",
             "isinstance(error, ValueError) else", "isinstance(err, ValueError) else")
    found = sorted((m, rule) for m, p in MODULES.items() if layer_of(m) in LAYERS[:6]
                   for rule in rules if rule in p.read_text())
    assert {m for m, _ in found} <= {f"{NAME}.comm.consensus", f"{NAME}.comm.headers"}, found
    # The headers keep their own pinned rows (one per message received), no other rule.
    assert [r for m, r in found if m.endswith("headers")] == ["pin_memory=True"], found
