"""Megatron-Core layer specs whose core attention is BurstAttention.

`BurstSpecProvider` follows Megatron's `BackendSpecProvider` protocol: it hands out
TransformerEngine's linear and norm modules when transformer_engine imports, Megatron's local
ones when it does not, and `BurstDotProductAttention` as `core_attention`.

The layer-spec functions plug into Megatron's command line:

    --spec megatron_burst.megatron.spec get_gpt_layer_burst_spec     # megatron-core 0.17+
    --spec megatron_burst.megatron.spec get_llama_layer_burst_spec

megatron-core 0.17+ (megatron.training.models.gpt) calls a spec function with the model config
(and vp_stage). Megatron-LM releases up to 0.16 use the `--spec` object as the spec itself; for
those, `gpt_layer_burst_spec` and `llama_layer_burst_spec` are ready-made `ModuleSpec`s:

    --spec megatron_burst.megatron.spec llama_layer_burst_spec
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Union

from megatron.core.models.backends import BackendSpecProvider, LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)

from megatron_burst.decide.topology import CPTopology
from megatron_burst.megatron.attention import BurstDotProductAttention
from megatron_burst.decide.options import TOPOLOGY_OPTIONS, BurstOptions
from megatron_burst.megatron.norms import SequenceParallelTorchNorm

try:
    import transformer_engine  # noqa: F401  (only probing whether TE is usable)
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider

    HAVE_TE = True
except ImportError:
    HAVE_TE = False


class BurstSpecProvider(BackendSpecProvider):
    """BackendSpecProvider: TE (or local) linears and norms, BurstAttention core attention.

    Every method except `core_attention` delegates to the fallback provider, so the linear,
    norm and MLP choices stay exactly Megatron's; the `*args, **kwargs` pass-through keeps the
    signatures of megatron-core 0.16 and 0.19 (which added e.g. `has_residual`) both working.
    """

    def __init__(self, use_te: Optional[bool] = None, *, topology: Optional[CPTopology] = None,
                 remat_aware: bool = False, **options: Any) -> None:
        """`topology`: a decided CPTopology (`megatron_burst.decide.options.resolve`, as the entry
        points make once per run); else `options`, any of the `BurstOptions` topology fields
        (backward, ulysses_size, intra_node_size, profile), resolved by each layer with
        Megatron's CP settings. `remat_aware`: keep attention outputs for the full recompute."""
        self.use_te = HAVE_TE if use_te is None else use_te
        if self.use_te and not HAVE_TE:
            raise ValueError("use_te=True but transformer_engine is not importable")
        self.fallback: BackendSpecProvider = (TESpecProvider() if self.use_te
                                              else LocalSpecProvider())
        unknown = sorted(set(options) - set(TOPOLOGY_OPTIONS))
        if unknown:
            raise ValueError(f"BurstSpecProvider: unknown option(s) {unknown}; the options are "
                             f"{list(TOPOLOGY_OPTIONS)}")
        # A bad value is named when the spec is made; the layers get the options as checked.
        checked = BurstOptions.of(options)
        given = {name: getattr(checked, name) for name in sorted(checked.given)}
        if topology is not None and given:
            raise ValueError(f"BurstSpecProvider: give a decided topology or options, not both "
                             f"(got topology and {sorted(given)})")
        self.params: Dict[str, Any] = {"remat_aware": bool(remat_aware)}
        if topology is not None:
            self.params["topology"] = topology
        elif given:
            self.params["burst_options"] = given

    def core_attention(self) -> ModuleSpec:
        """BurstDotProductAttention, with the topology (or options) and remat in its params."""
        return ModuleSpec(module=BurstDotProductAttention, params=dict(self.params))

    def column_parallel_linear(self) -> type:
        """The fallback backend's column-parallel linear."""
        return self.fallback.column_parallel_linear()

    def row_parallel_linear(self) -> type:
        """The fallback backend's row-parallel linear."""
        return self.fallback.row_parallel_linear()

    def fuse_layernorm_and_linear(self) -> bool:
        """Whether the fallback backend fuses the norm into the QKV / fc1 linear."""
        return self.fallback.fuse_layernorm_and_linear()

    def column_parallel_layer_norm_linear(self) -> Optional[type]:
        """The fallback backend's fused norm + column-parallel linear, if any."""
        return self.fallback.column_parallel_layer_norm_linear()

    def layer_norm(self, *args: Any, **kwargs: Any) -> Any:
        """The fallback backend's norm."""
        return self.fallback.layer_norm(*args, **kwargs)

    def grouped_mlp_modules(self, *args: Any, **kwargs: Any) -> Any:
        """The fallback backend's grouped MLP modules."""
        return self.fallback.grouped_mlp_modules(*args, **kwargs)

    def activation_func(self) -> Any:
        """The fallback backend's activation module."""
        return self.fallback.activation_func()

    def __getattr__(self, name: str) -> Any:
        # Methods later megatron-core versions add to the protocol (e.g. linear()).
        if name == "fallback":
            raise AttributeError(name)
        return getattr(self.fallback, name)


def _config_value(config: Any, name: str, default: Any) -> Any:
    return getattr(config, name, default) if config is not None else default


def get_gpt_layer_burst_spec(
    config: Any = None,
    vp_stage: Optional[int] = None,
    *,
    use_te: Optional[bool] = None,
    normalization: Optional[str] = None,
    qk_layernorm: Optional[bool] = None,
    qk_l2_norm: Optional[bool] = None,
    topology: Optional[CPTopology] = None,
    remat_aware: bool = False,
    **options: Any,
) -> Union[ModuleSpec, TransformerBlockSubmodules]:
    """Dense GPT layer spec (Megatron's own) with BurstAttention as core attention.

    `config` is what megatron-core 0.17+ passes to a `--spec` function (a GPTModelConfig or a
    TransformerConfig); the keyword arguments override what it says. `topology`,
    `remat_aware` and `options` go to `BurstSpecProvider` (the entry points bind the run's
    resolved topology here with functools.partial).

    Without TE, the norms are `SequenceParallelTorchNorm` (Megatron's torch norm refuses
    sequence parallelism). The block's final norm is not part of a layer spec, so with
    `config.sequence_parallel` the result is the whole block's `TransformerBlockSubmodules`
    (this pipeline stage's layers, found from `config` and `vp_stage`), which GPTModel
    accepts in the same argument.
    """
    if _config_value(config, "num_moe_experts", None):
        raise ValueError(
            "get_gpt_layer_burst_spec builds dense layers; for MoE build Megatron's block spec "
            "with BurstSpecProvider"
        )
    provider = BurstSpecProvider(use_te, topology=topology, remat_aware=remat_aware, **options)
    if qk_layernorm is None:
        qk_layernorm = _config_value(config, "qk_layernorm", False)
    qk_l2_norm = _config_value(config, "qk_l2_norm", False) if qk_l2_norm is None else qk_l2_norm
    spec = _megatron_layer_spec(
        provider.use_te, mla=bool(_config_value(config, "multi_latent_attention", False)),
        qk_layernorm=qk_layernorm, qk_l2_norm=qk_l2_norm,
        normalization=normalization or _config_value(config, "normalization", "LayerNorm"),
    )
    spec.submodules.self_attention.submodules.core_attention = provider.core_attention()
    if not provider.use_te and _config_value(config, "sequence_parallel", False):
        return _block_of(spec, config, vp_stage)
    return spec


def _megatron_layer_spec(use_te: bool, *, mla: bool, qk_layernorm: bool, qk_l2_norm: bool,
                         normalization: str) -> ModuleSpec:
    """Megatron's own dense layer spec, TE or local (``normalization`` is the local one's).

    Reusing Megatron's own builders keeps every non-attention detail (norm placement,
    sharded-state-dict key maps) identical to a TE/local run, so checkpoints interchange.
    MLA (DeepSeek-style latent attention) is Megatron's own MLASelfAttention with our core
    attention: Q/K and V heads of their own dims reach it, and travel at their own sizes.
    """
    if use_te:
        return get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=qk_layernorm, qk_l2_norm=qk_l2_norm, multi_latent_attention=mla
        )
    spec = get_gpt_layer_local_spec(
        qk_layernorm=qk_layernorm,
        normalization=normalization,
        qk_l2_norm=qk_l2_norm,
        multi_latent_attention=mla,
    )
    layer = spec.submodules
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(layer, name) is WrappedTorchNorm:
            setattr(layer, name, SequenceParallelTorchNorm)
    attention = layer.self_attention.submodules
    for name in ("q_layernorm", "kv_layernorm"):  # MLA's latent norms see local tokens
        if getattr(attention, name, None) is WrappedTorchNorm:
            setattr(attention, name, SequenceParallelTorchNorm)
    return spec


def _block_of(spec: ModuleSpec, config: Any, vp_stage: Optional[int]
              ) -> TransformerBlockSubmodules:
    """This pipeline stage's layers of ``spec`` with a sequence-parallel final norm."""
    transformer_config = getattr(config, "transformer", config)  # GPTModelConfig wraps it
    num_layers = get_num_layers_to_build(transformer_config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(
        layer_specs=[spec] * num_layers, layer_norm=SequenceParallelTorchNorm
    )


def get_llama_layer_burst_spec(
    config: Any = None, vp_stage: Optional[int] = None, **overrides: Any
) -> Union[ModuleSpec, TransformerBlockSubmodules]:
    """Llama-style layer spec (RMSNorm; SwiGLU and RoPE come from the config) with
    BurstAttention."""
    if config is not None and _config_value(config, "normalization", "RMSNorm") != "RMSNorm":
        raise ValueError(
            f"get_llama_layer_burst_spec needs --normalization RMSNorm, "
            f"got {config.normalization!r}; use get_gpt_layer_burst_spec for LayerNorm models"
        )
    overrides.setdefault("normalization", "RMSNorm")
    return get_gpt_layer_burst_spec(config, vp_stage, **overrides)


def __getattr__(name: str) -> ModuleSpec:
    """Ready-made specs for Megatron-LM releases whose --spec takes the object itself
    (<= 0.16): `gpt_layer_burst_spec`, `llama_layer_burst_spec`, built when asked for."""
    makers = {"gpt_layer_burst_spec": get_gpt_layer_burst_spec,
              "llama_layer_burst_spec": get_llama_layer_burst_spec}
    if name in makers:
        return makers[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
