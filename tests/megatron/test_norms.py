"""SequenceParallelTorchNorm and the burst spec's use of it (TP + SP without TE or apex).

The numerical check, TP=2 x CP=2 with sequence parallelism against the CP=1 reference, is in
test_megatron_parallel.py (setup "tp2_cp2_sp"); these tests pin the pieces it relies on.
"""
from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402


def _config(**overrides):
    base = dict(normalization="RMSNorm", sequence_parallel=True,
                layernorm_zero_centered_gamma=False)
    return types.SimpleNamespace(**{**base, **overrides})


def test_norm_tags_its_parameters_for_the_tp_gradient_sum() -> None:
    from megatron_burst.megatron.norms import SequenceParallelTorchNorm

    rms = SequenceParallelTorchNorm(_config(), hidden_size=8, eps=1e-6)
    assert isinstance(rms, torch.nn.RMSNorm) and rms.eps == 1e-6
    assert all(p.sequence_parallel for p in rms.parameters())
    ln = SequenceParallelTorchNorm(_config(normalization="LayerNorm", sequence_parallel=False), 8)
    assert isinstance(ln, torch.nn.LayerNorm)
    assert [p.sequence_parallel for p in ln.parameters()] == [False, False]
    x = torch.randn(3, 8)
    torch.testing.assert_close(rms(x), torch.nn.functional.rms_norm(x, (8,), rms.weight, 1e-6))


@pytest.mark.parametrize("overrides, match", [
    (dict(normalization="L2Norm"), "config.normalization must be one of"),
    (dict(layernorm_zero_centered_gamma=True), "layernorm_zero_centered_gamma"),
])
def test_norm_refuses_what_it_cannot_do(overrides, match) -> None:
    from megatron_burst.megatron.norms import SequenceParallelTorchNorm

    with pytest.raises(ValueError, match=match):
        SequenceParallelTorchNorm(_config(**overrides), hidden_size=8)


def _block_specs(rank: int, world: int) -> dict:
    """The spec's result with and without SP, on a real TP=2 x PP=1 parallel state."""
    from tests.megatron import cpu_llama as cm
    from megatron_burst.megatron.norms import SequenceParallelTorchNorm
    from megatron_burst.megatron.spec import get_llama_layer_burst_spec

    cm.init_parallel(tp=2)
    out = {}
    for sp in (False, True):
        config = cm.tiny_llama_config(cm.TinyLlama(), sequence_parallel=sp)
        spec = get_llama_layer_burst_spec(config, use_te=False)
        layer = spec.layer_specs[0] if sp else spec
        out[sp] = dict(
            kind=type(spec).__name__,
            layers=len(spec.layer_specs) if sp else None,
            final=getattr(spec, "layer_norm", None) is SequenceParallelTorchNorm,
            norms=[getattr(layer.submodules, n) is SequenceParallelTorchNorm
                   for n in ("input_layernorm", "pre_mlp_layernorm")],
            num_layers=config.num_layers)
    return out


def test_spec_with_sequence_parallel_is_a_block_with_sp_norms() -> None:
    out = run_ranks(2, _block_specs, timeout=300)[0]
    assert out[False]["kind"] == "ModuleSpec" and out[False]["norms"] == [True, True]
    sp = out[True]
    assert sp["kind"] == "TransformerBlockSubmodules" and sp["final"]
    assert sp["layers"] == sp["num_layers"] and sp["norms"] == [True, True]
