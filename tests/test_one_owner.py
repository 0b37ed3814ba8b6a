"""Each rule has one owner (issue 44, item 4 and 5): a rule restated elsewhere is found here.

- a call's arguments: ``BurstCall``'s fields (``call.ARGUMENTS``), which ``burst_attn``'s
  keywords match;
- the layouts (their names, divisors and placing): ``plan/layouts.py``'s values;
- the kernels' names: each kernel class's ``name``; the GPU head-dim limits:
  ``kernels/limits.py``;
- a call's head shape: ``HeadShape.of_tensors`` (and a model's: ``HeadShape.of_tp_rank``).
"""
from __future__ import annotations

import inspect
import pathlib
import re

from megatron_burst.attention.api import burst_attn
from megatron_burst.attention.call import ARGUMENTS, BurstCall
from megatron_burst.kernels.selection import KERNELS
from megatron_burst.plan.layouts import _BY_NAME, DOCUMENT_LAYOUTS, LAYOUTS, MASK_LAYOUTS

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "megatron_burst"


def test_burst_attn_takes_exactly_the_arguments_a_call_holds():
    keywords = [p.name for p in inspect.signature(burst_attn).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(keywords) == sorted(ARGUMENTS)


def test_a_call_is_made_by_keyword_only():
    assert all(f.kw_only for f in BurstCall.__dataclass_fields__.values() if f.init)


def _lines(skip: tuple[str, ...] = ()):
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name not in skip:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                yield f"{name}:{number}", code


def _restated(pattern: str, owner: tuple[str, ...]) -> list[str]:
    return [where for where, code in _lines(owner) if re.search(pattern, code)]


def test_the_sequence_divisor_is_stated_only_by_the_layouts():
    """`seq % 2cp` (and `s_local % 2`) is the zigzag layout's rule: ``plan/layouts.py``
    states it, ``CPTopology.seq_len_divisor`` and every check ask it."""
    assert _restated(r"%\s*\(?\s*2\s*\*|s_local\s*%\s*2\b|chunks_per_rank",
                     ("plan/layouts.py",)) == []


def test_no_code_compares_a_layout_with_its_name():
    """Layouts are values that say what they do (divisor, padding, what they place): no
    if/else on their names outside ``plan/layouts.py``."""
    assert _restated(r"layout\s*(==|!=)\s*[\"']|layout\s+(not\s+)?in\s+\(",
                     ("plan/layouts.py",)) == []


def test_layout_names_are_listed_once():
    assert _restated(r"\bLAYOUTS\s*=", ("plan/layouts.py",)) == []
    assert set(LAYOUTS) | set(MASK_LAYOUTS) | set(DOCUMENT_LAYOUTS) == set(_BY_NAME)


def test_kernel_names_are_said_by_the_kernels_alone():
    """Each kernel's name is its class's ``name``; the registry is made of the classes."""
    for name in KERNELS:
        # (kernels/__init__.py names its modules, one of them ``reference``)
        assert len(_restated(rf"[\"']{re.escape(name)}[\"']", ("kernels/__init__.py",))) == 1, name


def test_gpu_head_dim_limits_have_one_owner():
    """kernels/limits.py, torch-free, which cuda.py's capabilities and launch's plan read."""
    assert _restated(r"(max_head_dim|head_dim_multiple)\s*=\s*\d|HEAD_DIM\w*\s*=\s*\d",
                     ("kernels/limits.py",)) == []


def test_a_head_shape_is_made_in_one_place():
    """The heads of a call's tensors come from ``HeadShape.of_tensors``, a model's from
    ``HeadShape.of_tp_rank``: no other module builds one field by field."""
    assert _restated(r"HeadShape\(\s*q\.shape", ("decide/topology.py",)) == []
