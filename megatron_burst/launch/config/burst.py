"""A run config's CP topology: its `burst:` options resolved once, for every launch tool.

`plan`, `flags`, the memory estimate, the config headers and the CPU trainer all ask what a
config's context parallelism is; `topology_of` answers them all with the one resolver
(`megatron_burst.decide.options.resolve`), once per config (cached on the parts of the config it
reads), with the cluster's profile, the config's tokens per rank, and the ranks of a CP
group per node that Megatron's rank order gives.
"""
from __future__ import annotations

import functools

from ...decide import cluster
from ...decide.topology import CPTopology, HeadShape
from ...decide.options import AUTO, BurstOptions, OptionError, resolve
from .schema import OPTION_KEYS, Config, ConfigError


def options_of(cfg: Config) -> BurstOptions:
    """The config's BurstAttention options (`burst:` plus the cluster's profile)."""
    b = cfg.burst
    # The cluster's profile is read by 'auto' here (and by `plan`'s time model in any case).
    auto = AUTO in (b.backward, b.ulysses_size, b.intra_node_size)
    return BurstOptions(backward=b.backward, ulysses_size=b.ulysses_size,
                        intra_node_size=b.intra_node_size,
                        profile=cfg.cluster.profile_name if auto else None)


def config_key(option: str) -> str:
    """The dotted config key of a BurstOptions field (``config.OPTION_KEYS``)."""
    return OPTION_KEYS.get(option, f"burst.{option}")


def run_problem(cfg: Config) -> ConfigError | None:
    """What keeps the config's BurstAttention options from doing what they say, by the
    schema's own rules (``BurstOptions`` and its ``run_problem``), naming the config key."""
    b, d, p, tr = cfg.burst, cfg.data, cfg.parallel, cfg.training
    spell = lambda name: f"'{config_key(name)}'"  # noqa: E731
    try:
        options = BurstOptions(backward=b.backward, ulysses_size=b.ulysses_size,
                               intra_node_size=b.intra_node_size, remat_aware=b.remat_aware,
                               document_mask=d.document_mask,
                               document_layout=d.document_layout,
                               document_capacity=d.document_capacity)
    except OptionError as err:
        return ConfigError(err.spelled(spell))
    problem = options.run_problem(micro_batch_size=tr.micro_batch_size, pipeline=p.pipeline,
                                  sequence_parallel=p.sequence_parallel and p.tensor > 1,
                                  recompute=tr.recompute)
    if problem is None:
        return None
    return ConfigError(problem.spelled(spell) + _RUN_KEYS.get(problem.option, ""))


# Where the schema's rule names a run setting, the config key that sets it.
_RUN_KEYS = {"remat_aware": " ('training.recompute': full)",
             "document_mask": " ('training.micro_batch_size')",
             "document_layout": " ('parallel.pipeline', 'parallel.sequence_parallel')"}


def heads_of(cfg: Config) -> HeadShape:
    """Heads of one TP rank, their Q/K and V head dims (MLA's differ), bytes per element."""
    m, p = cfg.model, cfg.parallel
    return HeadShape.of_tp_rank(m.num_attention_heads, m.kv_heads, m.head_dim, tp=p.tensor,
                                half=cfg.training.precision == "bf16", v_head_dim=m.v_dim)


def tokens_per_rank(cfg: Config) -> int:
    """Tokens one CP rank holds per microbatch: what the time model is asked about."""
    return cfg.training.micro_batch_size * cfg.model.seq_length // cfg.parallel.context


def max_intra_node_size_of(cfg: Config) -> int:
    """Ranks of one CP group that share a node (Megatron orders ranks TP innermost): the
    largest ``burst.intra_node_size`` whose inner ring stays inside a node."""
    p = cfg.parallel
    gpus = cluster.gpus_per_node(explicit=cfg.cluster.gpus_per_node)  # the config states it
    return cluster.max_intra_node_size(p.context, gpus, tp=p.tensor)


def topology_of(cfg: Config) -> CPTopology:
    """The config's decided topology (see the module docstring)."""
    return _topology(cfg.model, cfg.parallel, cfg.burst, cfg.cluster, cfg.training)


@functools.lru_cache(maxsize=64)
def _topology(model, parallel, burst, cluster, training) -> CPTopology:
    cfg = Config(model=model, parallel=parallel, burst=burst, cluster=cluster,
                 training=training)
    return resolve(options_of(cfg), cp=parallel.context, heads=heads_of(cfg),
                   tokens=tokens_per_rank(cfg),
                   max_intra_node_size=max_intra_node_size_of(cfg))
