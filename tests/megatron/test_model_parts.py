"""This package's entry point builds each model chunk of an interleaved pipeline as itself.

Megatron builds one chunk per virtual pipeline stage and passes ``vp_stage``; the entry point
dropped it (megatron-core 0.19 then asserts while building the layers). It now reaches both
the spec function and GPTModel, as Megatron-LM's own builder passes it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

from megatron.core.models.gpt import GPTModel  # noqa: E402

from megatron_burst.megatron import model_parts  # noqa: E402
from megatron_burst.megatron import spec as burst_spec  # noqa: E402


class _Run:
    """A run whose bound spec records what it is called with."""

    def __init__(self, uses_burst: bool) -> None:
        self.uses_burst = uses_burst
        self.calls: list = []

    def bind_spec(self, spec):
        assert spec is None  # no --spec: the burst spec, bound
        return lambda config, vp_stage: self.calls.append((config, vp_stage)) or "bound"


@pytest.mark.parametrize("vp_stage", [None, 0, 3])
def test_the_spec_function_gets_the_chunk_s_virtual_stage(vp_stage, monkeypatch) -> None:
    run = _Run(uses_burst=True)
    config = object()
    assert model_parts.layer_spec(SimpleNamespace(spec=None), config, run, vp_stage) == "bound"
    assert run.calls == [(config, vp_stage)]
    seen = []  # a run without BurstAttention: the burst spec, unbound, gets it too
    monkeypatch.setattr(burst_spec, "get_gpt_layer_burst_spec",
                        lambda config, vp_stage: seen.append(vp_stage) or "plain")
    plain = model_parts.layer_spec(SimpleNamespace(spec=None), config, _Run(False), vp_stage)
    assert (plain, seen) == ("plain", [vp_stage])


def test_gpt_model_gets_the_chunk_s_virtual_stage() -> None:
    assert model_parts.virtual_stage(GPTModel, 2) == {"vp_stage": 2}

    class Old:  # a megatron-core whose GPTModel takes no vp_stage
        def __init__(self, config) -> None:
            pass

    assert model_parts.virtual_stage(Old, None) == {} and model_parts.virtual_stage(Old, 0) == {}
    with pytest.raises(ValueError, match="vp_stage"):
        model_parts.virtual_stage(Old, 1)
