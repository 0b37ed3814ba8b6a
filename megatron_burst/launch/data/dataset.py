"""`megatron-burst data`: a JSONL corpus in, Megatron's indexed dataset (PREFIX.bin/.idx) out.

Megatron trains on token files in its own indexed format, and the tool that writes them
(`tools/preprocess_data.py`) lives in Megatron-LM, not in the megatron-core wheel this package
installs. This module does that step for the common case: one JSON object per line with the
document's text under a key, a Hugging Face tokenizer from a local path, one document per
line with an end-of-document (EOD) token after each. The file format is megatron-core's own:
the bytes are written by its `IndexedDatasetBuilder` and read back by its `IndexedDataset`
(the same API in megatron-core 0.16 and 0.19), never by code of ours.

EOD is the tokenizer's ``eos_token`` (from ``tokenizer_config.json``), which is what Megatron's
HuggingFaceTokenizer reports as ``eod``, so GPU runs that mask or reset at EOD agree with the
files. Texts are encoded as Megatron's HuggingFaceTokenizer encodes them, special tokens
included (a tokenizer that adds a BOS puts one at the start of every document).

The tokenizer is read with the small `tokenizers` package from a ``tokenizer.json`` (the
``data`` extra), or with `transformers.AutoTokenizer` where that is installed and the folder
holds another format. Both load from the local path only: nothing is downloaded.

The corpus is read by ``corpus``. The dataset is committed by ``commit``: both files
of a version are built beside the old ones and switched in by one rename, under a lock
that keeps a second run on the same prefix out, so a run that fails, is stopped or killed
leaves the earlier dataset whole; replacing one needs ``--force``.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .corpus import read_jsonl
from .error import DataError
from .commit import DatasetCommit, check_prefix, dataset_commit, existing_dataset

__all__ = ["DataError", "DatasetSummary", "TextTokenizer", "load_tokenizer", "read_jsonl",
           "tokenize_jsonl", "write_dataset"]

ENCODE_CHUNK = 1000  # documents per tokenizer call: batched for speed, bounded for memory


@dataclasses.dataclass(frozen=True)
class TextTokenizer:
    """A local Hugging Face tokenizer, reduced to what writing a dataset needs."""

    path: str
    vocab_size: int  # with added special tokens: the model's vocabulary must hold them all
    eod_id: int
    eod_token: str
    encode_batch: Callable[[list[str]], list[list[int]]]


@dataclasses.dataclass(frozen=True)
class DatasetSummary:
    """What `write_dataset` wrote."""

    prefix: str
    documents: int
    tokens: int  # EOD tokens included
    skipped_empty: int
    tokenizer: TextTokenizer
    dtype: str
    replaced: bool = False  # an earlier dataset was at the prefix (--force)

    def describe(self) -> str:
        skipped = (f"; skipped {self.skipped_empty} empty document(s)"
                   if self.skipped_empty else "")
        verb = "replaced" if self.replaced else "wrote"
        return (f"{verb} {self.prefix}.bin and {self.prefix}.idx: {self.documents:,} documents, "
                f"{self.tokens:,} tokens ({self.dtype}), EOD {self.tokenizer.eod_token!r} = "
                f"{self.tokenizer.eod_id} after each document{skipped}\n"
                f"train on it with  data.data_path: {self.prefix}  and  "
                f"data.tokenizer_model: {self.tokenizer.path}")


# ---------------------------------------------------------------------------- tokenizer

def load_tokenizer(path: str | Path) -> TextTokenizer:
    """The tokenizer at ``path`` (a folder, or its tokenizer.json); DataError says why not."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"tokenizer {path}: no such file or folder")
    folder = path if path.is_dir() else path.parent
    tokenizer_json = path if path.is_file() else path / "tokenizer.json"
    if tokenizer_json.is_file() and _has_module("tokenizers"):
        return _with_tokenizers(path, tokenizer_json, folder)
    if _has_module("transformers"):
        return _with_transformers(path)
    if tokenizer_json.is_file():
        raise DataError(f"tokenizer {path}: reading tokenizer.json needs the `tokenizers` "
                        f"package: pip install -e '.[data]'")
    raise DataError(f"tokenizer {path}: no tokenizer.json there, and reading other formats "
                    f"needs `transformers` (pip install transformers)")


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def eos_token_of(folder: Path) -> str:
    """The eos token the folder's tokenizer_config.json (or special_tokens_map.json) names."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config_file = folder / name
        if not config_file.is_file():
            continue
        try:
            token = json.loads(config_file.read_text()).get("eos_token")
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError) as e:
            raise DataError(f"tokenizer {config_file}: not a JSON object ({e})") from None
        if isinstance(token, dict):  # {"content": "</s>", ...} in newer files
            token = token.get("content")
        if isinstance(token, str) and token:
            return token
    raise DataError(f"tokenizer {folder}: no eos_token in tokenizer_config.json; Megatron's "
                    f"HuggingFaceTokenizer takes the end-of-document token from it")


def _with_tokenizers(path: Path, tokenizer_json: Path, folder: Path) -> TextTokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as e:  # the library raises its own exception types for a bad file
        raise DataError(f"tokenizer {tokenizer_json}: cannot load it ({e})") from None
    eod_token = eos_token_of(folder)
    eod_id = tok.token_to_id(eod_token)
    if eod_id is None:
        raise DataError(f"tokenizer {path}: its eos_token {eod_token!r} is not in the vocabulary")

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in tok.encode_batch(texts)]

    return TextTokenizer(str(path), tok.get_vocab_size(with_added_tokens=True), eod_id,
                         eod_token, encode_batch)


def _with_transformers(path: Path) -> TextTokenizer:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many kinds for a folder it cannot read
        raise DataError(f"tokenizer {path}: AutoTokenizer cannot load it ({e})") from None
    if tok.eos_token_id is None:
        raise DataError(f"tokenizer {path}: no eos_token; Megatron's HuggingFaceTokenizer takes "
                        f"the end-of-document token from it")

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return list(tok(texts)["input_ids"])

    return TextTokenizer(str(path), len(tok), tok.eos_token_id, tok.eos_token, encode_batch)


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


# ---------------------------------------------------------------------------- dataset

def write_dataset(texts: Iterable[str], tokenizer: TextTokenizer, prefix: str, *,
                  force: bool = False, commit: DatasetCommit | None = None) -> DatasetSummary:
    """Tokenize ``texts`` into PREFIX.bin/.idx with megatron-core's IndexedDatasetBuilder.

    One document per text, the tokenizer's EOD after each; texts with no tokens are skipped.
    The files are built as a new version and switched in whole once complete, under the
    prefix's lock (``commit``); an existing dataset needs ``force``. With ``commit``
    the files are built into that (already locked) version, and its owner commits them.
    """
    from ...megatron.environment import megatron_core_problem

    problem = megatron_core_problem("writing Megatron's indexed dataset")
    if problem:
        raise DataError(problem)
    if commit is not None:
        return _build(texts, tokenizer, prefix, commit)
    with dataset_commit(prefix, force) as own:
        summary = _build(texts, tokenizer, prefix, own)
        own.commit()
    return summary


def _build(texts: Iterable[str], tokenizer: TextTokenizer, prefix: str,
           commit: DatasetCommit) -> DatasetSummary:
    import warnings

    import torch

    with warnings.catch_warnings():  # megatron-core warns at import that TE and Apex are absent
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    # uint16 below 65,500 token ids, as Megatron's preprocessing picks it.
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    builder = IndexedDatasetBuilder(str(commit.bin_path), dtype=dtype)
    documents = tokens = skipped = 0
    try:
        for chunk in _chunks(texts, ENCODE_CHUNK):
            for ids in tokenizer.encode_batch(chunk):
                if not ids:
                    skipped += 1
                    continue
                builder.add_item(torch.tensor(ids + [tokenizer.eod_id], dtype=torch.int64))
                builder.end_document()
                documents += 1
                tokens += len(ids) + 1
        if documents == 0:
            raise DataError(f"the corpus for {prefix} has no document with any token")
        builder.finalize(str(commit.idx_path))
    finally:
        builder.data_file.close()  # finalize closes it too; an error must not leave it open
    return DatasetSummary(prefix, documents, tokens, skipped, tokenizer, dtype.__name__,
                          commit.replaced)


def tokenize_jsonl(corpus: str | Path, tokenizer_path: str | Path, prefix: str,
                   key: str = "text", *, force: bool = False,
                   commit: DatasetCommit | None = None) -> DatasetSummary:
    """`megatron-burst data CORPUS --tokenizer T --output-prefix PREFIX [--force]`."""
    check_prefix(prefix)  # before the tokenizer takes its time (checked again under the lock)
    existing_dataset(prefix, force)
    tokenizer = load_tokenizer(tokenizer_path)
    # Read the first line before creating any file, so a wrong key leaves nothing behind.
    texts = read_jsonl(corpus, key)
    first = next(texts, None)
    if first is None:
        raise DataError(f"corpus {corpus}: no documents")
    return write_dataset(itertools.chain([first], texts), tokenizer, prefix, force=force,
                         commit=commit)
