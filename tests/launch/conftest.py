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


@pytest.fixture
def warm_cpu_ranks(monkeypatch):
    """The CPU run's ranks forked from a warm forkserver instead of spawned (see
    tests/launch/warm_ranks.py): for the tests of what a CPU job computes."""
    from megatron_burst.tools import cpu_run

    from .warm_ranks import WarmStart

    monkeypatch.setattr(cpu_run, "mp", WarmStart())
