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

The two files appear together or not at all (``staging``): a run that fails or is stopped
leaves an earlier dataset at the prefix readable, and replacing one needs ``--force``.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .staging import StagedOutputs, staged_outputs

ENCODE_CHUNK = 1000  # documents per tokenizer call: batched for speed, bounded for memory


class DataError(ValueError):
    """A corpus, tokenizer or argument of `megatron-burst data` that cannot be used."""


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


# ---------------------------------------------------------------------------- corpus

def read_jsonl(path: str | Path, key: str = "text") -> Iterator[str]:
    """The text under ``key`` of each line of a JSONL file (blank lines skipped).

    A line that is not UTF-8 or not JSON, or lacks the key, raises DataError naming the
    file, the line (and column) and the whole reason.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"corpus {path}: no such file")
    # Read bytes and decode per line: a decoding error then knows its line number.
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"corpus {path} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column "
                                f"{e.start + 1}: {e.reason})") from None
            if line.strip():
                yield _text_of_line(line, key, where)


def _json_error(line: str, error: json.JSONDecodeError, where: str) -> DataError:
    """The whole reason json gives, with the column, and what to do about a raw control
    character (json's own message stops at "Invalid control character at")."""
    reason = error.msg.removesuffix(" at")
    if error.msg.startswith("Invalid control character") and error.pos < len(line):
        char = line[error.pos]
        reason += f" {char!r} inside a string (escape it, as \\u{ord(char):04x})"
    return DataError(f"{where} column {error.colno}: not JSON: {reason}")


def _text_of_line(line: str, key: str, where: str) -> str:
    try:
        record: Any = json.loads(line)
    except json.JSONDecodeError as e:
        raise _json_error(line, e, where) from None
    if not isinstance(record, dict) or key not in record:
        raise DataError(f"{where}: no {key!r} key (choose the key with --json-key)")
    if not isinstance(record[key], str):
        raise DataError(f"{where}: {key!r} is a {type(record[key]).__name__}, not text")
    return record[key]


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


# ---------------------------------------------------------------------------- dataset

def check_output_prefix(prefix: str) -> None:
    """Refuse a prefix that already names one of the two files (PREFIX.bin.bin follows)."""
    if prefix.endswith((".bin", ".idx")):
        raise DataError(f"--output-prefix {prefix}: give the prefix without .bin or .idx "
                        f"(it writes PREFIX.bin and PREFIX.idx)")


def dataset_files(prefix: str) -> list[Path]:
    """The two files of the indexed dataset at ``prefix``."""
    return [Path(prefix + ".bin"), Path(prefix + ".idx")]


def refuse_overwrite(outputs: Iterable[Path], force: bool) -> None:
    """Without ``force``, refuse outputs that exist already, naming the first and --force."""
    existing = [p for p in outputs if p.exists() or p.is_symlink()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise DataError(f"{existing[0]} exists{more}; pass --force to replace it")


def write_dataset(texts: Iterable[str], tokenizer: TextTokenizer, prefix: str, *,
                  force: bool = False, stage: StagedOutputs | None = None) -> DatasetSummary:
    """Tokenize ``texts`` into PREFIX.bin/.idx with megatron-core's IndexedDatasetBuilder.

    One document per text, the tokenizer's EOD after each; texts with no tokens are skipped.
    The files are written under temporary names and renamed over PREFIX.bin/.idx only when
    both are complete (``staging``); an existing dataset needs ``force``. With ``stage`` the
    files join that set of outputs, and its owner commits them.
    """
    from ..environment import megatron_core_problem

    problem = megatron_core_problem("writing Megatron's indexed dataset")
    if problem:
        raise DataError(problem)
    check_output_prefix(prefix)
    refuse_overwrite(dataset_files(prefix), force)
    if stage is not None:
        return _build(texts, tokenizer, prefix, stage)
    with staged_outputs() as own:
        summary = _build(texts, tokenizer, prefix, own)
        summary = dataclasses.replace(summary, replaced=bool(own.replaced()))
        own.commit()
    return summary


def _build(texts: Iterable[str], tokenizer: TextTokenizer, prefix: str,
           stage: StagedOutputs) -> DatasetSummary:
    import warnings

    import torch

    with warnings.catch_warnings():  # megatron-core warns at import that TE and Apex are absent
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    bin_final, idx_final = dataset_files(prefix)
    bin_path, idx_path = stage.file(bin_final), stage.file(idx_final)
    # uint16 below 65,500 token ids, as Megatron's preprocessing picks it.
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    builder = IndexedDatasetBuilder(str(bin_path), dtype=dtype)
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
        builder.finalize(str(idx_path))
    finally:
        builder.data_file.close()  # finalize closes it too; an error must not leave it open
    return DatasetSummary(prefix, documents, tokens, skipped, tokenizer, dtype.__name__)


def tokenize_jsonl(corpus: str | Path, tokenizer_path: str | Path, prefix: str,
                   key: str = "text", *, force: bool = False,
                   stage: StagedOutputs | None = None) -> DatasetSummary:
    """`megatron-burst data CORPUS --tokenizer T --output-prefix PREFIX [--force]`."""
    check_output_prefix(prefix)
    refuse_overwrite(dataset_files(prefix), force)  # before the tokenizer takes its time
    tokenizer = load_tokenizer(tokenizer_path)
    # Read the first line before creating any file, so a wrong key leaves nothing behind.
    texts = read_jsonl(corpus, key)
    first = next(texts, None)
    if first is None:
        raise DataError(f"corpus {corpus}: no documents")
    return write_dataset(itertools.chain([first], texts), tokenizer, prefix, force=force,
                         stage=stage)
