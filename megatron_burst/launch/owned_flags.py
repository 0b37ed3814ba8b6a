"""The Megatron flags a config's keys decide, so that `megatron_args` cannot set them again.

`flags.megatron_flags` writes the parallel sizes, the sequence length, the CP layout, the
batch, the model's shape and the schedule from the config's keys, and `plan` checks and
prices exactly those values. Megatron's parser lets the last occurrence of a flag win, so a
``megatron_args: ["--context-parallel-size", "2"]`` appended after the planned
``--context-parallel-size 4`` would run CP=2 against a plan made for CP=4. Every such flag
is refused at load time, naming the key to set instead, in both spellings (``--flag value``
and ``--flag=value``). A test checks that every flag `flags` emits is listed here.
"""
from __future__ import annotations

from .config_values import ConfigError

FIXED = "is set by megatron-burst for the BurstAttention layer spec; a config cannot change it"

# flag -> the config key that decides it, or (starting "is ") why nothing may change it.
OWNED_FLAGS: dict[str, str] = {
    # Model shape.
    "--num-layers": "model.num_layers",
    "--decoder-num-layers": "model.num_layers",
    "--encoder-num-layers": "model.num_layers",
    "--hidden-size": "model.hidden_size",
    "--ffn-hidden-size": "model.ffn_hidden_size",
    "--num-attention-heads": "model.num_attention_heads",
    "--kv-channels": "model.hidden_size / model.num_attention_heads (the head dim)",
    "--group-query-attention": "model.num_query_groups",
    "--num-query-groups": "model.num_query_groups",
    "--seq-length": "model.seq_length",
    "--max-position-embeddings": "model.max_position_embeddings",
    "--position-embedding-type": "model.position_embedding",
    "--use-rotary-position-embeddings": "model.position_embedding",
    "--rotary-base": "model.rotary_base",
    "--normalization": "model.normalization",
    "--norm-epsilon": "model.norm_epsilon",
    "--init-method-std": "model.init_method_std",
    "--make-vocab-size-divisible-by": "model.make_vocab_size_divisible_by",
    "--swiglu": "model.activation",
    "--untie-embeddings-and-output-weights": "model.untie_embeddings",
    "--vocab-size": "model.vocab_size",
    # Parallel layout.
    "--tensor-model-parallel-size": "parallel.tensor",
    "--pipeline-model-parallel-size": "parallel.pipeline",
    "--context-parallel-size": "parallel.context",
    "--sequence-parallel": "parallel.sequence_parallel",
    "--cp-comm-type": "burst.ulysses_size and burst.intra_node_size (the planned CP layout)",
    "--hierarchical-context-parallel-sizes": "burst.intra_node_size and burst.ulysses_size",
    # Batch, schedule, precision, optimizer, recompute.
    "--micro-batch-size": "training.micro_batch_size",
    "--global-batch-size": "training.global_batch_size",
    "--train-iters": "training.train_iters (or `run --iters N`)",
    "--lr": "training.lr",
    "--min-lr": "training.min_lr",
    "--lr-decay-style": "training.lr_decay_style",
    "--lr-warmup-iters": "training.lr_warmup_iters",
    "--weight-decay": "training.weight_decay",
    "--clip-grad": "training.clip_grad",
    "--adam-beta1": "training.adam_beta1",
    "--adam-beta2": "training.adam_beta2",
    "--seed": "training.seed",
    "--bf16": "training.precision",
    "--fp16": "training.precision",
    "--use-distributed-optimizer": "training.distributed_optimizer",
    "--overlap-grad-reduce": "training.distributed_optimizer (which turns it on)",
    "--overlap-param-gather": "training.distributed_optimizer (which turns it on)",
    "--recompute-granularity": "training.recompute",
    "--recompute-method": "training.recompute_method",
    "--recompute-num-layers": "training.recompute_num_layers",
    "--log-interval": "training.log_interval",
    "--eval-interval": "training.eval_interval",
    "--eval-iters": "training.eval_iters",
    "--save-interval": "training.save_interval",
    # Data.
    "--mock-data": "data.mock",
    "--data-path": "data.data_path",
    "--split": "data.split",
    "--tokenizer-type": "data.tokenizer_type",
    "--tokenizer-model": "data.tokenizer_model",
    # What the burst layer needs, whatever the config says.
    "--spec": FIXED,
    "--no-create-attention-mask-in-dataloader": FIXED,
    "--create-attention-mask-in-dataloader": FIXED,
    "--transformer-impl": FIXED,
    "--attention-dropout": "is fixed at 0.0: BurstAttention runs without attention dropout",
    "--hidden-dropout": FIXED,
    "--disable-bias-linear": FIXED,
    "--no-gradient-accumulation-fusion": FIXED,
    "--no-masked-softmax-fusion": FIXED,
    "--no-rope-fusion": FIXED,
    "--no-persist-layer-norm": FIXED,
    "--log-throughput": FIXED,
}
# Every --burst-* option of the adapter is a burst.* key (or a data.document_* key).
BURST_PREFIX = "--burst-"
BURST_KEYS = {"--burst-document-mask": "data.document_mask",
              "--burst-document-layout": "data.document_layout",
              "--burst-remat-aware": "burst.remat_aware",
              "--burst-profile": "cluster.profile"}


def owner_of(flag: str) -> str | None:
    """The config key that decides ``flag`` (a bare ``--name``), or None if none does."""
    if flag in OWNED_FLAGS:
        return OWNED_FLAGS[flag]
    if flag.startswith(BURST_PREFIX):
        return BURST_KEYS.get(flag, f"burst.{flag[len(BURST_PREFIX):].replace('-', '_')}")
    return None


def check_megatron_args(args: list[str], owned: dict[str, str] | None = None,
                        key: str = "megatron_args") -> None:
    """Refuse any entry of ``args`` that sets a flag a config key decides, or one of
    ``owned`` (flag -> why, starting "is ": what a caller such as `slurm` sets itself).

    Both ``--flag value`` and ``--flag=value`` are caught; the error names the entry and the
    key to set instead.
    """
    for index, word in enumerate(args):
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        owner = (owned or {}).get(flag) or owner_of(flag)
        if owner is None:
            continue
        if owner.startswith("is "):
            raise ConfigError(f"'{key}[{index}]': {flag} {owner}")
        raise ConfigError(f"'{key}[{index}]': {flag} is what the plan decides; set {owner} "
                          f"instead of passing it in megatron_args")
