"""What this package's entry point hands GPTModel for one model chunk: the layer spec with
the run's BurstAttention topology bound in, and the chunk's virtual pipeline stage.

Why a module of its own: with an interleaved pipeline (``--num-layers-per-virtual-pipeline-
stage``) Megatron builds one model chunk per virtual stage and says which with ``vp_stage``:
which layers the chunk holds and their numbers follow from it (megatron-core 0.19 asserts
when it is missing, so this entry point could not train such a pipeline). Megatron-LM's own
builder passes it to the spec function and to GPTModel, and so does this entry point. Kept
apart from ``pretrain_gpt`` (which needs ``megatron.training``) so that it is tested where
only megatron-core imports.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Optional

from megatron_burst.megatron import spec as burst_spec


def layer_spec(args: Any, config: Any, run: Any, vp_stage: Optional[int]) -> Any:
    """The layer spec for virtual pipeline stage ``vp_stage``: ``--spec`` or the burst spec,
    with the run's topology bound in (`burst_run.BurstRun.bind_spec`); a spec function is
    called with the config and ``vp_stage``, as megatron-core 0.17+ calls one."""
    spec = None
    if args.spec is not None:
        from megatron.core.transformer.spec_utils import import_module

        spec = import_module(args.spec)
    if run.uses_burst:
        spec = run.bind_spec(spec)
    elif spec is None:
        spec = burst_spec.get_gpt_layer_burst_spec
    return spec(config, vp_stage) if callable(spec) and not isinstance(spec, type) else spec


def virtual_stage(model_class: Any, vp_stage: Optional[int]) -> Dict[str, Any]:
    """GPTModel's ``vp_stage`` keyword where ``model_class`` takes it; where it does not, an
    interleaved pipeline's later chunks (``vp_stage`` > 0) cannot be built, and are refused."""
    if "vp_stage" in inspect.signature(model_class.__init__).parameters:
        return {"vp_stage": vp_stage}
    if vp_stage:
        raise ValueError("megatron_burst.megatron.pretrain_gpt: this megatron-core's GPTModel "
                         "takes no vp_stage, so it cannot build an interleaved pipeline's "
                         "chunks (--num-layers-per-virtual-pipeline-stage)")
    return {}
