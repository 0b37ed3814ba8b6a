"""New packs (shape-free plans, carved cores on cuDNN) against FlexAttention on one GPU, bf16.

    TOTAL=16384 torchrun --nproc_per_node=1 benchmarks/shape_free_check.py \
        causal_document,shared_question,causal_blockwise

For each family, four new document packs: ``burst_attn`` over the ranks (forward and
backward), gathered to the whole sequence, against FlexAttention with the same block mask
on rank 0: the relative error of out, dq, dk and dv, and the grain of each plan's key.
Its count of dense calls (the carved cores) reads only the plans whose key has a ring: at
one rank it reads 0 though the plan carves. Passes under 2e-2. ``TOTAL``: the whole
sequence (default 8K a rank); ``CARVE_RINGS=0`` or ``1``: whether a ring's plan carves
(default: the package's).

In the ring-carving trial of ``results/h200x2_issue42_carved_cores_ring_rejected/`` the
package carved every plan (the switch came after), so that run's check carved the ring.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, "benchmarks")
import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import call_plan  # noqa: E402
from ranks import start_ranks  # noqa: E402
from slice_masks import Flex, new_packs  # noqa: E402


def cores(mask) -> list[tuple[str, int, int]]:
    """(kind, rows, keys) of every dense call in the ring plans made for ``mask``."""
    return [(c.blocks[0].kind, c.blocks[0].q_stop - c.blocks[0].q_start,
             c.blocks[0].k_stop - c.blocks[0].k_start)
            for key, plan in call_plan._PLANS.items() if key.mask == mask and key.ring is not None
            for c in plan.calls if not c.varlen]


def check_pack(name: str, i: int, mask, full: list, flex, rank: int) -> float:
    """One pack on every rank; on rank 0 its errors printed, the worst returned (0 elsewhere)."""
    loc = [mb.shard_seq(t, mask=mask).contiguous() for t in full]
    q, k, v = (t.requires_grad_() for t in loc[:3])
    out = mb.burst_attn(q, k, v, mask=mask)
    out.backward(loc[3])
    got = [mb.unshard_seq(t, mask=mask) for t in (out.detach(), q.grad, k.grad, v.grad)]
    worst = 0.0
    if rank == 0:
        flex.use(mask)
        w = [t.detach().clone().requires_grad_() for t in full[:3]]
        ref = flex(*w)
        ref.backward(full[3])
        refs = [ref.detach(), *(t.grad for t in w)]
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item()
                for a, b in zip(got, refs)]
        worst = max(errs)
        dense = cores(mask)
        grains = [key.grain for key in call_plan._PLANS if key.mask == mask]
        print(f"{name} pack {i}: rel err out/dq/dk/dv " + " ".join(f"{e:.1e}" for e in errs)
              + f"; grain {grains}, dense calls {len(dense)}: {sorted(set(dense))[:8]}",
              flush=True)
    dist.barrier()
    return worst


def main() -> None:
    if os.environ.get("CARVE_RINGS") in ("0", "1"):  # an A/B: whether a ring's plan carves
        from megatron_burst.kernels import thresholds
        thresholds.CARVE_RINGS = os.environ["CARVE_RINGS"] == "1"
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    total = int(os.environ.get("TOTAL", 8192 * world))
    flex = Flex(total, dev)
    worst = 0.0
    for name in sys.argv[1].split(","):
        gen = torch.Generator(device=dev).manual_seed(7)
        full = [torch.randn(1, total, h, 128, device=dev, dtype=torch.bfloat16, generator=gen)
                for h in (64, 8, 8, 64)]
        for i, mask in enumerate(new_packs(name, total, 1.0, 4)):
            worst = max(worst, check_pack(name, i, mask, full, flex, rank))
    if rank == 0:
        print("WORST", worst, "PASS" if worst < 2e-2 else "FAIL")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
