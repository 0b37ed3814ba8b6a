"""Shared fixtures of the launch tests: the shipped configs and a writer for bad ones."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
TINY = REPO / "configs" / "tiny-llama-cpu.yaml"


@pytest.fixture
def tiny_raw() -> dict:
    """The tiny CPU config as a plain dict, to be broken by a test."""
    return yaml.safe_load(TINY.read_text())


@pytest.fixture
def write_config(tmp_path):
    """Write a dict as a YAML config file and return its path."""
    def write(raw: dict, name: str = "cfg.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw))
        return path
    return write
