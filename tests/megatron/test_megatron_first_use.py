"""'auto' in a Megatron run decides from this machine's measured profile (issue 41).

On two gloo ranks with CP=2, measuring on and an empty cache: the run's configure-time
lookup finds nothing and leaves the topology to the layers; the first layer's first call
measures the machine once, on both ranks, caches the profile, and decides from it (the
decision ``resolve`` makes from that profile, never from the shipped one); a second layer
measures nothing; and a later run's configure-time lookup finds the cached profile. With
measuring off, or a profile named, nothing is measured.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.patching import swap  # noqa: E402
from tests.megatron import harness  # noqa: E402


def _settings(**env: str) -> None:
    from megatron_burst.comm import settings

    os.environ.pop("MEGATRON_BURST_PROFILE", None)
    os.environ.update(env)
    settings.reload()


def _first_calls(rank: int, world: int, cache: str, measure: str) -> dict:
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_burst.attention import first_use
    from megatron_burst.decide.options import resolve
    from megatron_burst.megatron import machine_profile
    from megatron_burst.megatron.attention import BurstDotProductAttention
    from tests.megatron import cpu_llama as cm

    _settings(MEGATRON_BURST_AUTO_MEASURE=measure, MEGATRON_BURST_PROFILE_CACHE=cache)
    first_use._KNOWN.clear()
    measured = []
    real = first_use._measure
    swap(first_use, "_measure", lambda *a, **k: measured.append(1) or real(*a, **k))
    cm.init_parallel(cp=2)
    config = cm.tiny_llama_config(harness.SHAPE)
    layers = [BurstDotProductAttention(config, n, AttnMaskType.causal,
                                       burst_options={"backward": "auto"}) for n in (1, 2)]
    options = layers[0].options
    before = machine_profile.cached_profile(options, 2, 1)
    gen = torch.Generator().manual_seed(rank)
    qkv = [torch.randn(8, 1, heads, 16, generator=gen) for heads in (4, 2, 2)]
    outs = [layer(*qkv, None) for layer in layers]
    after = machine_profile.cached_profile(options, 2, 1)
    prof = first_use._KNOWN and next(iter(first_use._KNOWN.values()))
    expected = resolve(options, cp=2, heads=layers[0].heads, tokens=8,
                       max_intra_node_size=None, machine=prof or None)
    return dict(before=before if isinstance(before, str) else getattr(before, "name", None),
                after=after if isinstance(after, str) else getattr(after, "name", None),
                measured=len(measured), profile=getattr(prof, "name", None),
                topologies=[layer.topology for layer in layers], expected=expected,
                finite=all(bool(torch.isfinite(o).all()) for o in outs))


def test_the_first_layer_call_measures_this_machine_and_every_layer_decides_from_it(tmp_path):
    results = run_ranks(2, _first_calls, str(tmp_path), "on", timeout=300)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, files  # measured once, cached once
    for r in results:
        assert r["before"] == "measure at the first call", r
        assert r["measured"] == 1 and r["profile"].startswith("measured-"), r
        assert r["after"] == r["profile"], r  # a later run decides at configure time
        assert r["topologies"] == [r["expected"]] * 2, r
        assert r["finite"], r
    assert results[0]["topologies"] == results[1]["topologies"]


def test_with_measuring_off_the_layers_measure_nothing(tmp_path):
    for r in run_ranks(2, _first_calls, str(tmp_path), "off", timeout=300):
        assert r["before"] is None and r["after"] is None, r
        assert r["measured"] == 0 and r["profile"] is None, r
        assert r["topologies"] == [r["expected"]] * 2, r
    assert not list(tmp_path.glob("*.json"))
