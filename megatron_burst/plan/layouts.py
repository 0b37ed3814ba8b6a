"""The names of the ways tokens are placed on the ranks (``placement`` places them).

Apart from ``placement`` so that what only needs the names (the options schema, the
configs, the command line) imports no numpy and no torch.
"""
from __future__ import annotations

LAYOUTS = ("zigzag", "contiguous", "whole_docs")
# How Megatron document batches may be placed: `whole_docs` keeps short documents on one
# rank; `zigzag` splits every document over all ranks, padded to 2*cp.
DOCUMENT_LAYOUTS = ("whole_docs", "zigzag")
# How a slice mask's tokens may be placed: `area` (the default with a mask) deals chunks so
# every rank holds the same share of the visible area; `zigzag` and `contiguous` as for a
# plain sequence.
MASK_LAYOUTS = ("area", "zigzag", "contiguous")
