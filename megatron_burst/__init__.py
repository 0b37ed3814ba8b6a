"""megatron_burst: BurstAttention context parallelism for Megatron-Core.

Public API (stable names; new options arrive as keyword arguments with defaults):

    out = burst_attn(q, k, v, group=None, *, causal=False, ...)
    x_local = shard_seq(x_full, group=None, *, layout="zigzag", seq_dim=1)
    x_full = unshard_seq(x_local, group=None, *, layout="zigzag", seq_dim=1)
    with count_comm() as stats: ...   # stats.forward_bytes, stats.backward_bytes
    pack = pack_documents(cu_seqlens) # a pack of documents described once per batch
    mask = SliceMask(q_ranges, k_ranges, kinds)  # any union of full/causal/inv/bi slices
    out = burst_attn(q, k, v, group, mask=mask)  # with shard_seq/unshard_seq(..., mask=mask)
    # (LongCA-bench's mask families: megatron_burst.plan.mask_families)
    BurstDotProductAttention          # Megatron-Core core_attention module (needs megatron-core)
    BurstSpecProvider                 # Megatron-Core BackendSpecProvider with it as core_attention

The folders are the layers, bottom to top (tests/test_layering.py: no upward import, no
circle): ``comm`` (rings over a process group), ``plan`` (layouts, blocks, the ring
schedule, as data), ``kernels`` (local attention, the merge), ``decide`` (topology, options,
bytes and seconds), ``attention`` (the call path of ``burst_attn``), ``megatron`` (the
Megatron-Core adapter and entry points), ``launch`` (configs, plans, flags, SLURM, data),
``tools`` (the CPU trainer, tuning, the demo) and ``cli`` (the ``megatron-burst`` command).
"""
__all__ = ["burst_attn", "shard_seq", "unshard_seq", "count_comm", "CommStats",
           "pack_documents", "DocumentPack", "SliceMask", "BurstDotProductAttention",
           "BurstSpecProvider"]
__version__ = "0.1.0"

# Imported on first use, so that `megatron-burst --help` and the launch tools, which need
# none of them, start without importing torch (4 s) or megatron-core.
from megatron_burst.comm.lazy import lazy_names

_LAZY = {"burst_attn": ".attention.api", "count_comm": ".comm", "CommStats": ".comm",
         "shard_seq": ".attention.sharding", "unshard_seq": ".attention.sharding",
         "pack_documents": ".plan.packs", "DocumentPack": ".plan.packs",
         "SliceMask": ".plan.slices",
         "BurstDotProductAttention": ".megatron.attention",
         "BurstSpecProvider": ".megatron.spec"}
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
