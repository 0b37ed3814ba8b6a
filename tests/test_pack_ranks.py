"""Packs planned from arrays, run: ``burst_attn`` on 2-4 gloo ranks against the float64
reference (out, lse, dq, dk, dv), for random packs of the whole_docs layout.

The packs are those that exercise the new planning: many tiny documents with empty ones
among them, one huge document among tiny ones (split zigzag over every rank), and a mix
whose documents are cut where the ranks' room ends; under causal, full and sliding-window
masks, both backward passes, and Ulysses members (whose rows interleave split and whole
documents of two ranks).
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from .grid import check_grid
from .packs import random_pack

WINDOWS = [dict(causal=True), dict(causal=False), dict(causal=True, window=(5, 0)),
           dict(causal=False, window=(3, 9))]


def pack_cases(world: int, ulysses: int = 1) -> list[dict]:
    rng = random.Random(world * 10 + ulysses)
    cases = []
    for kind, mask, backward in itertools.product(("tiny", "huge", "mix"), WINDOWS,
                                                  ("burst", "ring")):
        lens = random_pack(rng, world * rng.randint(48, 160), kind)
        extra = {"ulysses_size": ulysses} if ulysses > 1 else {}
        cases.append(dict(layout="whole_docs", hq=4, hkv=2, d=16, backward=backward,
                          dtype=torch.float32, doc_lens=lens, **mask, **extra))
    return cases


@pytest.mark.parametrize("world", [2, 3, 4])
def test_random_packs_match_float64_reference(world):
    check_grid(world, pack_cases(world))


def test_random_packs_on_ulysses_members_match_float64_reference():
    check_grid(4, pack_cases(4, ulysses=2))
