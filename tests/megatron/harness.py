"""Per-rank helpers for the Megatron tests: an independent CP=1 reference, and moving weights
and gradients between the reference's full tensors and a TP/PP-sharded model.

The reference is megatron-core's own local spec (its DotProductAttention, no BurstAttention
anywhere) at TP=PP=CP=1; every parallel setup loads the reference's weights and must give
the reference's loss and (gathered) gradients.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from tests.megatron import cpu_llama as cm

SHAPE = cm.TinyLlama()
GRAD_NAMES = (  # the ones the issue names; every other parameter is compared too
    "embedding.word_embeddings.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.final_layernorm.weight",
)
EOD = SHAPE.vocab_size - 1  # the end-of-document token of the packed batches


def packed_batch(lens: Tuple[int, ...], seed: int) -> Dict[str, torch.Tensor]:
    """A [1, sum(lens)] pack: random tokens, EOD closing every document but the last."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    stream = torch.randint(0, EOD, (1, total + 1), generator=gen)
    ends = torch.tensor(lens).cumsum(0)
    stream[0, ends[:-1] - 1] = EOD
    tokens = stream[:, :-1].contiguous()
    return {"tokens": tokens, "labels": stream[:, 1:].contiguous(),
            "loss_mask": (tokens != EOD).float(),
            "position_ids": torch.arange(total)[None]}  # replaced by per-document positions


def reference_model() -> torch.nn.Module:
    """TP=PP=CP=1 Llama with megatron-core's own local attention (the independent reference)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    cm.init_parallel()
    config = cm.tiny_llama_config(SHAPE)
    return cm.build_gpt(config, get_gpt_layer_local_spec(normalization="RMSNorm"), SHAPE)


def reference_step(batch: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], float, Dict[str, torch.Tensor]]:
    """(full weights, loss, full grads) of the reference on `batch`."""
    model = reference_model()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items() if v is not None and torch.is_tensor(v)}
    loss = cm.train_step(model, batch, num_tokens=int(batch["loss_mask"].sum()))
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return weights, float(loss), grads


def reference_packed_step(
    batch: Dict[str, torch.Tensor], cu_seqlens: torch.Tensor, weights: Dict[str, torch.Tensor]
) -> Tuple[float, Dict[str, torch.Tensor]]:
    """Reference for a packed row: every document run on its own (positions restart at 0)."""
    model = reference_model()
    model.load_state_dict(weights, strict=False)
    total = torch.zeros(())
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        out = model(
            batch["tokens"][:, start:end],
            torch.arange(end - start)[None],
            None,
            labels=batch["labels"][:, start:end],
        )
        total = total + (out * batch["loss_mask"][:, start:end]).sum()
    loss = total / batch["loss_mask"].sum()
    loss.backward()
    return float(loss), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _global_name(model: torch.nn.Module, name: str) -> str:
    # Under pipeline parallelism layer i of this stage is layer layer_number-1 of the model.
    match = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
    if not match:
        return name
    layer = model.decoder.layers[int(match.group(1))]
    return f"decoder.layers.{layer.layer_number - 1}.{match.group(2)}"


def _is_glu_fc1(name: str, config: Any) -> bool:
    # SwiGLU's fc1 is [gate; up]; each TP rank holds [gate_r; up_r].
    return config.gated_linear_unit and name.endswith("linear_fc1.weight")


def load_reference_weights(model: torch.nn.Module, weights: Dict[str, torch.Tensor]) -> None:
    """Copy full reference weights into this rank's TP shards of `model`."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = weights[_global_name(model, name)]
            if getattr(param, "tensor_model_parallel", False) and tp > 1:
                dim = param.partition_dim
                if _is_glu_fc1(name, model.config):
                    full = torch.cat([h.chunk(tp, dim)[rank] for h in full.chunk(2, 0)], 0)
                else:
                    full = full.chunk(tp, dim)[rank]
            param.copy_(full)


def gather_full_grads(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """This stage's gradients as full (un-TP-sharded) tensors, by global parameter name."""
    from megatron.core import parallel_state

    tp_group = parallel_state.get_tensor_model_parallel_group()
    tp = tp_group.size()
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad.detach()
        if getattr(param, "tensor_model_parallel", False) and tp > 1:
            parts = [torch.empty_like(grad) for _ in range(tp)]
            dist.all_gather(parts, grad.contiguous(), group=tp_group)
            dim = param.partition_dim
            if _is_glu_fc1(name, model.config):
                halves = [p.chunk(2, 0) for p in parts]
                grad = torch.cat([torch.cat([h[i] for h in halves], dim) for i in range(2)], 0)
            else:
                grad = torch.cat(parts, dim)
        grads[_global_name(model, name)] = grad.clone()
    return grads


def reports_here() -> bool:
    """One rank per pipeline stage reports (TP/CP/DP replicas hold the same tensors)."""
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_context_parallel_rank() == 0
        and parallel_state.get_data_parallel_rank() == 0
    )


def burst_model(tp: int, pp: int, cp: int, weights: Dict[str, torch.Tensor], **config_kwargs: Any) -> torch.nn.Module:
    """The tiny Llama with BurstAttention on a fresh TP/PP/CP setup, reference weights loaded."""
    cm.init_parallel(tp=tp, pp=pp, cp=cp)
    model = cm.build_tiny_llama(SHAPE, **config_kwargs)
    load_reference_weights(model, weights)
    return model


def parallel_step(
    batch: Dict[str, torch.Tensor], weights: Dict[str, torch.Tensor], tp: int = 1, pp: int = 1, cp: int = 1,
    **config_kwargs: Any,
) -> Optional[Dict[str, Any]]:
    """Loss and gathered grads of one step on a parallel setup; None on ranks that do not report."""
    model = burst_model(tp, pp, cp, weights, **config_kwargs)
    loss = cm.train_step(model, cm.split_batch_for_cp(batch), num_tokens=int(batch["loss_mask"].sum()))
    grads = gather_full_grads(model)
    return {"loss": float(loss), "grads": grads} if reports_here() else None


def merge_stage_reports(reports: List[Optional[Dict[str, Any]]]) -> Dict[str, Any]:
    """One loss and one full gradient dict from the reporting rank of every pipeline stage."""
    merged: Dict[str, Any] = {"grads": {}}
    for report in reports:
        if report is None:
            continue
        merged["loss"] = report["loss"]
        merged["grads"].update(report["grads"])
    return merged


def counting_plans(seen: dict, counts=lambda: True):
    """A context in which the planning steps a pack goes through add to ``seen``
    ("placements", "pair_blocks", "call_plans") whenever ``counts()`` says the call counts
    (e.g. only on the step's own thread)."""
    import contextlib
    from unittest import mock

    import megatron_burst.attention.pair_calls as pair_calls
    import megatron_burst.plan.whole_docs as whole_docs
    import megatron_burst.plan.schedule as schedule

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            seen[name] += bool(counts())
            return fn(*args, **kwargs)
        return wrapped

    stack = contextlib.ExitStack()
    for module, attr, name in ((whole_docs, "place", "placements"),
                               (schedule, "blocks_between", "pair_blocks"),
                               (pair_calls, "plan_calls", "call_plans")):
        stack.enter_context(mock.patch.object(module, attr, counting(name,
                                                                     getattr(module, attr))))
    return stack


def packed_reference(docs: Tuple[int, ...], seed: int) -> Tuple[Dict[str, torch.Tensor], dict, dict]:
    """(the packed batch of ``docs``, the reference weights, and the per-document
    reference's {"loss", "grads"}) for the tests that compare CP runs against it."""
    import warnings

    warnings.filterwarnings("ignore")
    full = packed_batch(docs, seed)
    model = reference_model()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32)
    loss, grads = reference_packed_step(full, cu, weights)
    return full, weights, {"loss": loss, "grads": grads}


def prefetch_threads_left() -> list:
    """The names of the data path's prefetch threads still alive (none, after close)."""
    import threading

    from megatron_burst.megatron import prefetch

    return [t.name for t in threading.enumerate() if t.name.startswith(prefetch.THREAD_PREFIX)]


def closed_prefetch() -> list:
    """Every prefetch thread of the data path closed; the names of any still alive."""
    from megatron_burst.megatron import prefetch

    prefetch.close_all()
    return prefetch_threads_left()


def assert_same_steps(ahead: list, on_step: list, steps: int) -> None:
    """Each of ``steps`` steps' (loss, gradients) made ahead equals the one made on the step,
    bit for bit, and the steps' losses all differ (each batch its own)."""
    assert len(ahead) == len(on_step) == steps
    for (loss_a, grads_a), (loss_s, grads_s) in zip(ahead, on_step):
        assert loss_a == loss_s
        for name in grads_s:
            assert torch.equal(grads_a[name], grads_s[name]), name
    losses = [loss for loss, _ in ahead]
    assert len(set(losses)) == len(losses)


def prefetch_off():
    """A context in which the data path makes its batches on the step
    ($MEGATRON_BURST_PREFETCH=0; the package reads its settings once, so they are read
    again on the way in and out)."""
    import contextlib
    import os

    from megatron_burst.comm import settings
    from megatron_burst.megatron import prefetch

    @contextlib.contextmanager
    def off():
        os.environ[prefetch.ENV] = "0"
        settings.reload()
        try:
            yield
        finally:
            os.environ[prefetch.ENV] = "1"
            settings.reload()
    return off()
