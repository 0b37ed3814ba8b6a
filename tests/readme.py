"""The README as the tests that check its figures read it: one line of text (line breaks
as spaces), and `says`, which fails naming the phrase the README should contain."""
from __future__ import annotations

import contextlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = " ".join((REPO / "README.md").read_text().split())
RESULTS = REPO / "benchmarks" / "results"


def says(phrase: str) -> None:
    assert " ".join(phrase.split()) in README, f"README should say: {phrase}"


@contextlib.contextmanager
def even_chunks():
    """The area layout as it was before its cuts could move between slices
    (``plan.area.BETWEEN_SLICES`` off: even chunks, every cut an edge), for the analyses on
    file whose plans were made then; plans and placements made anew inside and after."""
    from megatron_burst.attention import call_plan, prepare, varying_masks
    from megatron_burst.plan import area, mask_placement

    def forget():  # every cache that holds a placement or a plan made from one
        call_plan.clear()
        prepare.PREPARED.clear()
        varying_masks.clear()
        mask_placement.mask_placement.cache_clear()

    area.BETWEEN_SLICES = False
    forget()
    try:
        yield
    finally:
        area.BETWEEN_SLICES = True
        forget()
