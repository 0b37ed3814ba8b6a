"""One word per idea (issue 34): names retired from the package stay retired.

``layout`` is where tokens sit on the CP ranks and nothing else; the CP group's shape is its
``topology``; a count of ranks per node is ``intra_node_size`` (CP ranks per node of the
double ring), ``max_intra_node_size`` (the most a node holds), ``positions_per_node`` (ring
positions) or ``gpus_per_node`` (the machine's). The README's glossary lists them. This
test reads the source, tests, configs, scripts, patches, benchmark scripts, README and docs
for the identifiers those words replaced, and fails listing each file:line that uses one.
Recorded benchmark output (``benchmarks/results/``) is left as it was recorded.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()

# Retired identifier -> the word that replaced it. Word boundaries, so `gpus_per_node` and
# `max_intra_node_size` do not match `per_node` or `node_size`.
RETIRED = {
    "ranks_per_node": "intra_node_size (or max_intra_node_size)",
    "cp_ranks_per_node": "max_intra_node_size",
    "group_ranks_per_node": "max_intra_node_size_of",
    "per_node": "intra_node_size, max_intra_node_size, positions_per_node or gpus_per_node",
    "intra_size": "positions_per_node",
    "inner_ring": "positions_per_node",
    "node_size": "gpus_per_node",
    "NodeSize": "GpusPerNode",
    "local_gpus": "gpus_per_node",
    "RowLayout": "RowShape",
    "LayoutRow": "TopologyRow",
    "layout_rows": "topology_rows",
    "layout_candidates": "topology_candidates",
    "cp_topology": "topology (the module defining CPTopology)",
    "RingTopology": "RingPositions (comm: the ring's positions; the CP group's is CPTopology)",
    # Issue 44: 'call' is a burst_attn call, 'spec' Megatron's ModuleSpec.
    "KernelCall": "KernelLaunch (one local kernel invocation; a call is a burst_attn call)",
    "RingSpec": "BoundPlan (a spec is Megatron's ModuleSpec)",
    "ring_spec": "bound_plan",
}
PATTERN = re.compile(r"\b(" + "|".join(sorted(RETIRED, key=len, reverse=True)) + r")\b")

# What is read: the repository's own text, not recorded output or tool caches.
ROOTS = ("megatron_burst", "tests", "configs", "scripts", "patches", "docs")
TOP_FILES = ("README.md",)
SKIP_DIRS = {".git", ".venv", ".ci-cache", "__pycache__", "results"}


def _files() -> list[Path]:
    found = [REPO / name for name in TOP_FILES]
    found += [p for p in (REPO / "benchmarks").glob("*") if p.is_file()]
    for root in ROOTS:
        for path in (REPO / root).rglob("*"):
            if path.is_file() and not SKIP_DIRS & set(path.relative_to(REPO).parts):
                found.append(path)
    return sorted(p for p in found if p.resolve() != HERE)


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (images, compiled files)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return None if "\0" in text else text


def test_no_retired_identifier_is_used():
    uses = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in PATTERN.finditer(line):
                uses.append(f"{path.relative_to(REPO)}:{number}: {m.group(1)} "
                            f"(now {RETIRED[m.group(1)]})")
    assert not uses, "retired identifiers in use:\n" + "\n".join(uses)


def test_the_files_read_include_the_package_and_the_readme():
    """The walk itself: a root renamed away would make the test above pass on nothing."""
    names = {p.relative_to(REPO).as_posix() for p in _files()}
    assert {"README.md", "megatron_burst/decide/topology.py", "tests/test_layering.py"} <= names
    assert not any(n.startswith("benchmarks/results/") for n in names)


def test_one_module_is_named_for_the_topology():
    """The module defining CPTopology is `topology`; the others are named by their job."""
    named = sorted(p.relative_to(REPO).as_posix()
                   for p in (REPO / "megatron_burst").rglob("*topology*.py"))
    assert named == ["megatron_burst/decide/topology.py",
                     "megatron_burst/launch/planning/topology_candidates.py"]


def test_a_prediction_and_a_topology_use_the_settled_words():
    """Attribute access is hard to grep (`.layout` is a call's placement): the fields."""
    from megatron_burst.decide.timing import Prediction
    from megatron_burst.decide.topology import CPTopology

    assert "topology" in {f.name for f in dataclasses.fields(Prediction)}
    fields = {f.name for f in dataclasses.fields(CPTopology)}
    assert "intra_node_size" in fields and not fields & {"layout", *RETIRED}
    assert not {"layout", *RETIRED} & {f.name for f in dataclasses.fields(Prediction)}
