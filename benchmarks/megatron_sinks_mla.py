"""Megatron GPTModel with attention sinks and with MLA trains on one GPU in bf16 as CP=1 does.

    torchrun --nproc_per_node=1 benchmarks/megatron_sinks_mla.py --out benchmarks/results/h100_megatron_sinks_mla.json

A small Llama-style GPTModel (4 layers, hidden 512, 2,048 tokens, bf16, Adam) is trained
the same steps on the same data twice from the same weights: with BurstAttention as core
attention (the package's layer spec) and with a reference attention independent of the
package (megatron-core's own local DotProductAttention with its softmax offset, softmax in
fp32; for MLA, whose Q/K and V head dims megatron-core's local attention does not take
without TransformerEngine, plain softmax attention written here). Cases: gpt-oss-style
learnable sinks (GQA 8:2), MLA (Q/K 96 = 64 + 32 RoPE, V 64), and MLA with sinks. The data:
a new batch every step from a fixed bigram table (every token has 4 successors, so the loss
falls from ln 1024 = 6.93 towards ln 4 = 1.39 without memorising one batch, whose dynamics
would amplify rounding). The losses of every step are recorded with their difference.

Two exact bf16 attentions drift apart over steps by rounding alone; where the reference is
megatron-core's local attention (the non-MLA cases) the plain attention above is trained
too, and its distance from the reference is printed beside burst's: the noise floor.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from ranks import ran_package, start_ranks

CASES = {"learnable sinks (GQA 8:2)": dict(softmax_type="learnable", num_query_groups=2),
         "MLA (Q/K 96, V 64)": dict(mla=True),
         "MLA + learnable sinks": dict(mla=True, softmax_type="learnable")}
MLA = dict(q_lora_rank=128, kv_lora_rank=64, qk_head_dim=64, qk_pos_emb_head_dim=32,
           v_head_dim=64, rope_type="rope", qk_layernorm=True)


class PlainAttention(torch.nn.Module):
    """Causal softmax attention from its definition (fp32 softmax), with Megatron's softmax
    offset as one more column: the MLA reference."""

    def __init__(self, config, layer_number, attn_mask_type, softmax_scale=None,
                 k_channels=None, v_channels=None, **_ignored):
        super().__init__()
        k_channels = k_channels or config.kv_channels
        self.scale = softmax_scale if softmax_scale is not None else k_channels ** -0.5
        self.softmax_offset = None
        if config.softmax_type == "learnable":
            self.softmax_offset = torch.nn.Parameter(torch.zeros(
                config.num_attention_heads, device="cuda", dtype=config.params_dtype))

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, **_ignored):
        groups = query.shape[2] // key.shape[2]  # GQA: each K/V head serves `groups` Q heads
        key, value = (t.repeat_interleave(groups, dim=2) for t in (key, value))
        s = torch.einsum("qbhd,kbhd->bhqk", query.float(), key.float()) * self.scale
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
        if self.softmax_offset is not None:
            s = torch.cat([s, self.softmax_offset.float()[None, :, None, None].expand(
                *s.shape[:3], 1)], -1)
        p = torch.softmax(s, -1)[..., :n].to(value.dtype)
        out = torch.einsum("bhqk,kbhd->qbhd", p, value)
        return out.reshape(out.shape[0], out.shape[1], -1)


def config_of(case: dict):
    from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                              TransformerConfig)
    kwargs = dict(num_layers=4, hidden_size=512, num_attention_heads=8, ffn_hidden_size=1536,
                  normalization="RMSNorm", gated_linear_unit=True,
                  activation_func=torch.nn.functional.silu, add_bias_linear=False,
                  attention_dropout=0.0, hidden_dropout=0.0, bf16=True,
                  params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
                  masked_softmax_fusion=False, bias_activation_fusion=False,
                  attention_softmax_in_fp32=True,
                  bias_dropout_fusion=False, apply_rope_fusion=False,
                  gradient_accumulation_fusion=False)
    kwargs.update({k: v for k, v in case.items() if k != "mla"})
    if case.get("mla"):
        return MLATransformerConfig(**kwargs, **MLA)
    return TransformerConfig(**kwargs)


def spec_of(case: dict, attention: str):
    """The layer spec with `attention` ("burst", "reference" or "plain") as core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import ModuleSpec

    from megatron_burst.megatron.spec import get_gpt_layer_burst_spec

    mla = bool(case.get("mla"))
    if attention == "burst":
        return get_gpt_layer_burst_spec(config_of(case), use_te=False, normalization="RMSNorm",
                                        qk_layernorm=mla)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=mla,
                                    multi_latent_attention=mla)
    if mla or attention == "plain":
        spec.submodules.self_attention.submodules.core_attention = ModuleSpec(PlainAttention)
    return spec


def batches(steps: int, seq: int, vocab: int = 1024) -> list[torch.Tensor]:
    """A new [1, seq+1] sequence every step from one bigram table (4 successors a token)."""
    gen = torch.Generator().manual_seed(1)
    table = torch.randint(0, vocab, (vocab, 4), generator=gen)
    out = []
    for _ in range(steps):
        tok = [int(torch.randint(0, vocab, (1,), generator=gen))]
        picks = torch.randint(0, 4, (seq,), generator=gen).tolist()
        for p in picks:
            tok.append(int(table[tok[-1], p]))
        out.append(torch.tensor(tok)[None].cuda())
    return out


def train(case: dict, attention: str, weights: dict | None, data: list[torch.Tensor]):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(config=config_of(case), transformer_layer_spec=spec_of(case, attention),
                     vocab_size=1024, max_sequence_length=data[0].shape[1],
                     position_embedding_type="rope",
                     share_embeddings_and_output_weights=False).cuda()
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()
               if torch.is_tensor(v)}
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    positions = torch.arange(data[0].shape[1] - 1, device="cuda")[None]
    losses = []
    for tokens in data:
        opt.zero_grad(set_to_none=True)
        loss = model(tokens[:, :-1], positions, None, labels=tokens[:, 1:]).float().mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, weights


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start_ranks()
    from megatron.core import parallel_state

    import megatron.core.transformer.multi_latent_attention as mla_module
    if importlib.util.find_spec("transformer_engine") is None:
        mla_module.HAVE_TE = False  # megatron-core's MLA asks isinstance(x, None) without TE
    parallel_state.initialize_model_parallel()
    data = batches(args.steps, 2048)
    rows = []
    for name, case in CASES.items():
        ref, weights = train(case, "reference", None, data)
        burst, _ = train(case, "burst", weights, data)
        plain = None if case.get("mla") else train(case, "plain", weights, data)[0]
        rows.append(dict(case=name, reference=ref, burst=burst, plain=plain,
                         max_abs_diff=max_diff(ref, burst),
                         noise_floor=None if plain is None else max_diff(ref, plain)))
        print(name, f"first {ref[0]:.4f}/{burst[0]:.4f} last {ref[-1]:.4f}/{burst[-1]:.4f}",
              f"max |diff| {rows[-1]['max_abs_diff']:.4f}",
              f"noise floor {rows[-1]['noise_floor']}", flush=True)
    import megatron_burst as mb
    meta = dict(command=" ".join(["torchrun", "--nproc_per_node=1", *sys.argv]),
                device=torch.cuda.get_device_name(0), torch=torch.__version__,
                date=time.strftime("%Y-%m-%d %H:%M:%S"),
                package=ran_package())
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['date']}",
             f"command: `{meta['command']}`", "",
             "| case | loss step 1 (ref / burst) | loss last step (ref / burst) | "
             "max abs loss diff | plain vs ref (noise floor) |", "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['reference'][0]:.4f} / {r['burst'][0]:.4f} | "
              f"{r['reference'][-1]:.4f} / {r['burst'][-1]:.4f} | {r['max_abs_diff']:.4f} | "
              + ("-" if r["noise_floor"] is None else f"{r['noise_floor']:.4f}") + " |"
              for r in rows]
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
