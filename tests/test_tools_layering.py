"""The tools sit beside the core, not under it: nothing in the core imports megatron_burst.tools.

The core is the package's top level and ``megatron_burst/megatron/``; of the launch layer only
the CLI's command modules start tools. The one exception is the emulator's switch,
``link_emulation.maybe_emulate_links``, which imports the tool inside the function, once
``$MEGATRON_BURST_EMULATE`` asks for it.
"""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "megatron_burst"
CLI_COMMANDS = {"launch/cli.py", "launch/commands.py", "launch/run_command.py"}
SWITCH = "link_emulation.py"


def _imports(path: pathlib.Path) -> list[tuple[str, bool]]:
    """(absolute name imported, at module level) of every import in ``path``: a module, or
    ``module.name`` for ``from module import name``."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found += [(f"{name}.{alias.name}", id(node) in top) for alias in node.names]
    return found


def _tools_imports(path: pathlib.Path) -> list[tuple[str, bool]]:
    return [(name, top) for name, top in _imports(path)
            if name == "megatron_burst.tools" or name.startswith("megatron_burst.tools.")]


def test_the_core_imports_no_tool():
    core = [*PACKAGE.glob("*.py"), *(PACKAGE / "megatron").glob("*.py")]
    assert len(core) > 10
    offenders = {str(p.relative_to(PACKAGE)): _tools_imports(p) for p in core
                 if p.name != SWITCH and _tools_imports(p)}
    assert offenders == {}
    # The switch imports the emulator inside its function only, never at import time.
    assert _tools_imports(PACKAGE / SWITCH) == [
        ("megatron_burst.tools.emulate.install_from_env", False)]


def test_of_the_launch_layer_only_the_cli_commands_start_tools():
    users = {str(p.relative_to(PACKAGE)) for p in (PACKAGE / "launch").glob("*.py")
             if _tools_imports(p)}
    assert users <= CLI_COMMANDS


def test_relative_imports_resolve_as_python_does():
    """The checker itself: `from ..tools.cpu_run import run_cpu` in launch/ is a tool."""
    found = dict(_imports(PACKAGE / "launch" / "run_command.py"))
    assert found.get("megatron_burst.tools.cpu_run.run_cpu") is False
    assert found.get("megatron_burst.launch.config.Config") is True
