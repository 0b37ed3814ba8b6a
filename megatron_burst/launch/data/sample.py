"""`megatron-burst data --sample-corpus DIR`: real text and a real tokenizer, made offline.

The real-text path (`megatron-burst data`, then a CPU or GPU run on the result) needs a corpus
and a tokenizer, and neither may come from the network at run time. Real English that every
Python installation carries is the documentation of its standard library, so the sample is
the docstrings of a fixed list of standard modules (their classes, functions and methods),
in a fixed order: the same files on every machine with the same Python version. About 700
documents, 0.4 MB of text.

On it a small byte-level BPE tokenizer is trained with the `tokenizers` package (1024 tokens
by default, so a tiny model's embedding stays small and its loss falls within seconds) and
saved as a Hugging Face tokenizer folder: ``tokenizer.json`` plus ``tokenizer_config.json``
naming ``<|endoftext|>`` as eos, which Megatron's HuggingFaceTokenizer (through
transformers' AutoTokenizer) reads as the end-of-document token. Finally the corpus goes
through the same `megatron-burst data` step a user's corpus takes.

    DIR/corpus.jsonl                     one {"text": ...} per docstring
    DIR/tokenizer/                       tokenizer.json, tokenizer_config.json
    DIR/text_document.bin, .idx          Megatron's indexed dataset
    DIR/sample.json                      what binds them: each part's SHA-256

The three parts are switched in by three renames (corpus, tokenizer, then the dataset), and
a kill between them would leave a new tokenizer beside the old dataset. So the sample is
one unit through ``sample.json``: it is removed before the first rename and written (by a
rename of its own) after the last, naming each part's SHA-256 and the vocabulary. A sample
is complete only when ``sample.json`` is there and every part still has the bytes it names
(``existing_sample``: what `--keep-existing` keeps); anything else is remade with --force.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from .dataset import DataError, DatasetSummary, tokenize_jsonl
from .commit import dataset_commit, existing_dataset
from .lock import step
from .staging import check_replaceable, staged_outputs

# Present on CPython 3.11 to 3.13 alike, pure Python or always built (no sqlite3, tkinter).
SAMPLE_MODULES = (
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal",
    "difflib", "email", "enum", "fractions", "functools", "gettext", "glob", "gzip",
    "hashlib", "heapq", "hmac", "html", "http.client", "imaplib", "inspect", "io",
    "ipaddress", "json", "locale", "logging", "mailbox", "mimetypes", "optparse", "os",
    "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets", "selectors",
    "shlex", "shutil", "signal", "smtplib", "socket", "statistics", "string", "struct",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize",
    "traceback", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings",
    "weakref", "xml.dom.minidom", "zipfile", "zoneinfo",
)
MIN_DOCUMENT_CHARS = 200  # one-line docstrings ("Return self.") teach a model little
EOD_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 1024
CORPUS_FILE = "corpus.jsonl"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # what save_hf_tokenizer writes
DATASET_PREFIX = "text_document"
MANIFEST_FILE = "sample.json"


@dataclasses.dataclass(frozen=True)
class SampleSummary:
    """What `write_sample` made."""

    corpus: Path
    characters: int
    dataset: DatasetSummary

    def describe(self) -> str:
        tokenizer = self.dataset.tokenizer
        return (f"wrote {self.corpus}: {self.dataset.documents:,} standard-library docstrings, "
                f"{self.characters:,} characters\n"
                f"wrote {tokenizer.path}: a byte-level BPE of {tokenizer.vocab_size} tokens, "
                f"eos {tokenizer.eod_token!r}\n{self.dataset.describe()}")


def _public_docstrings(module: ModuleType) -> Iterator[str]:
    """The module's docstring, then its own public classes' and functions' (and methods')."""
    yield inspect.getdoc(module) or ""
    for name in sorted(vars(module)):
        obj = getattr(module, name)
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue  # private, or imported from elsewhere (documented there)
        if inspect.isfunction(obj):
            yield inspect.getdoc(obj) or ""
        elif inspect.isclass(obj):
            yield inspect.getdoc(obj) or ""
            for method_name, method in sorted(vars(obj).items()):
                if not method_name.startswith("_") and inspect.isfunction(method):
                    yield inspect.getdoc(method) or ""


def stdlib_docstrings(modules: tuple[str, ...] = SAMPLE_MODULES) -> list[str]:
    """Distinct docstrings of at least MIN_DOCUMENT_CHARS, in module order."""
    seen: set[str] = set()
    documents: list[str] = []
    for module_name in modules:
        # Some modules warn about their own deprecated parts when imported or looked into.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # a Python built without it: the sample is a little smaller
                continue
            texts = list(_public_docstrings(module))
        for text in texts:
            if len(text) >= MIN_DOCUMENT_CHARS and text not in seen:
                seen.add(text)
                documents.append(text)
    return documents


def write_corpus(texts: list[str], path: Path) -> None:
    """One {"text": ...} JSON object per line: the format `megatron-burst data` reads."""
    with path.open("w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}) + "\n")


def train_bpe(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` of ``vocab_size`` tokens, EOD token id 0."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise DataError("--sample-corpus trains a tokenizer with the `tokenizers` package: "
                        "pip install -e '.[data]'") from None
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    # The 256 byte symbols come first, so any text encodes (no unknown token is needed).
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_hf_tokenizer(tokenizer: Any, folder: Path) -> None:
    """Fill ``folder`` so that transformers' AutoTokenizer (and so Megatron) loads it, offline."""
    tokenizer.save(str(folder / TOKENIZER_FILES[0]))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # GPT-2's convention: one special token begins and ends documents.
        "bos_token": EOD_TOKEN,
        "eos_token": EOD_TOKEN,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (folder / TOKENIZER_FILES[1]).write_text(json.dumps(config, indent=2) + "\n")


def _parts(out_dir: Path) -> dict[str, Path]:
    """The sample's parts by their names in ``sample.json`` (the dataset's links followed)."""
    tokenizer = out_dir / TOKENIZER_DIR
    prefix = out_dir / DATASET_PREFIX
    return {CORPUS_FILE: out_dir / CORPUS_FILE,
            **{f"{TOKENIZER_DIR}/{name}": tokenizer / name for name in TOKENIZER_FILES},
            f"{DATASET_PREFIX}.bin": Path(f"{prefix}.bin"),
            f"{DATASET_PREFIX}.idx": Path(f"{prefix}.idx")}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(out_dir: Path, vocab: int) -> None:
    """``sample.json`` naming every part's SHA-256: written aside, renamed in (the switch)."""
    manifest = {"vocab_size": vocab,
                "parts": {name: _sha256(path) for name, path in _parts(out_dir).items()}}
    temporary = out_dir / f".{MANIFEST_FILE}.partial"
    temporary.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(temporary, out_dir / MANIFEST_FILE)


def existing_sample(out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE) -> str | None:
    """One line describing the complete sample under ``out_dir`` (module docstring: its
    ``sample.json`` there and every part with the bytes it names), or None if there is no
    sample. DataError if one is there with another vocabulary size, or if its parts do not
    belong together (a run killed while switching them in): ``--force`` remakes it."""
    out_dir = Path(out_dir)
    parts = _parts(out_dir)
    manifest_path = out_dir / MANIFEST_FILE
    if not manifest_path.is_file():
        if any(p.exists() for p in parts.values()):
            raise DataError(f"{out_dir}: the sample's parts are there without its "
                            f"{MANIFEST_FILE} (a run stopped while switching them in, or an "
                            f"older version made them); pass --force to make it again")
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        named, vocab = manifest["parts"], manifest["vocab_size"]
        changed = [name for name, path in parts.items()
                   if not path.is_file() or _sha256(path) != named[name]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{manifest_path}: not a manifest this command wrote ({e}); pass "
                        f"--force to make the sample again") from None
    if changed:
        raise DataError(f"{out_dir}: {', '.join(changed)} not the one{'s' * (len(changed) > 1)} "
                        f"{MANIFEST_FILE} names (the parts do not belong together); pass "
                        f"--force to make the sample again")
    if vocab != vocab_size:
        raise DataError(f"{out_dir} holds a sample with a {vocab}-token vocabulary, not "
                        f"{vocab_size}; pass --force to make it again")
    return (f"kept {out_dir}: the sample there is complete ({CORPUS_FILE}, {TOKENIZER_DIR}/ of "
            f"{vocab} tokens, {DATASET_PREFIX}.bin/.idx, as {MANIFEST_FILE} names them); "
            f"--force makes it again")


def write_sample(out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE, *,
                 force: bool = False) -> SampleSummary:
    """Corpus, tokenizer and indexed dataset under ``out_dir`` (see the module docstring).

    ``out_dir`` is made if missing (it is this command's output). Each output is written
    under a temporary name and put in place once the dataset is complete: the corpus and the
    tokenizer by a rename each, then the dataset by its switch (``commit``); outputs
    that exist already need ``force``, and none of the user's files is ever deleted.
    """
    if vocab_size < 257:
        raise DataError(f"--vocab-size {vocab_size}: a byte-level BPE needs the 256 bytes "
                        f"and the EOD token, so at least 257")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--sample-corpus {out_dir}: exists and is not a folder")
    prefix = str(out_dir / DATASET_PREFIX)
    corpus, tokenizer_dir = out_dir / CORPUS_FILE, out_dir / TOKENIZER_DIR
    _check_outputs(corpus, tokenizer_dir, prefix, force)
    texts = stdlib_docstrings()
    with staged_outputs() as stage:
        staged_corpus = stage.file(corpus)  # makes out_dir if it is missing
        with dataset_commit(prefix, force) as commit:
            write_corpus(texts, staged_corpus)
            staged_tokenizer = stage.folder(tokenizer_dir, TOKENIZER_FILES)
            save_hf_tokenizer(train_bpe(texts, vocab_size), staged_tokenizer)
            dataset = tokenize_jsonl(staged_corpus, staged_tokenizer, prefix, force=True,
                                     commit=commit)
            replaced = bool(stage.replaced()) or commit.replaced
            (out_dir / MANIFEST_FILE).unlink(missing_ok=True)  # incomplete from here on
            stage.commit()
            step("sample-staged")
            commit.commit()  # then the dataset, which is what a run reads
        _write_manifest(out_dir, vocab_size)  # the switch: the parts belong together
    # The summary names the final paths, not the staged ones it was written through.
    tokenizer = dataclasses.replace(dataset.tokenizer, path=str(tokenizer_dir))
    dataset = dataclasses.replace(dataset, tokenizer=tokenizer, replaced=replaced)
    return SampleSummary(corpus, sum(map(len, texts)), dataset)


def _check_outputs(corpus: Path, tokenizer_dir: Path, prefix: str, force: bool) -> None:
    """Refuse, before any work, outputs that exist (without ``force``) or cannot be replaced."""
    try:
        check_replaceable(corpus, force)
        check_replaceable(tokenizer_dir, force, TOKENIZER_FILES)
    except ValueError as e:
        raise DataError(str(e)) from None
    if corpus.parent.is_dir():
        existing_dataset(prefix, force)
