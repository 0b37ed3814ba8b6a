"""The CPU run's batches: synthetic bigrams, or windows of real text from an indexed dataset.

Every rank of a run, and every rank of its CP=1 reference run, builds the same global batch
for iteration ``it`` and keeps its own data-parallel rows, so the batches depend only on the
config and ``it``: that is what lets the reference run see exactly what the CP run saw.

- ``data.mock: true``: token sequences from a fixed random bigram table in which every token
  has four possible successors, so the loss falls from ln(vocab) towards ln(4).
- Otherwise ``data.data_path`` names a Megatron indexed dataset (PREFIX.bin/.idx, e.g. from
  `megatron-burst data`), read with megatron-core's own `IndexedDataset`. Its documents, each
  ending in EOD, are read as one stream of tokens, cut into windows of seq_length + 1 tokens
  (inputs and the labels one token on), and the windows are visited in a seeded random order,
  a new order on each pass. Megatron's GPTDataset does the same in spirit (it also shuffles
  documents and caches its indices on disk, which a few-second CPU run does not need).
  The CPU run does not evaluate, so it trains on every document and ignores ``data.split``.

The checks that need no megatron-core import (paths, tokenizer, vocabulary) run in the parent
before any rank starts (``check_text_config``); those that read the dataset run where it is
opened (``TextWindows.open``), in every rank and in `run --dry-run`.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ..launch.config.schema import Config, ConfigError, expand_vars

SUCCESSORS = 4  # bigram fan-out of the synthetic data: the loss floor is ln(4)


class BatchSource(Protocol):
    """Where a CPU run's global batches come from."""

    def batch(self, it: int) -> dict[str, torch.Tensor]:
        """The global batch of iteration ``it``: tokens, labels, loss_mask, position_ids."""

    def describe(self) -> str:
        """One line for the run's log."""


def _batch_from_sequences(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs, labels (one token on) and masks from [batch, seq_length + 1] tokens."""
    rows, seq = tokens.shape[0], tokens.shape[1] - 1
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "loss_mask": torch.ones(rows, seq),
        "position_ids": torch.arange(seq).expand(rows, -1).contiguous(),
    }


def synthetic_batch(cfg: Config, it: int) -> dict[str, torch.Tensor]:
    """The global batch of iteration ``it`` of the synthetic bigram data."""
    m, tr = cfg.model, cfg.training
    table_gen = torch.Generator().manual_seed(tr.seed)
    successors = torch.randint(0, m.vocab_size, (m.vocab_size, SUCCESSORS), generator=table_gen)
    gen = torch.Generator().manual_seed(tr.seed * 1000003 + it)
    tokens = torch.empty(tr.global_batch_size, m.seq_length + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, m.vocab_size, (tr.global_batch_size,), generator=gen)
    choice = torch.randint(0, SUCCESSORS, tokens.shape, generator=gen)
    for i in range(m.seq_length):
        tokens[:, i + 1] = successors[tokens[:, i], choice[:, i]]
    return _batch_from_sequences(tokens)


class SyntheticBigrams:
    """``data.mock: true``: the synthetic bigram batches."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def batch(self, it: int) -> dict[str, torch.Tensor]:
        return synthetic_batch(self.cfg, it)

    def describe(self) -> str:
        return (f"synthetic bigrams, {SUCCESSORS} successors per token, a fresh batch each "
                f"iteration")


# ---------------------------------------------------------------------------- real text

def text_prefix(cfg: Config) -> str:
    """``data.data_path`` with its variables expanded: one dataset prefix (no blend)."""
    prefix = expand_vars(cfg.data.data_path or "", "data.data_path")
    if len(prefix.split()) != 1:
        raise ConfigError(f"'data.data_path' is {prefix!r}: the CPU run reads one dataset "
                          f"prefix, not a blend of weighted prefixes")
    return prefix


def load_text_tokenizer(cfg: Config) -> Any:
    """The run's tokenizer (a data.TextTokenizer); errors name data.tokenizer_model."""
    from ..launch.data.dataset import DataError, load_tokenizer

    d = cfg.data
    if d.tokenizer_type != "HuggingFaceTokenizer":
        raise ConfigError(f"'data.tokenizer_type' is {d.tokenizer_type}: the CPU run on text "
                          f"reads a HuggingFaceTokenizer folder")
    path = expand_vars(d.tokenizer_model or "", "data.tokenizer_model")
    try:
        return load_tokenizer(path)
    except DataError as e:
        raise ConfigError(f"'data.tokenizer_model': {e}") from None


def check_text_config(cfg: Config) -> Any:
    """What can be checked without megatron-core: the files exist, the tokenizer loads and
    fits the model's vocabulary. Returns the tokenizer."""
    prefix = text_prefix(cfg)
    missing = [p for p in (prefix + ".bin", prefix + ".idx") if not Path(p).is_file()]
    if missing:
        raise ConfigError(f"'data.data_path': no {missing[0]}; write the dataset with "
                          f"`megatron-burst data CORPUS.jsonl --tokenizer DIR --output-prefix "
                          f"{prefix}` (or `megatron-burst data --sample-corpus DIR` for the "
                          f"offline sample)")
    tokenizer = load_text_tokenizer(cfg)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"'model.vocab_size' is {cfg.model.vocab_size}, fewer than the "
                          f"{tokenizer.vocab_size} tokens of {tokenizer.path}")
    return tokenizer


class TextWindows:
    """Windows of seq_length + 1 tokens of an indexed dataset, in a seeded order per pass."""

    def __init__(self, cfg: Config, dataset: Any, eod_id: int):
        self.cfg = cfg
        self.dataset = dataset
        self.eod_id = eod_id
        self.lengths = np.asarray(dataset.sequence_lengths, dtype=np.int64)
        # starts[i]: where sequence i begins in the stream of all tokens; starts[-1]: the total.
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])
        self.seq_length = cfg.model.seq_length
        self.windows = int((self.starts[-1] - 1) // self.seq_length)
        self._order_of: tuple[int, torch.Tensor] | None = None

    @classmethod
    def open(cls, cfg: Config) -> "TextWindows":
        """Open ``data.data_path`` with megatron-core's reader and check it against the
        tokenizer and the sequence length (ConfigError naming the key)."""
        tokenizer = check_text_config(cfg)
        with warnings.catch_warnings():  # megatron-core warns that TE and Apex are absent
            warnings.simplefilter("ignore", UserWarning)
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        source = cls(cfg, IndexedDataset(text_prefix(cfg)), tokenizer.eod_id)
        source.check()
        return source

    @property
    def tokens(self) -> int:
        return int(self.starts[-1])

    @property
    def documents(self) -> int:
        return len(self.dataset.document_indices) - 1

    def check(self) -> None:
        """Enough tokens for one window; documents end in the tokenizer's EOD."""
        if self.windows < 1:
            raise ConfigError(f"'data.data_path': {self.dataset.path_prefix} holds "
                              f"{self.tokens} tokens, fewer than model.seq_length + 1 = "
                              f"{self.seq_length + 1}")
        last_of_first_document = int(self.dataset.document_indices[1]) - 1
        last = int(self.dataset.get(last_of_first_document,
                                    offset=int(self.lengths[last_of_first_document]) - 1)[0])
        if last != self.eod_id:
            raise ConfigError(f"'data.tokenizer_model': its EOD is token {self.eod_id}, but the "
                              f"first document of {self.dataset.path_prefix} ends in {last}: "
                              f"the dataset was written with another tokenizer")

    def describe(self) -> str:
        return (f"{self.documents:,} documents, {self.tokens:,} tokens: {self.windows:,} "
                f"windows of {self.seq_length + 1} tokens, in a new random order each pass")

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens of the stream from ``start``, across sequence boundaries."""
        pieces = []
        index = int(np.searchsorted(self.starts, start, side="right")) - 1
        while count > 0:
            offset = start - int(self.starts[index])
            length = min(count, int(self.lengths[index]) - offset)
            pieces.append(self.dataset.get(index, offset=offset, length=length))
            start, count, index = start + length, count - length, index + 1
        return np.concatenate(pieces)

    def _order(self, epoch: int) -> torch.Tensor:
        """The window order of pass ``epoch`` (kept for the pass in progress)."""
        if self._order_of is None or self._order_of[0] != epoch:
            gen = torch.Generator().manual_seed(self.cfg.training.seed * 1000003 + epoch)
            self._order_of = (epoch, torch.randperm(self.windows, generator=gen))
        return self._order_of[1]

    def batch(self, it: int) -> dict[str, torch.Tensor]:
        rows = self.cfg.training.global_batch_size
        sequences = []
        for sample in range(it * rows, (it + 1) * rows):
            epoch, position = divmod(sample, self.windows)
            window = int(self._order(epoch)[position])
            sequences.append(self.read(window * self.seq_length, self.seq_length + 1))
        return _batch_from_sequences(torch.from_numpy(np.stack(sequences).astype(np.int64)))


def open_batch_source(cfg: Config) -> BatchSource:
    """The run's batches: synthetic for ``data.mock``, else windows of the indexed dataset."""
    return SyntheticBigrams(cfg) if cfg.data.mock else TextWindows.open(cfg)


def describe_data(cfg: Config, tokenizer: Any | None) -> str:
    """One phrase for the run's header: which data, and where the loss starts and ends."""
    if cfg.data.mock:
        return (f"synthetic bigram data (loss floor ln {SUCCESSORS} = "
                f"{math.log(SUCCESSORS):.3f})")
    return (f"text from {text_prefix(cfg)}, tokenizer {tokenizer.path} ({tokenizer.vocab_size} "
            f"tokens, EOD {tokenizer.eod_id}; an untrained model's loss is about "
            f"ln {tokenizer.vocab_size} = {math.log(tokenizer.vocab_size):.2f})")
