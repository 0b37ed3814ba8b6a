"""Each rule has one owner (issue 44, item 4 and 5): a rule restated elsewhere is found here.

- a call's arguments: ``BurstCall``'s fields (``call.ARGUMENTS``), which ``burst_attn``'s
  keywords match, in the public order;
"""
from __future__ import annotations

import inspect
import pathlib

from megatron_burst.attention.api import burst_attn
from megatron_burst.attention.call import ARGUMENTS, BurstCall

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "megatron_burst"


def test_burst_attn_takes_exactly_the_arguments_a_call_holds():
    keywords = [p.name for p in inspect.signature(burst_attn).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(keywords) == sorted(ARGUMENTS)


def test_a_call_is_made_by_keyword_only():
    assert all(f.kw_only for f in BurstCall.__dataclass_fields__.values() if f.init)
