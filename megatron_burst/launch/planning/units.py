"""How the plan writes sizes and counts: one unit family, and counts in words.

`megatron-burst plan` reports memory and ring traffic side by side, and the two used to come
in different units (GiB for memory, decimal MB for traffic), so the same 64 MiB hop read as
"67.11 MB" in one line and "64.0 MiB" in the next. Every size is binary here (KiB, MiB, GiB:
powers of 1024); link rates stay in GB/s (10^9 bytes per second), as vendors quote them, and
the plan says so. Parameter counts are written in words ("1.2 million"), because "0.00 B"
read as zero bytes.
"""
from __future__ import annotations

BINARY_UNITS = (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))
UNITS_NOTE = ("sizes in binary units (1 MiB = 2^20 bytes, 1 GiB = 2^30 bytes); "
              "link rates in GB/s (10^9 bytes per second)")


def format_bytes(n: float, width: int = 0) -> str:
    """``n`` bytes in the largest binary unit it fills, two decimals ("64.00 MiB")."""
    for unit, size in BINARY_UNITS:
        if n >= size:
            return f"{n / size:{width}.2f} {unit}"
    return f"{n:{width}.0f} B"


def format_count(n: int) -> str:
    """A count in words: "8.03 billion", "111.9 thousand", "1.20 million"."""
    for word, size in (("billion", 1e9), ("million", 1e6), ("thousand", 1e3)):
        if n >= size:
            return f"{n / size:.{2 if n < 100 * size else 1}f} {word}"
    return str(n)
