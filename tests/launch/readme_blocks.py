"""The README's marked command blocks, read by CI's own parser (.ci/readme_block.py), so the
tests and CI read the README the same way."""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("readme_block", REPO / ".ci" / "readme_block.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.readme_block


readme_block = _load()
