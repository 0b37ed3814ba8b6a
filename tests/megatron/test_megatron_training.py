"""Training-level checks on CPU gloo ranks: Adam steps, checkpoints across CP sizes, packed
sequences, and the clear errors BurstDotProductAttention raises for what cannot work."""
from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
STEPS = 3


def _adam_losses(model: torch.nn.Module, batch: dict, cm) -> list:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    num_tokens = int(batch["loss_mask"].sum())
    losses = []
    for _ in range(STEPS):
        losses.append(float(cm.train_step(model, cm.split_batch_for_cp(batch), num_tokens=num_tokens)))
        optimizer.step()
    return losses


def _adam_and_checkpoint(rank: int, world: int, ckpt_dir: str) -> dict:
    import os
    import warnings

    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    from tests.megatron import cpu_llama as cm

    batch = cm.random_batch(harness.SHAPE)
    weights, _, _ = harness.reference_step(batch)
    reference = harness.reference_model()
    reference.load_state_dict(weights, strict=False)
    out = {"cp1_adam": _adam_losses(reference, batch, cm)}

    model = harness.burst_model(1, 1, 2, weights)
    out["cp2_adam"] = _adam_losses(model, batch, cm)
    num_tokens = int(batch["loss_mask"].sum())
    out["cp2_after"] = float(cm.train_step(model, cm.split_batch_for_cp(batch), num_tokens=num_tokens))
    # Plain state_dict: megatron's torch_dist writer starts a multiprocessing Manager, which
    # the daemonic test ranks may not do (it hangs); CP shards no parameter, so the model
    # state is the same object at every CP size either way.
    path = os.path.join(ckpt_dir, "model.pt")
    if rank == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()

    fresh = harness.burst_model(1, 1, 1, weights)  # CP=1 (DP=2), back at the initial weights
    out["cp1_before_load"] = float(cm.train_step(fresh, batch, num_tokens=num_tokens))
    fresh.load_state_dict(torch.load(path, weights_only=False))
    out["cp1_loaded"] = float(cm.train_step(fresh, batch, num_tokens=num_tokens))
    return out


def test_adam_steps_and_checkpoint_across_cp(tmp_path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    results = run_ranks(2, _adam_and_checkpoint, str(ckpt_dir), timeout=600)[0]
    torch.testing.assert_close(results["cp2_adam"], results["cp1_adam"], **TOL)
    assert results["cp1_adam"][-1] < results["cp1_adam"][0] - 0.1, "Adam did not train"
    # The checkpoint carries the trained weights: loading changes the loss to CP=2's.
    assert abs(results["cp1_before_load"] - results["cp2_after"]) > 1e-2
    torch.testing.assert_close(results["cp1_loaded"], results["cp2_after"], **TOL)


CU_SEQLENS = [0, 16, 40, 64]  # three documents, each divisible by 2*cp = 4


def _packed(rank: int, world: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.packed_seq_params import PackedSeqParams

    import megatron_burst as mb
    from tests.megatron import cpu_llama as cm

    full = cm.random_batch(harness.SHAPE, batch_size=1)
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32)
    weights, _, _ = harness.reference_step(cm.random_batch(harness.SHAPE))
    ref_loss, ref_grads = harness.reference_packed_step(full, cu, weights)

    model = harness.burst_model(1, 1, 2, weights)
    group = parallel_state.get_context_parallel_group()
    batch = {key: mb.shard_seq(value, group, seq_dim=1, cu_seqlens=cu) for key, value in full.items()}
    longest = max(b - a for a, b in zip(CU_SEQLENS[:-1], CU_SEQLENS[1:]))
    batch["packed_seq_params"] = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
        max_seqlen_q=longest, max_seqlen_kv=longest,
    )
    loss = cm.train_step(model, batch, num_tokens=int(full["loss_mask"].sum()))
    return {"loss": float(loss), "grads": harness.gather_full_grads(model),
            "ref_loss": ref_loss, "ref_grads": ref_grads}


def test_packed_sequences_match_per_document_reference() -> None:
    results = run_ranks(2, _packed, timeout=600)[0]
    torch.testing.assert_close(results["loss"], results["ref_loss"], **TOL)
    for key, ref in results["ref_grads"].items():
        torch.testing.assert_close(results["grads"][key], ref, **TOL, msg=lambda m: f"{key}: {m}")


def _errors(rank: int, world: int) -> dict:
    """Each bad setting raises ValueError on every rank, before any communication."""
    import warnings

    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType

    from tests.megatron import cpu_llama as cm
    from megatron_burst.megatron.attention import BurstDotProductAttention

    cm.init_parallel(cp=2)
    messages = {}

    def attempt(name, build_config, call=None, **kwargs):
        try:
            module = BurstDotProductAttention(
                build_config(), layer_number=1, attn_mask_type=AttnMaskType.causal, **kwargs
            )
            if call is not None:
                call(module)
        except ValueError as err:
            messages[name] = str(err)

    base = lambda **kw: cm.tiny_llama_config(harness.SHAPE, **kw)  # noqa: E731
    attempt("hierarchical", lambda: base(hierarchical_context_parallel_sizes=[2, 2]))
    attempt("ulysses_heads", lambda: base(num_attention_heads=6, num_query_groups=3),
            burst_options={"ulysses_size": 2})
    attempt("old_keyword", base, burst_ulysses_size=2)  # never accepted and ignored
    odd = torch.zeros(3, 1, 4, 16)  # 3 local tokens: 6 in all, not divisible by 2*cp = 4
    attempt("sequence", base, call=lambda m: m(odd, odd[:, :, :2], odd[:, :, :2], None))
    # Heads not divisible by the TP group's size: a TP=2 setup with 3 query groups.
    cm.init_parallel(tp=2)
    attempt(
        "tp_heads",
        lambda: base(num_attention_heads=6, num_query_groups=3, tensor_model_parallel_size=1),
        pg_collection=types.SimpleNamespace(
            tp=parallel_state.get_tensor_model_parallel_group(),
            cp=parallel_state.get_context_parallel_group(),
        ),
    )
    return messages


def test_bad_settings_raise_clear_value_errors() -> None:
    for messages in run_ranks(2, _errors, timeout=300):
        assert "multiply to 4" in messages.get("hierarchical", ""), messages
        assert "ulysses" in messages.get("ulysses_heads", ""), messages
        assert "burst_options" in messages.get("old_keyword", ""), messages
        assert "divisible by 2*cp = 4" in messages.get("sequence", ""), messages
        assert "num_query_groups over tensor parallel size" in messages.get("tp_heads", ""), messages


def test_errors_without_a_cp_group_and_with_dropout() -> None:
    """No process group needed: these are refused at construction."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_burst.megatron.attention import BurstDotProductAttention

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0)
    no_cp = types.SimpleNamespace(tp=None, cp=None)
    with pytest.raises(ValueError, match="context-parallel process group"):
        BurstDotProductAttention(config, 1, AttnMaskType.causal, pg_collection=no_cp)
    with pytest.raises(ValueError, match="attention_dropout=0.1"):
        BurstDotProductAttention(config, 1, AttnMaskType.causal, attention_dropout=0.1, pg_collection=no_cp)
    with pytest.raises(ValueError, match="not a BurstAttention mode"):
        BurstDotProductAttention(
            config, 1, AttnMaskType.causal, cp_comm_type="a2a",
            pg_collection=types.SimpleNamespace(tp=None, cp=_OneRankGroup()),
        )


class _OneRankGroup:
    """Stands in for a 1-rank process group where only size() is read."""

    def size(self) -> int:
        return 1
