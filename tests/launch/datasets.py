"""Helpers of the `megatron-burst data` tests: corpora, what a reader of a prefix sees, and
what a commit leaves beside the dataset."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def write_corpus(path: Path, texts: list[str], raw_lines: dict[int, str] | None = None) -> Path:
    """A JSONL file of ``texts``; ``raw_lines`` puts verbatim lines at these 1-based numbers."""
    lines = [json.dumps({"text": t}) for t in texts]
    for number, raw in sorted((raw_lines or {}).items()):
        lines.insert(number - 1, raw)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def contents(prefix) -> list[list[int]]:
    """Every document of the dataset at ``prefix``, read by megatron-core's own reader."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(prefix))
    return [dataset[i].tolist() for i in range(len(dataset))]


def reader_sees(prefix) -> list[list[int]] | str:
    """What a reader opening ``prefix`` now gets: the documents, or the error it raises."""
    try:
        return contents(prefix)
    except Exception as e:  # megatron-core asserts, or fails to open or map a file
        return f"error: {type(e).__name__}: {e}"


def visible(folder: Path) -> list[str]:
    """The names in ``folder`` a plain `ls` shows."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def versions_folder(prefix) -> Path:
    prefix = Path(prefix)
    return prefix.parent / f".{prefix.name}.versions"


def assert_no_leftovers(prefix) -> None:
    """Beside a committed dataset: its two links, and in the versions folder the lock, the
    `current` link and the one version it names; nothing hidden and nothing partial."""
    prefix = Path(prefix)
    versions = versions_folder(prefix)
    hidden = sorted(p.name for p in prefix.parent.iterdir()
                    if p.name.startswith(f".{prefix.name}") and p != versions)
    assert hidden == [], hidden
    current = os.readlink(versions / "current")
    assert sorted(p.name for p in versions.iterdir()) == sorted(["lock", "current", current])
    assert sorted(p.name for p in (versions / current).iterdir()) == [
        f"{prefix.name}.bin", f"{prefix.name}.idx"]


def as_plain_files(source_prefix, prefix) -> None:
    """Copy a dataset to ``prefix`` as two regular files, as Megatron's preprocess_data.py
    (or an earlier release of this tool) leaves one."""
    for suffix in (".bin", ".idx"):
        shutil.copyfile(str(source_prefix) + suffix, str(prefix) + suffix)
