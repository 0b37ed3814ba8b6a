"""A run config's CP topology: its `burst:` options resolved once, for every launch tool.

`plan`, `flags`, the memory estimate, the config headers and the CPU trainer all ask what a
config's context parallelism is; `topology_of` answers them all with the one resolver
(`megatron_burst.options.resolve`), once per config (cached on the parts of the config it
reads), with the cluster's profile, the config's tokens per rank, and the ranks of a CP
group per node that Megatron's rank order gives.
"""
from __future__ import annotations

import functools

from ..cp_topology import CPTopology, HeadShape
from ..options import AUTO, BurstOptions, cp_ranks_per_node, resolve
from .config import Config


def options_of(cfg: Config) -> BurstOptions:
    """The config's BurstAttention options (`burst:` plus the cluster's profile)."""
    b = cfg.burst
    # The cluster's profile is read by 'auto' here (and by `plan`'s time model in any case).
    auto = AUTO in (b.backward, b.ulysses_size, b.intra_node_size)
    return BurstOptions(backward=b.backward, ulysses_size=b.ulysses_size,
                        intra_node_size=b.intra_node_size,
                        profile=cfg.cluster.profile_name if auto else None)


def heads_of(cfg: Config) -> HeadShape:
    """Heads of one TP rank and bytes per element."""
    m, p = cfg.model, cfg.parallel
    return HeadShape.of_tp_rank(m.num_attention_heads, m.num_query_groups,
                                m.hidden_size // m.num_attention_heads, tp=p.tensor,
                                half=cfg.training.precision == "bf16")


def tokens_per_rank(cfg: Config) -> int:
    """Tokens one CP rank holds per microbatch: what the time model is asked about."""
    return cfg.training.micro_batch_size * cfg.model.seq_length // cfg.parallel.context


def group_ranks_per_node(cfg: Config) -> int:
    """Ranks of one CP group that share a node (Megatron orders ranks TP innermost)."""
    p = cfg.parallel
    return cp_ranks_per_node(p.context, gpus_per_node=cfg.cluster.gpus_per_node, tp=p.tensor)


def topology_of(cfg: Config) -> CPTopology:
    """The config's decided topology (see the module docstring)."""
    return _topology(cfg.model, cfg.parallel, cfg.burst, cfg.cluster, cfg.training)


@functools.lru_cache(maxsize=64)
def _topology(model, parallel, burst, cluster, training) -> CPTopology:
    cfg = Config(model=model, parallel=parallel, burst=burst, cluster=cluster,
                 training=training)
    return resolve(options_of(cfg), cp=parallel.context, heads=heads_of(cfg),
                   tokens=tokens_per_rank(cfg), cp_ranks_per_node=group_ranks_per_node(cfg))
