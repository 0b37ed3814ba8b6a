"""Which arguments Megatron sets again after parsing, and from which: read from its source.

``parse_args`` gives each option's value to its argparse destination; then Megatron's own code
changes some of them (``validate_args``: ``--recompute-activations`` sets
``recompute_granularity = 'selective'``; ``--yaml-cfg`` and ``--use-checkpoint-args`` replace
arguments wholesale). A config that owns ``recompute_granularity`` must refuse
``--recompute-activations`` too, so ``owned_flags`` needs, for each destination, the
destinations its value can come from after parsing.

This module reads that from the source of ``megatron.training`` (no code of it runs): the
functions that parse and validate the arguments, and those they call with ``args`` inside
``megatron.training``. Every assignment to ``args.X`` (and ``setattr(args, 'X', ...)``)
records as sources of X every ``args.Y`` its value reads, through local variables, and every
``args.Y`` of the conditions it sits under (an ``if ...: return`` guards the rest of its
block). An assignment to ``args`` itself, a ``setattr`` with a computed name, or ``args``
handed to code outside ``megatron.training`` can change anything: its sources are recorded
under ``ANY``. The result over-approximates (a condition may never hold for the run), which
errs towards refusing an option; ``DYNAMIC_NAMES`` lists the computed ``setattr`` names read
by hand.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ANY = "*"  # the target of a change that can reach any argument
PACKAGE = "megatron.training"
# Functions that start the analysis, in the module each lives in; the driver (the first
# that exists) is read only up to its call of validate_args (after it, args are in use).
ROOTS = (("arguments", "parse_args"), ("arguments", "validate_args"))
DRIVERS = (("arguments", "parse_and_validate_args"), ("initialize", "initialize_megatron"))
# setattr(args, <computed>, ...) read by hand: the names it can set (megatron-core 0.19:
# deprecated --cuda-graph-modules values migrate to the cuda-graph options only).
DYNAMIC_NAMES = {"_normalize_cuda_graph_modules_args": ("cuda_graph_impl",
                                                        "inference_cuda_graph_scope")}
# Calls that take args only to read or print them.
READERS = {"print_rank_0", "warn_rank_0", "_print_args", "print", "getattr", "hasattr",
           "vars", "isinstance", "len", "str", "repr", "_check_arg_is_not_none"}


def module_path(root: Path, module: str) -> Path | None:
    """The source file of ``megatron.training.<module>`` under ``root`` (a folder holding
    ``megatron/``), or where Python finds it when ``root`` is None."""
    name = f"{PACKAGE}.{module}" if module else PACKAGE
    if root is not None:
        base = root.joinpath(*name.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec and spec.origin else None


class _Reader:
    """The source of megatron.training, function by function, parsed once each file."""

    def __init__(self, root: Path | None) -> None:
        self.root, self._trees = root, {}

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = module_path(self.root, module)
            self._trees[module] = ast.parse(path.read_text()) if path else None
        return self._trees[module]

    def function(self, module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        """(module, definition) of ``name`` as seen from ``module``: defined there, or
        imported there (at module level) from another module of megatron.training."""
        tree = self.tree(module)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = node.module[len(PACKAGE):].lstrip(".")
                        found = self.function(source, alias.name)
                        if found:
                            return found
        return None


def _is_args(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "args"


def _reads(node: ast.AST, local: dict[str, set[str]]) -> set[str]:
    """The args attributes an expression reads, directly, by getattr or via local names."""
    found: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and _is_args(n.value):
            found.add(n.attr)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("getattr", "hasattr") and len(n.args) > 1
              and _is_args(n.args[0]) and isinstance(n.args[1], ast.Constant)):
            found.add(str(n.args[1].value))
        elif isinstance(n, ast.Name) and n.id in local:
            found |= local[n.id]
    return found


def _sets_any(function: ast.FunctionDef) -> bool:
    """Whether ``function`` sets args attributes by computed names (loading them from a
    checkpoint, say), beyond those ``DYNAMIC_NAMES`` reads by hand."""
    if function.name in DYNAMIC_NAMES:
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id == "setattr" and n.args and _is_args(n.args[0])
               and not isinstance(n.args[1], ast.Constant) for n in ast.walk(function))


class _Analysis:
    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self.edges: dict[str, set[str]] = {}
        self._done: set[tuple[str, str, frozenset]] = set()

    def add(self, target: str, sources: set[str]) -> None:
        self.edges.setdefault(target, set()).update(sources)

    def function(self, module: str, node: ast.FunctionDef, ctx: frozenset,
                 stop_at: str | None = None) -> None:
        key = (module, node.name, ctx)
        if key not in self._done:
            self._done.add(key)
            self.block(module, node.name, node.body, set(ctx), {}, stop_at)

    def block(self, module: str, fn: str, body: list[ast.stmt], ctx: set[str],
              local: dict[str, set[str]], stop_at: str | None = None) -> None:
        ctx = set(ctx)
        for stmt in body:
            self.statement(module, fn, stmt, ctx, local)
            if isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[-1], ast.Return):
                ctx |= _reads(stmt.test, local)  # `if ...: return` guards what follows
            if stop_at and any(isinstance(n, ast.Name) and n.id == stop_at
                               for n in ast.walk(stmt)):
                return

    def statement(self, module: str, fn: str, node: ast.stmt, ctx: set[str],
                  local: dict[str, set[str]]) -> None:
        if isinstance(node, (ast.If, ast.While)):
            inner = ctx | _reads(node.test, local)
            self.block(module, fn, node.body, inner, local)
            self.block(module, fn, node.orelse, inner, local)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.block(module, fn, node.body + node.orelse, ctx | _reads(node.iter, local), local)
            return
        if isinstance(node, (ast.With, ast.Try)):
            for name in ("body", "orelse", "finalbody"):
                self.block(module, fn, getattr(node, name, []), ctx, local)
            for handler in getattr(node, "handlers", []):
                self.block(module, fn, handler.body, ctx, local)
            return
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value:
            if self.assignment(node, ctx, local):
                return  # args replaced whole: what made the new args is not read
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            self.call(module, fn, call, ctx, local)

    def assignment(self, node: ast.stmt, ctx: set[str], local: dict[str, set[str]]) -> bool:
        """Record an assignment; True if it replaces ``args`` itself."""
        sources = ctx | _reads(node.value, local)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(_is_args(target) for target in targets):
            self.add(ANY, sources)  # args replaced whole (from a YAML file)
            return True
        for target in targets:
            for n in ast.walk(target):
                if isinstance(n, ast.Attribute) and _is_args(n.value):
                    self.add(n.attr, sources)
                elif isinstance(n, ast.Name) and n.id != "args":
                    local[n.id] = local.get(n.id, set()) | sources
        return False

    def call(self, module: str, fn: str, call: ast.Call, ctx: set[str],
             local: dict[str, set[str]]) -> None:
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name == "setattr" and call.args and _is_args(call.args[0]):
            sources = ctx | _reads(call, local)
            if isinstance(call.args[1], ast.Constant):
                self.add(str(call.args[1].value), sources)
            for target in DYNAMIC_NAMES.get(fn, (ANY,)) if not isinstance(
                    call.args[1], ast.Constant) else ():
                self.add(target, sources)
            return
        passes = any(_is_args(a) for a in call.args) or any(_is_args(k.value)
                                                            for k in call.keywords)
        if not passes or name in READERS:
            return
        found = self.reader.function(module, name) if name else None
        if found is None:
            found = self._imported_inside(module, fn, name)
        if found is None or _sets_any(found[1]):  # may change anything: its inside is
            self.add(ANY, set(ctx))                   # not read (code outside the package,
            return                                    # or a setattr with computed names)
        self.function(found[0], found[1], frozenset(ctx))

    def _imported_inside(self, module: str, fn: str, name: str | None):
        """``name`` imported inside function ``fn`` from megatron.training."""
        found = self.reader.function(module, fn) if name else None
        for n in ast.walk(found[1]) if found else ():
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PACKAGE):
                for alias in n.names:
                    if (alias.asname or alias.name) == name:
                        return self.reader.function(n.module[len(PACKAGE):].lstrip("."),
                                                    alias.name)
        return None


def rewrite_sources(root: Path | None = None) -> dict[str, list[str]]:
    """{destination: [destinations it is set from after parsing]}, ``ANY`` included, for the
    megatron.training under ``root`` (None: the importable one)."""
    analysis = _Analysis(_Reader(root))
    for module, name in ROOTS:
        found = analysis.reader.function(module, name)
        if found is None:
            raise ValueError(f"{PACKAGE}.{module}.{name} not found under {root}")
        analysis.function(*found, frozenset())
    for module, name in DRIVERS:
        found = analysis.reader.function(module, name)
        if found is not None:
            analysis.function(*found, frozenset(), stop_at="validate_args")
            break
    return {target: sorted(sources - {target}) for target, sources in
            sorted(analysis.edges.items()) if sources - {target}}
