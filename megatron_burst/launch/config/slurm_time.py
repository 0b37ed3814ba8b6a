"""SLURM time limits read exactly as `sbatch --time` reads them, and written back.

sbatch takes "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
"days-hours:minutes" and "days-hours:minutes:seconds" (slurm's ``time_str2secs``). A lone
number is minutes and two fields are minutes:seconds, so ``30:00`` is 30 minutes, not 30
hours, and ``2-12`` is 2 days 12 hours. Fields are not range-checked (``0:90:00`` is 90
minutes). Seconds round up to the next minute (``time_str2mins``). ``UNLIMITED``,
``INFINITE`` (any case) and ``-1`` mean no limit, and so does a limit of zero
(``0``, ``00:00:00``): sbatch turns a zero limit into INFINITE. A limit beyond the 32-bit
minutes SLURM holds is refused (``99999999999999999999``).
"""
from __future__ import annotations

import re

# What ``parse_time_limit`` returns for "no limit" (sbatch's INFINITE).
UNLIMITED = None
_NO_LIMIT_WORDS = ("UNLIMITED", "INFINITE", "-1")
_WITH_DAYS = re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?")
_WITHOUT_DAYS = re.compile(r"(\d+)(?::(\d+))?(?::(\d+))?")
# SLURM holds a limit as 32-bit minutes, the top two values meaning "not set" and INFINITE.
MOST_MINUTES = 2**32 - 3
FORMATS = ("minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, "
           "days-hours:minutes:seconds, or 0/UNLIMITED/INFINITE for none")


def parse_time_limit(text: str, what: str = "--time") -> int | None:
    """Minutes of the SLURM time limit ``text`` (seconds rounded up), or None for no limit.

    Raises ValueError naming ``what`` if sbatch would refuse ``text``.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} {text!r}: expected a SLURM time limit ({FORMATS})")
    word = text  # no stripping: sbatch refuses a limit with trailing spaces
    if word.upper() in _NO_LIMIT_WORDS:
        return UNLIMITED
    seconds = _seconds(word)
    if seconds is None:
        raise ValueError(f"{what} {text!r} is not a SLURM time limit: use {FORMATS}, "
                         f"e.g. 30 (30 minutes), 04:00:00 or 1-00:00:00")
    minutes = (seconds + 59) // 60
    if minutes > MOST_MINUTES:
        raise ValueError(f"{what} {text!r} is {minutes:,} minutes, more than SLURM can hold "
                         f"(at most {MOST_MINUTES:,}); give a limit the partition takes, "
                         f"e.g. 1-00:00:00")
    return UNLIMITED if minutes == 0 else minutes


def _seconds(word: str) -> int | None:
    """Seconds of a days-hours[:minutes[:seconds]] or [hours:]minutes[:seconds] limit."""
    m = _WITH_DAYS.fullmatch(word)
    if m:
        days, hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    m = _WITHOUT_DAYS.fullmatch(word)
    if not m:
        return None
    fields = [int(x) for x in m.groups() if x is not None]
    if len(fields) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = fields
    elif len(fields) == 2:  # minutes:seconds
        hours, (minutes, seconds) = 0, fields
    else:  # minutes
        hours, minutes, seconds = 0, fields[0], 0
    return (hours * 60 + minutes) * 60 + seconds


def format_time_limit(minutes: int | None) -> str:
    """``minutes`` as sbatch writes a limit: 'D-HH:MM:SS', 'HH:MM:SS', or 'UNLIMITED'."""
    if minutes is UNLIMITED:
        return "UNLIMITED"
    if minutes < 1:
        raise ValueError(f"a time limit must be at least one minute, got {minutes}")
    days, rest = divmod(minutes, 1440)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock
