"""The `model:` section of a run config: the decoder's shape and its attention variant.

A Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA when num_query_groups < heads), whose
attention may be one of today's open models' (issue 35):

- **attention sinks** (``softmax_type``): ``learnable`` adds one trained logit per query
  head to every row's softmax (gpt-oss); ``off-by-one`` a fixed zero logit; ``vanilla``
  none. Megatron's ``--softmax-type``.
- **sliding-window layers** (``window_size``, ``window_attn_skip_freq``): Megatron's
  ``--window-size`` and ``--window-attn-skip-freq``, read per layer by Megatron's
  ``is_layer_window_attention`` exactly as here (``is_window_layer``): every layer is
  windowed, or with a frequency N every N-th layer (1-based) keeps full attention.
- **multi-latent attention** (``multi_latent_attention`` and its ranks and head dims,
  DeepSeek-V3 style): Q/K heads of ``qk_head_dim + qk_pos_emb_head_dim``, V heads of
  ``v_head_dim``, one K/V head per query head (Megatron refuses GQA with MLA).

The loader (``schema``) checks each value's type, choices and range; ``check_model`` the
rules between the keys above, naming the key; ``plan.validate`` how they combine with the
parallel sizes and the GPU kernels.
"""
from __future__ import annotations

import dataclasses

from .values import ConfigError

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
# The MLA keys: what each one is, for the messages (q_lora_rank may stay unset: Q is then
# projected from the hidden state at full rank, as in DeepSeek-V2-Lite).
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
MLA_REQUIRED = MLA_KEYS[1:]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder and its attention (see the module docstring)."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    seq_length: int
    max_position_embeddings: int | None = None  # defaults to seq_length
    rotary_base: int = 10000
    norm_epsilon: float = 1e-5
    normalization: str = "RMSNorm"
    activation: str = "swiglu"
    position_embedding: str = "rope"
    untie_embeddings: bool = True
    init_method_std: float = 0.02
    make_vocab_size_divisible_by: int = 128
    qk_layernorm: bool = False  # norms on Q and K (MLA: on the Q and K/V latents)
    softmax_type: str = "vanilla"
    window_size: tuple[int, ...] | None = None  # [left, right]: keys i-left..i+right
    window_attn_skip_freq: int | None = None  # every N-th layer full; None: all windowed
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None

    @property
    def head_dim(self) -> int:
        """Q's and K's head dim in attention (MLA: the latent head and its RoPE part)."""
        if self.multi_latent_attention:
            return self.qk_head_dim + self.qk_pos_emb_head_dim
        return self.hidden_size // self.num_attention_heads

    @property
    def v_dim(self) -> int:
        """V's head dim, which is the attention output's (MLA: v_head_dim)."""
        return self.v_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def kv_heads(self) -> int:
        """K/V heads in attention: the query groups, or one per query head with MLA."""
        return self.num_attention_heads if self.multi_latent_attention else self.num_query_groups

    @property
    def window(self) -> tuple[int, int] | None:
        """The sliding window as burst_attn takes it, or None."""
        return None if self.window_size is None else (self.window_size[0], self.window_size[1])

    def is_window_layer(self, layer_number: int) -> bool:
        """Whether layer ``layer_number`` (1-based) attends in the window: Megatron's
        ``is_layer_window_attention`` for an integer frequency."""
        if self.window_size is None:
            return False
        freq = self.window_attn_skip_freq
        return freq is None or layer_number % freq != 0

    def window_layers(self, first: int, count: int) -> int:
        """How many of the ``count`` layers from ``first`` (1-based) are windowed."""
        return sum(self.is_window_layer(n) for n in range(first, first + count))

    @property
    def sink_params(self) -> int:
        """Trained sink logits per layer: one per query head when learnable."""
        return self.num_attention_heads if self.softmax_type == "learnable" else 0


def check_model(m: ModelConfig) -> None:
    """Raise ConfigError naming the key where the attention keys do not go together."""
    _check_window(m)
    if not m.multi_latent_attention:
        for key in MLA_KEYS:
            if getattr(m, key) is not None:
                raise ConfigError(f"'model.{key}' is a multi-latent attention dimension: set "
                                  f"model.multi_latent_attention: true, or remove it")
        return
    for key in MLA_REQUIRED:
        if getattr(m, key) is None:
            raise ConfigError(f"'model.{key}' is required with model.multi_latent_attention: "
                              f"true (MLA keys: {', '.join(MLA_KEYS)})")
    if m.num_query_groups != m.num_attention_heads:
        raise ConfigError(f"'model.num_query_groups' is {m.num_query_groups}, but multi-latent "
                          f"attention has one K/V head per query head (Megatron refuses GQA "
                          f"with MLA): set it to num_attention_heads {m.num_attention_heads}")
    if m.qk_pos_emb_head_dim % 2:
        raise ConfigError(f"'model.qk_pos_emb_head_dim' is {m.qk_pos_emb_head_dim}: RoPE "
                          f"rotates pairs of dims, so it must be even")


def _check_window(m: ModelConfig) -> None:
    if m.window_size is None:
        if m.window_attn_skip_freq is not None:
            raise ConfigError("'model.window_attn_skip_freq' says which layers skip the "
                              "sliding window, but model.window_size sets none")
        return
    if len(m.window_size) != 2:
        raise ConfigError(f"'model.window_size' must be [left, right], two integers, got "
                          f"{m.window_size!r}")
    left, right = m.window_size
    if left < 1:
        raise ConfigError(f"'model.window_size' [{left}, {right}]: left is how many earlier "
                          f"keys a query sees and must be at least 1 (no window: remove the key)")
    if right != 0:
        raise ConfigError(f"'model.window_size' [{left}, {right}]: the model is causal, so no "
                          f"query sees a later key: right must be 0")
