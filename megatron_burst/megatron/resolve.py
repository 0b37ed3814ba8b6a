"""The CP topology of a Megatron run: its options read from Megatron's settings, resolved once.

Megatron describes context parallelism its own way (`--cp-comm-type`, `--hierarchical-
context-parallel-sizes`); the `--burst-*` options describe the rest. `options_from_megatron`
merges the two into one `BurstOptions` (explicit values and hierarchical sizes must agree),
`topology_from_args` resolves a command line's once (`options.resolve`, the one resolver),
and the entry points hand the value down to every layer through the layer spec's params
(`megatron_burst.megatron.spec`). A layer built from a spec that carries no topology (a
user's own spec, `BurstSpecProvider(backward=...)`) resolves its options itself, at its
first call, when its tokens per rank are known; every layer of a model asks alike, and the
resolver's cache answers all but the first.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from megatron_burst.decide import cluster
from megatron_burst.decide.topology import (COMM_TYPE_ALIASES, HYBRID_COMM_TYPE, RING_COMM_TYPE,
                                            CPTopology, HeadShape)
from megatron_burst.decide.options import TOPOLOGY_OPTIONS, BurstOptions, deciding_profile, resolve
from megatron_burst.decide.timing import Profile
from megatron_burst.megatron.machine_profile import WAIT, cached_profile


def layer_heads(config: Any, tp_size: int, head_dim: int,
                v_head_dim: Optional[int] = None) -> HeadShape:
    """Heads one TP rank holds, and bytes per activation element, from a TransformerConfig
    (``v_head_dim``: V's head dim where MLA makes it differ from Q/K's)."""
    heads = config.num_attention_heads
    # MLA expands K and V from the latent to every query head: no grouped K/V heads there.
    groups = heads if getattr(config, "multi_latent_attention", False) else (
        config.num_query_groups or heads)
    return HeadShape.of_tp_rank(heads, groups, head_dim, tp=tp_size, half=_half(config),
                                v_head_dim=v_head_dim)


def _half(config_or_args: Any) -> bool:
    return bool(getattr(config_or_args, "bf16", False) or getattr(config_or_args, "fp16", False))


def options_from_megatron(cp: int, cp_comm_type: Any,
                          hierarchical_sizes: Optional[Sequence[int]],
                          given: Mapping[str, Any]) -> BurstOptions:
    """The options `given` explicitly (by name), completed with Megatron's CP settings.

    Megatron's hierarchical sizes list consecutive-rank levels, innermost first. With
    `a2a+burst` the first level is the Ulysses group, and any further levels describe the
    ring: [U, M] a flat ring, [U, L/U, M] a double ring. With `burst`: [L, M] a double ring
    of L ranks per node. Explicit options must agree with them; `a2a`/`allgather` name other
    algorithms and are refused (never replaced by a ring).
    """
    comm = COMM_TYPE_ALIASES.get(comm_types(cp_comm_type)[0], "refused")
    if comm == "refused":
        raise ValueError(
            f"cp_comm_type={cp_comm_type!r} is not a BurstAttention mode; use "
            f"'{RING_COMM_TYPE}' (ring, optionally double ring) or '{HYBRID_COMM_TYPE}' "
            f"(Ulysses x ring)")
    hier = [int(x) for x in hierarchical_sizes] if hierarchical_sizes else []
    if hier and math.prod(hier) != cp:
        raise ValueError(f"hierarchical_context_parallel_sizes={hier} multiply to "
                         f"{math.prod(hier)}, but the context-parallel size is {cp}")
    u_hier, intra_node_size_hier = _read_hierarchy(comm, hier)
    if comm == HYBRID_COMM_TYPE and u_hier is None and given.get("ulysses_size") is None:
        raise ValueError(f"cp_comm_type='{HYBRID_COMM_TYPE}' needs --burst-ulysses-size or "
                         f"--hierarchical-context-parallel-sizes (Ulysses size first)")
    options = dict(given)
    options["ulysses_size"] = _agree("ulysses_size", given.get("ulysses_size"), u_hier)
    options["intra_node_size"] = _agree("intra_node_size", given.get("intra_node_size"),
                                        intra_node_size_hier)
    return BurstOptions.of(options)  # what neither gives stays not given


def options_from_args(args: Any) -> dict:
    """The topology `--burst-*` options a Megatron argparse namespace gives explicitly."""
    return {name: getattr(args, f"burst_{name}") for name in TOPOLOGY_OPTIONS
            if getattr(args, f"burst_{name}", None) is not None}


def topology_from_args(args: Any) -> Optional[CPTopology]:
    """The run's topology from a Megatron command line, resolved once: tokens per rank from
    --seq-length and the micro batch, GPUs per node from torchrun's LOCAL_WORLD_SIZE. None:
    'auto' wants this machine's profile and none is cached; the layers measure it at their
    first call and decide there (`machine_profile`)."""
    tp, cp = args.tensor_model_parallel_size, args.context_parallel_size
    heads = args.num_attention_heads
    kv = args.num_query_groups if getattr(args, "group_query_attention", False) else heads
    head_dim = getattr(args, "kv_channels", None) or args.hidden_size // heads
    v_head_dim = None
    if getattr(args, "multi_latent_attention", False):  # Q/K: the latent head and its RoPE
        kv, head_dim = heads, args.qk_head_dim + args.qk_pos_emb_head_dim
        v_head_dim = args.v_head_dim
    options = options_from_megatron(cp, args.cp_comm_type,
                                    args.hierarchical_context_parallel_sizes,
                                    options_from_args(args))
    tokens = getattr(args, "micro_batch_size", 1) * args.seq_length // cp
    shape = HeadShape.of_tp_rank(heads, kv, head_dim, tp=tp, half=_half(args),
                                 v_head_dim=v_head_dim)
    found = cached_profile(options, cp, tp)  # this machine's, where 'auto' wants one
    if found == WAIT:
        return None  # no profile of this machine yet: the layers measure at their first call
    return layer_topology(options, cp, shape, tokens, tp, machine=found)


def layer_topology(options: BurstOptions, cp_size: int, heads: HeadShape, tokens: int,
                   tp: int, machine: Optional[Profile] = None) -> CPTopology:
    """The topology of a layer built without one (see the module docstring), from its
    options as `options_from_megatron` merged them; the CP ranks a node holds
    (`max_intra_node_size`) by Megatron's rank order (TP innermost) from the one cluster view.
    ``machine``: this machine's measured profile (`machine_profile`), where 'auto' has one."""
    max_intra_node_size = None
    if options.has_auto:  # only 'auto' weighs where the ranks sit
        gpus = cluster.gpus_per_node(
            profile_gpus=deciding_profile(options, machine).gpus_per_node)
        max_intra_node_size = cluster.max_intra_node_size(cp_size, gpus, tp=tp)
    return resolve(options, cp=cp_size, heads=heads, tokens=tokens,
                   max_intra_node_size=max_intra_node_size, machine=machine)


def comm_types(cp_comm_type: Any) -> Sequence[Any]:
    """--cp-comm-type as a list (Megatron allows one value per layer)."""
    return cp_comm_type if isinstance(cp_comm_type, list) else [cp_comm_type]


def _read_hierarchy(comm: str, hier: list[int]) -> tuple[int | None, int | None]:
    """(Ulysses size, intra_node_size) as Megatron's hierarchical sizes describe them."""
    if not hier:
        return None, None
    if comm == HYBRID_COMM_TYPE:
        u, ring = hier[0], hier[1:]
        if len(ring) > 2:
            raise ValueError(f"hierarchical_context_parallel_sizes={hier}: with "
                             f"'{HYBRID_COMM_TYPE}' give [ulysses, ring] or "
                             f"[ulysses, ring positions per node, nodes]")
        return u, (u * ring[0] if len(ring) == 2 else None)
    if len(hier) != 2:
        raise ValueError(f"hierarchical_context_parallel_sizes={hier}: with "
                         f"'{RING_COMM_TYPE}' give [ranks per node, nodes]")
    return None, hier[0]


def _agree(name: str, explicit: int | None, implied: int | None) -> int | None:
    """The explicit value, else the hierarchical sizes' value (None: neither gives one);
    both given must be equal."""
    if explicit is not None and implied is not None and explicit != implied:
        raise ValueError(f"burst {name}={explicit} contradicts "
                         f"hierarchical_context_parallel_sizes (which give {implied})")
    return explicit if explicit is not None else implied


