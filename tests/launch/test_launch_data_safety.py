"""`megatron-burst data` never destroys what it replaces: outputs appear whole or not at all.

A re-run that fails (a bad line, no tokens) or is stopped (SIGTERM) leaves the previous
dataset readable and no half-written or hidden file; replacing an output needs --force, and
never deletes a file the tool did not write; a broken line (a lone surrogate included) is
named with its file, line, column and the full reason. Kills at every step of the commit
and racing runs are in test_launch_data_commit.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers", reason="the data path needs the `data` extra: tokenizers")
pytest.importorskip("megatron.core")

from megatron_burst.cli.parser import main  # noqa: E402
from megatron_burst.launch.data.dataset import DataError, tokenize_jsonl, write_dataset  # noqa: E402
from megatron_burst.launch.data.sample import write_sample  # noqa: E402

from .conftest import REPO  # noqa: E402
from .datasets import assert_no_leftovers, contents, visible, write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """The offline sample's tokenizer folder, made once for this module."""
    return write_sample(tmp_path_factory.mktemp("sample")).dataset.tokenizer.path


@pytest.fixture
def old_dataset(tmp_path, tokenizer_dir):
    """A dataset already at tmp_path/out/docs, and what it holds."""
    prefix = tmp_path / "out" / "docs"
    prefix.parent.mkdir()
    tokenize_jsonl(write_corpus(tmp_path / "old.jsonl", ["the old dataset"] * 3), tokenizer_dir,
                   str(prefix))
    return prefix, contents(prefix)


def test_failed_rerun_keeps_the_previous_dataset(tmp_path, tokenizer_dir, old_dataset):
    prefix, before = old_dataset
    # Far more than one encoding chunk before the bad line, so writing has begun.
    bad = write_corpus(tmp_path / "bad.jsonl", [f"new document {i}" for i in range(2500)],
                       raw_lines={2400: '{"text": "cut'})
    with pytest.raises(DataError, match="line 2400"):
        tokenize_jsonl(bad, tokenizer_dir, str(prefix), force=True)
    assert contents(prefix) == before
    assert visible(prefix.parent) == ["docs.bin", "docs.idx"]
    assert_no_leftovers(prefix)
    empty = write_corpus(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(DataError, match="no document with any token"):
        tokenize_jsonl(empty, tokenizer_dir, str(prefix), force=True)
    assert contents(prefix) == before
    assert_no_leftovers(prefix)


def test_existing_output_needs_force(tmp_path, tokenizer_dir, old_dataset, capsys):
    prefix, before = old_dataset
    new = write_corpus(tmp_path / "new.jsonl", ["a new text", "and another"])
    argv = ["data", str(new), "--tokenizer", tokenizer_dir, "-o", str(prefix)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--force" in err and "docs.bin" in err, err
    assert contents(prefix) == before
    assert main([*argv, "--force"]) == 0
    assert "replaced" in capsys.readouterr().out
    assert len(contents(prefix)) == 2
    assert_no_leftovers(prefix)


def test_failed_first_run_leaves_nothing(tmp_path, tokenizer_dir):
    """Nothing at all, hidden files included: no versions folder, lock or link."""
    empty = write_corpus(tmp_path / "empty.jsonl", [""])
    (tmp_path / "new").mkdir()
    with pytest.raises(DataError, match="no document with any token"):
        tokenize_jsonl(empty, tokenizer_dir, str(tmp_path / "new" / "docs"))
    assert list((tmp_path / "new").iterdir()) == []


SIGTERM_MID_RUN = """
import os, signal, sys
from megatron_burst.launch.data.dataset import load_tokenizer, write_dataset

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
    assert contents(prefix) == before
    assert visible(prefix.parent) == ["docs.bin", "docs.idx"]
    assert_no_leftovers(prefix)


def test_broken_line_names_file_line_column_and_full_reason(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path / "c.jsonl", ["fine", "fine too"],
                          raw_lines={2: '{"text": "a\tb"}'})
    with pytest.raises(DataError) as error:
        tokenize_jsonl(corpus, tokenizer_dir, str(tmp_path / "d"))
    message = str(error.value)
    assert f"{corpus} line 2 column 12" in message
    assert "Invalid control character '\\t'" in message and "escape" in message
    assert not list(tmp_path.glob("d*")) and not list(tmp_path.glob(".d*"))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match="line 2: not UTF-8"):
        tokenize_jsonl(tmp_path / "latin1.jsonl", tokenizer_dir, str(tmp_path / "d"))


@pytest.mark.parametrize("line, column", [
    ('{"text": "a\\ud800b"}', 12),                    # a high half alone
    ('{"text": "ok \\udc00"}', 14),                    # a low half alone
    ('{"text": "\\ud83d\\n\\ude00"}', 11),           # the halves apart
    ('{"id": "\\\\ud800", "text": "x\\ud800"}', 29),   # an escaped backslash is no escape
])
def test_lone_surrogate_is_named_with_line_and_column(tmp_path, tokenizer_dir, capsys, line,
                                                      column):
    """A lone surrogate reached the tokenizer and failed there (TypeError, no line)."""
    # Line 2 holds a pair (json.dumps escapes the emoji as two halves): no error there.
    corpus = write_corpus(tmp_path / "s.jsonl", ["fine", "fine \U0001F600 too"],
                          raw_lines={3: line})
    argv = ["data", str(corpus), "--tokenizer", tokenizer_dir, "-o", str(tmp_path / "d")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"{corpus} line 3 column {column}: 'text' holds a lone surrogate" in err, err
    assert not list(tmp_path.glob("d*")) and not list(tmp_path.glob(".d*"))


def test_surrogate_pairs_are_text(tmp_path, tokenizer_dir):
    """A pair of escapes is one character (an emoji), and a fine document."""
    corpus = tmp_path / "pair.jsonl"
    corpus.write_text('{"text": "smile \\ud83d\\ude00"}\n')
    summary = tokenize_jsonl(corpus, tokenizer_dir, str(tmp_path / "d"))
    assert summary.documents == 1


def test_sample_rerun_needs_force_and_replaces_whole(tmp_path):
    first = write_sample(tmp_path / "s")
    with pytest.raises(DataError, match="--force"):
        write_sample(tmp_path / "s")
    again = write_sample(tmp_path / "s", force=True)
    assert again.dataset.tokenizer.path == first.dataset.tokenizer.path
    assert again.dataset.replaced
    assert visible(tmp_path / "s") == [
        "corpus.jsonl", "sample.json", "text_document.bin", "text_document.idx", "tokenizer"]
    assert contents(tmp_path / "s" / "text_document") == contents(first.dataset.prefix)
    assert_no_leftovers(tmp_path / "s" / "text_document")


def test_sample_never_deletes_a_file_it_did_not_write(tmp_path, capsys):
    """--force replaces the sample's own tokenizer folder, never a file of the user's in it."""
    write_sample(tmp_path / "s")
    stale = tmp_path / "s" / "tokenizer" / "notes.txt"
    stale.write_text("mine")
    assert main(["data", "--sample-corpus", str(tmp_path / "s"), "--force"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "notes.txt" in err and "move them away" in err, err
    assert stale.read_text() == "mine"
    stale.unlink()
    (tmp_path / "s" / "corpus.jsonl").unlink()
    (tmp_path / "s" / "corpus.jsonl").mkdir()
    assert main(["data", "--sample-corpus", str(tmp_path / "s"), "--force"]) == 2
    assert "corpus.jsonl is a folder" in capsys.readouterr().err


def test_write_dataset_refuses_to_overwrite_by_default(tmp_path, tokenizer_dir, old_dataset):
    from megatron_burst.launch.data.dataset import load_tokenizer

    prefix, before = old_dataset
    with pytest.raises(DataError, match="--force"):
        write_dataset(["text"], load_tokenizer(tokenizer_dir), str(prefix))
    assert contents(prefix) == before
