"""The README as the tests that check its figures read it: one line of text (line breaks
as spaces), and `says`, which fails naming the phrase the README should contain."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = " ".join((REPO / "README.md").read_text().split())
RESULTS = REPO / "benchmarks" / "results"


def says(phrase: str) -> None:
    assert " ".join(phrase.split()) in README, f"README should say: {phrase}"
