"""megatron_burst: BurstAttention context parallelism for Megatron-Core.

Public API (stable names; new options arrive as keyword arguments with defaults):

    out = burst_attn(q, k, v, group=None, *, causal=False, ...)
    x_local = shard_seq(x_full, group=None, *, layout="zigzag", seq_dim=1)
    x_full = unshard_seq(x_local, group=None, *, layout="zigzag", seq_dim=1)
    with count_comm() as stats: ...   # stats.forward_bytes, stats.backward_bytes
    BurstDotProductAttention          # Megatron-Core core_attention module (needs megatron-core)
    BurstSpecProvider                 # Megatron-Core BackendSpecProvider with it as core_attention
"""
from .api import burst_attn
from .comm import CommStats, count_comm
from .layout import shard_seq, unshard_seq

__all__ = ["burst_attn", "shard_seq", "unshard_seq", "count_comm", "CommStats",
           "BurstDotProductAttention", "BurstSpecProvider"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported lazily: megatron-core is an optional dependency of the attention core.
    if name == "BurstDotProductAttention":
        from .megatron.attention import BurstDotProductAttention
        return BurstDotProductAttention
    if name == "BurstSpecProvider":
        from .megatron.spec import BurstSpecProvider
        return BurstSpecProvider
    raise AttributeError(f"module 'megatron_burst' has no attribute {name!r}")
