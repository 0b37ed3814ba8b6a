"""The one error type of `megatron-burst data`, shared by its modules (corpus, tokenizer,
dataset commit, lock), so that a caller catches one type and the CLI prints it in one line."""
from __future__ import annotations


class DataError(ValueError):
    """A corpus, tokenizer, output or argument of `megatron-burst data` that cannot be used."""
