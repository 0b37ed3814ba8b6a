"""The names of the ways tokens are placed on the ranks (``placement`` places them).

Apart from ``placement`` so that what only needs the names (the options schema, the
configs, the command line) imports no numpy and no torch.
"""
from __future__ import annotations

LAYOUTS = ("zigzag", "contiguous", "whole_docs")
# How Megatron document batches may be placed: `whole_docs` keeps short documents on one
# rank; `zigzag` splits every document over all ranks, padded to 2*cp.
DOCUMENT_LAYOUTS = ("whole_docs", "zigzag")
