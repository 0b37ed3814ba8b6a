"""The README's quick start can be run again as written: its data step keeps a complete sample
instead of refusing it (which made `&&` skip the training), and says so."""
from __future__ import annotations

import shlex

import pytest

from megatron_burst.cli.parser import main

from .conftest import REPO
from .readme_blocks import readme_block


def _data_command() -> list[str]:
    """The words of the text quick start's first command (before its `&&`), read as CI
reads the README."""
    block = readme_block((REPO / "README.md").read_text(), "text")
    first = block.split("&&")[0]
    words = shlex.split(first)
    assert words[:2] == ["megatron-burst", "data"] and "--sample-corpus" in words, first
    return words[1:]


def test_text_quick_start_runs_twice_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tokenizers")
    pytest.importorskip("megatron.core")
    monkeypatch.chdir(tmp_path)
    words = _data_command()
    assert main(words) == 0
    assert "wrote data/sample/corpus.jsonl" in capsys.readouterr().out
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*") if p.is_file()}
    assert main(words) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("kept data/sample: the sample there is complete")
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*") if p.is_file()}
    assert after == before  # kept, not rewritten
    # Another vocabulary, or --force beside it, is refused in one line.
    assert main([*words, "--vocab-size", "512"]) == 2
    assert "holds a sample with a 1024-token vocabulary, not 512" in capsys.readouterr().err
    assert main([*words, "--force"]) == 2
    assert "pass one of them" in capsys.readouterr().err
