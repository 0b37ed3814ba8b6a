"""``benchmarks/span_model.py``: the price fitted to the in-layer spans on file, and the deals
it prices, are what its results folder says (the fit is deterministic: the same spans, the
same plans, least squares)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .readme import RESULTS, even_chunks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
span_model = pytest.importorskip("span_model")
FOLDER = RESULTS / "cpu_issue42_span_model"


def _on_file() -> dict:
    return json.loads((FOLDER / "span_model.json").read_text())


def _folder() -> str:
    return " ".join((FOLDER / "README.md").read_text().split())


def test_the_fit_is_the_one_on_file_and_names_the_slower_rank():
    with even_chunks():  # the spans on file ran the plans of that layout
        model = span_model.fit()
    run = _on_file()
    assert model["coef"] == pytest.approx(run["meta"]["model"]["coef"], rel=1e-9)
    assert model["spans"] == 99 and (model["slower_named"], model["slower_pairs"]) == (28, 29)
    assert model["median_error"] < 0.1 < 0.2 < model["pairs_only_median_error"]
    a, b, c = model["coef"]
    text = _folder()
    assert f"a = {a:.3f}, b = {b:.3f} and c = {c:.3f}" in text
    assert f"median error is {100 * model['median_error']:.1f}% and its largest " \
           f"{100 * model['max_error']:.1f}%" in text
    assert f"median error is {100 * model['pairs_only_median_error']:.1f}%" in text


def test_a_rank_s_features_count_its_calls_pairs_and_rows():
    dense_pairs, dense_rows, varlen_rows, varlen_pairs = span_model.features(
        "causal", 1, 0, span_model.GPU_BOUND)
    n = span_model.TOTAL  # one GPU's causal attention: one dense call of every row
    assert (dense_pairs, dense_rows, varlen_rows, varlen_pairs) == (
        n * (n + 1) / 2 / 1e6, n / 1e3, 0, 0)


def test_the_priced_deals_are_the_ones_on_file():
    rows = [r for r in _on_file()["rows"] if r["family"] == "causal_document"]
    coef = _on_file()["meta"]["model"]["coef"]
    with even_chunks():
        priced = span_model.price_deals("causal_document", coef)
    for row in rows:
        assert priced[row["deal"]] == pytest.approx(row["priced_ms"], rel=1e-9)
    best = min(priced, key=lambda w: max(priced[w]))
    ratio = max(priced[best]) / max(priced["package"])
    assert best == "0,2,3,7" and f"`0,2,3,7` ({ratio:.3f} of the" in _folder()
