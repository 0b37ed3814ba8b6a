"""One topology everywhere: what `plan` reports is what the adapter builds from the emitted flags.

For every shipped config, and for cp=8 with Ulysses 2 as a flat ring and as a 2 x 2 double
ring, the config's `CPTopology` (the one `megatron-burst plan` prints) must equal the topology
`BurstDotProductAttention` builds from the Megatron flags `megatron-burst flags` emits: once
handed down through the layer spec's params (the entry points' path: `topology_from_args`,
resolved once) and once resolved by the layer itself from Megatron's own CP settings and the
options a spec provider was given (a user's own spec). The flags are parsed by a parser that
knows only the flags the topology needs plus the adapter's --burst-* arguments, so this runs
on Python 3.11 too; `test_launch_flags` checks the same flags with Megatron's full parser.
"""
from __future__ import annotations

import argparse
import copy
import types

import pytest

from megatron_burst.megatron.resolve import topology_from_args
from megatron_burst.decide.topology import CPTopology, HeadShape
from megatron_burst.launch.config.schema import config_from_dict, load_config
from megatron_burst.launch.run.flags import megatron_flags
from megatron_burst.launch.planning.plan import validate
from megatron_burst.launch.planning.report import ring_traffic

from .conftest import CONFIGS

ENV = {"DATA_PATH": "/data/text_document", "TOKENIZER_MODEL": "/tok"}


def _cp8_ulysses2(tiny_raw: dict, intra_node_size: int) -> object:
    raw = copy.deepcopy(tiny_raw)
    raw["model"].update(num_attention_heads=8, num_query_groups=4, hidden_size=256,
                        seq_length=1024)
    raw["parallel"].update(tensor=1, context=8, pipeline=1, data=1)
    raw["burst"].update(ulysses_size=2, intra_node_size=intra_node_size)
    raw["cluster"].update(nodes=1, gpus_per_node=8, gpu="a100-80gb")
    raw["training"].update(micro_batch_size=1, global_batch_size=1)
    return config_from_dict(raw)


def _parse(flags: list[str]) -> argparse.Namespace:
    """The CP-related part of Megatron's command line, as Megatron's parser reads it."""
    from megatron_burst.megatron.arguments import add_burst_args

    p = argparse.ArgumentParser()
    for name in ("--context-parallel-size", "--tensor-model-parallel-size", "--hidden-size",
                 "--num-attention-heads", "--seq-length"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--num-query-groups", type=int, default=1)
    p.add_argument("--kv-channels", type=int, default=None)
    p.add_argument("--group-query-attention", action="store_true")
    p.add_argument("--multi-latent-attention", action="store_true")  # MLA: its head dims
    for name, default in (("--qk-head-dim", 128), ("--qk-pos-emb-head-dim", 64),
                          ("--v-head-dim", 128)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--cp-comm-type", nargs="+", default=["p2p"])
    p.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    add_burst_args(p)
    args, _ = p.parse_known_args(flags)
    return args


class _Group:
    """A CP group of a given size where the module only reads size()."""

    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size


def _layer(args: argparse.Namespace, **params):
    """The BurstDotProductAttention layer Megatron builds from `args` (CP settings read from
    them unless `params` override cp_comm_type or hierarchical_sizes)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_burst.megatron.attention import BurstDotProductAttention

    tp, cp = args.tensor_model_parallel_size, args.context_parallel_size
    groups = types.SimpleNamespace(tp=_Group(tp), cp=_Group(cp))
    config = TransformerConfig(
        num_layers=2, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        attention_dropout=0.0, bf16=args.bf16, context_parallel_size=cp,
        hierarchical_context_parallel_sizes=params.pop(
            "hierarchical_sizes", args.hierarchical_context_parallel_sizes))
    if args.multi_latent_attention:  # as MLASelfAttention builds its core attention
        params.update(k_channels=args.qk_head_dim + args.qk_pos_emb_head_dim,
                      v_channels=args.v_head_dim)
    return BurstDotProductAttention(config, layer_number=2, attn_mask_type=AttnMaskType.causal,
                                    cp_comm_type=params.pop("cp_comm_type", args.cp_comm_type[0]),
                                    pg_collection=groups, **params)


def _adapter_topologies(args: argparse.Namespace) -> list[CPTopology]:
    """The topology BurstDotProductAttention runs: handed down, and resolved by itself."""
    return [_layer(args, topology=topology_from_args(args)).topology,
            _layer(args, burst_options={"backward": args.burst_backward}).topology]


def _check(cfg) -> CPTopology:
    validate(cfg)
    planned = ring_traffic(cfg)["topology"]
    args = _parse(megatron_flags(cfg, env=ENV))
    assert topology_from_args(args) == planned
    for built in _adapter_topologies(args):
        assert built == planned, (built, planned)
    return planned


@pytest.mark.parametrize("path", [p for p in CONFIGS], ids=lambda p: p.stem)
def test_adapter_builds_the_topology_plan_reports(path):
    cfg = load_config(path)
    if cfg.parallel.context == 1:
        pytest.skip("no context parallelism")
    _check(cfg)


def test_cp8_ulysses2_flat_and_double_ring(tiny_raw):
    flat = _check(_cp8_ulysses2(tiny_raw, intra_node_size=None))
    assert (flat.ulysses, flat.ring_size, flat.double) == (2, 4, False)
    double = _check(_cp8_ulysses2(tiny_raw, intra_node_size=4))
    # 4 ranks per node = 2 Ulysses groups = 2 ring positions per node, 2 nodes.
    assert (double.ulysses, double.positions_per_node, double.outer_ring) == (2, 2, 2)
    assert double.hierarchical_sizes == [2, 2, 2]


def _from_megatron(cp: int, comm: str, hier, heads: HeadShape, **given) -> CPTopology:
    from megatron_burst.megatron.resolve import options_from_megatron
    from megatron_burst.decide.options import resolve

    return resolve(options_from_megatron(cp, comm, hier, given), cp=cp, heads=heads,
                   tokens=1024, max_intra_node_size=None)


def test_one_unit_for_ranks_per_node():
    """`intra_node_size` counts ranks in burst_attn, configs, flags and the topology alike."""
    heads = HeadShape(8, 8, 64, 2)
    topology = CPTopology.build(8, ulysses=2, intra_node_size=4, heads=heads)
    assert (topology.intra_node_size, topology.positions_per_node) == (4, 2)
    same = _from_megatron(8, "a2a+burst", [2, 2, 2], heads, backward="burst")
    assert same == topology
    assert _from_megatron(8, "a2a+burst", None, heads, ulysses_size=2, intra_node_size=4,
                          backward="burst") == topology
    # Flat with Ulysses: the old bug read the Ulysses size as the inner ring's.
    flat = _from_megatron(8, "a2a+burst", [2, 4], heads, ulysses_size=2)
    assert not flat.double and flat.ring_size == 4
    with pytest.raises(ValueError, match="contradicts"):
        _from_megatron(8, "a2a+burst", [2, 4], heads, ulysses_size=4)
    with pytest.raises(ValueError, match="intra_node_size"):
        CPTopology.build(8, ulysses=2, intra_node_size=3, heads=heads)
    with pytest.raises(ValueError, match="not a BurstAttention mode"):
        _from_megatron(8, "a2a", None, heads)
    with pytest.raises(ValueError, match="options.resolve"):
        CPTopology.build(8, backward="auto", heads=heads)  # 'auto' is the resolver's alone


def test_a_handed_down_topology_must_agree_with_the_layers_settings(tiny_raw):
    """A layer given a decided topology still reads Megatron's CP settings and its own
    options: one that names another algorithm, or another shape, is refused, not dropped."""
    args = _parse(megatron_flags(_cp8_ulysses2(tiny_raw, intra_node_size=4), env=ENV))
    decided = topology_from_args(args)
    assert _layer(args, topology=decided).topology == decided
    other = {"burst": "ring", "ring": "burst"}[decided.backward]
    for params, match in ((dict(cp_comm_type="a2a"), "not a BurstAttention mode"),
                          (dict(hierarchical_sizes=[4, 2]), "contradicts"),
                          (dict(burst_options={"backward": other}), "does not do what")):
        with pytest.raises(ValueError, match=match):
            _layer(args, topology=decided, **params)


def test_a_profile_nothing_reads_is_refused_through_the_spec_too(tiny_raw):
    """Through a spec provider's options as on the command line: with every choice fixed
    the time model never runs, so a profile would be ignored."""
    args = _parse(megatron_flags(_cp8_ulysses2(tiny_raw, intra_node_size=4), env=ENV))
    fixed = {"backward": "burst", "profile": "a100-ib"}
    with pytest.raises(ValueError, match="read only by 'auto'"):
        _layer(args, burst_options=fixed)
    assert _layer(args, burst_options={**fixed, "backward": "auto"}).options.profile == "a100-ib"
