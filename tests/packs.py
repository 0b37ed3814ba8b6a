"""Random packs of documents, of the kinds that stress the planning of the whole_docs layout."""
from __future__ import annotations

import random


def random_pack(rng: random.Random, total: int, kind: str) -> tuple[int, ...]:
    """Document lengths summing to ``total``, of a kind: tiny (with empty ones), one huge
    document among tiny ones, a mix, or lengths near a rank's share."""
    lens: list[int] = []
    if kind == "huge":
        lens.append(rng.randint(total // 3, total - 1))
    held = sum(lens)
    while held < total:
        if kind in ("tiny", "huge"):
            lens.append(rng.choice([0, rng.randint(1, 9), rng.randint(1, 40)]))
        elif kind == "mix":
            lens.append(rng.choice([rng.randint(0, 12), rng.randint(20, total // 3)]))
        else:
            lens.append(rng.randint(total // 8, total // 2))
        held += lens[-1]
    lens[-1] -= held - total
    rng.shuffle(lens)
    return tuple(lens)
