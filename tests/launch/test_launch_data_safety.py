"""`megatron-burst data` never destroys what it replaces: outputs appear whole or not at all.

A re-run that fails (a bad line, no tokens) or is stopped (SIGTERM) leaves the previous
dataset readable and no half-written file; replacing an output needs --force; a broken line
is named with its file, line, column and the full reason.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers", reason="the data path needs the `data` extra: tokenizers")
pytest.importorskip("megatron.core")

from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402

from megatron_burst.launch.cli import main  # noqa: E402
from megatron_burst.launch.data import DataError, tokenize_jsonl, write_dataset  # noqa: E402
from megatron_burst.launch.sample_data import write_sample  # noqa: E402

from .conftest import REPO  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """The offline sample's tokenizer folder, made once for this module."""
    return write_sample(tmp_path_factory.mktemp("sample")).dataset.tokenizer.path


def _corpus(path, texts: list[str], raw_lines: dict[int, str] | None = None):
    """A JSONL file of ``texts``; ``raw_lines`` puts verbatim lines at these 1-based numbers."""
    lines = [json.dumps({"text": t}) for t in texts]
    for number, raw in sorted((raw_lines or {}).items()):
        lines.insert(number - 1, raw)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _contents(prefix) -> list[list[int]]:
    dataset = IndexedDataset(str(prefix))
    return [dataset[i].tolist() for i in range(len(dataset))]


@pytest.fixture
def old_dataset(tmp_path, tokenizer_dir):
    """A dataset already at tmp_path/out/docs, and what it holds."""
    prefix = tmp_path / "out" / "docs"
    tokenize_jsonl(_corpus(tmp_path / "old.jsonl", ["the old dataset"] * 3), tokenizer_dir,
                   str(prefix))
    return prefix, _contents(prefix)


def test_failed_rerun_keeps_the_previous_dataset(tmp_path, tokenizer_dir, old_dataset):
    prefix, before = old_dataset
    # Far more than one encoding chunk before the bad line, so writing has begun.
    bad = _corpus(tmp_path / "bad.jsonl", [f"new document {i}" for i in range(2500)],
                  raw_lines={2400: '{"text": "cut'})
    with pytest.raises(DataError, match="line 2400"):
        tokenize_jsonl(bad, tokenizer_dir, str(prefix), force=True)
    assert _contents(prefix) == before
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["docs.bin", "docs.idx"]
    empty = _corpus(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(DataError, match="no document with any token"):
        tokenize_jsonl(empty, tokenizer_dir, str(prefix), force=True)
    assert _contents(prefix) == before
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["docs.bin", "docs.idx"]


def test_existing_output_needs_force(tmp_path, tokenizer_dir, old_dataset, capsys):
    prefix, before = old_dataset
    new = _corpus(tmp_path / "new.jsonl", ["a new text", "and another"])
    argv = ["data", str(new), "--tokenizer", tokenizer_dir, "-o", str(prefix)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--force" in err and "docs.bin" in err, err
    assert _contents(prefix) == before
    assert main([*argv, "--force"]) == 0
    assert "replaced" in capsys.readouterr().out
    assert len(_contents(prefix)) == 2


def test_failed_first_run_leaves_no_folder(tmp_path, tokenizer_dir):
    empty = _corpus(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DataError):
        tokenize_jsonl(empty, tokenizer_dir, str(tmp_path / "new" / "deeper" / "docs"))
    assert not (tmp_path / "new").exists()


SIGTERM_MID_RUN = """
import os, signal, sys
from megatron_burst.launch.data import load_tokenizer, write_dataset

def texts():
    for i in range(3000):
        if i == 1500:  # the first chunk of 1000 documents is already in the .bin
            os.kill(os.getpid(), signal.SIGTERM)
        yield f"document {i} " * 20

write_dataset(texts(), load_tokenizer(sys.argv[1]), sys.argv[2], force=True)
"""


def test_sigterm_mid_run_leaves_the_old_dataset_readable(tokenizer_dir, old_dataset):
    prefix, before = old_dataset
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", SIGTERM_MID_RUN, tokenizer_dir,
                           str(prefix)], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), proc.stderr[-2000:]
    assert _contents(prefix) == before
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["docs.bin", "docs.idx"]


def test_broken_line_names_file_line_column_and_full_reason(tmp_path, tokenizer_dir):
    corpus = _corpus(tmp_path / "c.jsonl", ["fine", "fine too"],
                     raw_lines={2: '{"text": "a\tb"}'})
    with pytest.raises(DataError) as error:
        tokenize_jsonl(corpus, tokenizer_dir, str(tmp_path / "d"))
    message = str(error.value)
    assert f"{corpus} line 2 column 12" in message
    assert "Invalid control character '\\t'" in message and "escape" in message
    assert not list(tmp_path.glob("d*"))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match="line 2: not UTF-8"):
        tokenize_jsonl(tmp_path / "latin1.jsonl", tokenizer_dir, str(tmp_path / "d"))


def test_sample_rerun_needs_force_and_replaces_whole(tmp_path):
    first = write_sample(tmp_path / "s")
    with pytest.raises(DataError, match="--force"):
        write_sample(tmp_path / "s")
    (tmp_path / "s" / "tokenizer" / "stale.txt").write_text("from an older run")
    again = write_sample(tmp_path / "s", force=True)
    assert again.dataset.tokenizer.path == first.dataset.tokenizer.path
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "corpus.jsonl", "text_document.bin", "text_document.idx", "tokenizer"]
    assert not (tmp_path / "s" / "tokenizer" / "stale.txt").exists()
    assert _contents(tmp_path / "s" / "text_document") == _contents(first.dataset.prefix)


def test_write_dataset_refuses_to_overwrite_by_default(tmp_path, tokenizer_dir, old_dataset):
    from megatron_burst.launch.data import load_tokenizer

    prefix, before = old_dataset
    with pytest.raises(DataError, match="--force"):
        write_dataset(["text"], load_tokenizer(tokenizer_dir), str(prefix))
    assert _contents(prefix) == before
