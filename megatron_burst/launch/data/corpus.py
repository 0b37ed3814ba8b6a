"""Reading the corpus of `megatron-burst data`: one JSON object per line, the text under a key.

Every line that cannot become a document is refused with a DataError naming the file, the
line, the column where one is known, and the whole reason: bytes that are not UTF-8, a line
that is not JSON (json's own message, completed where it stops short), a missing key, a
value that is not text, and a lone UTF-16 surrogate (a ``\\ud800`` escape with no partner,
which decodes to no character: no UTF-8 text holds it and tokenizers refuse it).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from .error import DataError


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
    _refuse_lone_surrogate(line, record[key], key, where)
    return record[key]


def _refuse_lone_surrogate(line: str, text: str, key: str, where: str) -> None:
    """A JSON escape such as \\ud800 with no partner decodes to a lone UTF-16 surrogate,
    which is no character: no UTF-8 text holds it and tokenizers refuse it (TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        column = _lone_surrogate_column(line)
        at = f" column {column}" if column else ""
        code = f"U+{ord(text[e.start]):04X}"
        raise DataError(f"{where}{at}: {key!r} holds a lone surrogate ({code}, half of a "
                        f"UTF-16 pair written as a \\u escape); write the character itself, "
                        f"or both escapes of its pair") from None


_SURROGATE_ESCAPE = re.compile(r"\\u([dD][89a-fA-F][0-9a-fA-F]{2})")


def _lone_surrogate_column(line: str) -> int | None:
    """The 1-based column of the first \\uD800-\\uDFFF escape in ``line`` that is not half
    of a high-low pair (escaped backslashes skipped), or None."""
    position, pending = 0, None  # pending: (column, end) of a high surrogate awaiting its low
    while (backslash := line.find("\\", position)) >= 0:
        match = _SURROGATE_ESCAPE.match(line, backslash)
        if match is None:  # another escape (an escaped backslash too): skip it whole
            if pending:
                return pending[0]
            position = backslash + 2
            continue
        high = int(match.group(1), 16) < 0xDC00
        if pending and (high or backslash != pending[1]):
            return pending[0]
        if pending:  # the low half right after its high half: a valid pair
            pending = None
        elif high:
            pending = (backslash + 1, match.end())
        else:
            return backslash + 1
        position = match.end()
    return pending[0] if pending else None
