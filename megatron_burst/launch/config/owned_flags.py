"""The Megatron flags a config's keys decide, so that `megatron_args` cannot set them again.

`flags.megatron_flags` writes the parallel sizes, the sequence length, the CP topology, the
batch, the model's shape and the schedule from the config's keys, and `plan` checks and
prices exactly those values. Megatron's parser lets the last occurrence of a flag win, so a
``megatron_args: ["--context-parallel-size", "2"]`` appended after the planned
``--context-parallel-size 4`` would run CP=2 against a plan made for CP=4. Every such entry
is refused at load time, naming the key to set instead, in both spellings (``--flag value``
and ``--flag=value``), and by what it sets rather than how it is spelt
(``megatron_options``): another spelling of the same argparse destination
(``--persistent-save-interval`` is ``--save-interval``), or an option from which Megatron
sets an owned destination after parsing (``--recompute-activations`` sets
``recompute_granularity``; ``--yaml-cfg`` can set anything). A flag Megatron's parser does
not know at all (``--no-such-flag``) is refused too, with the nearest one it knows, at load
time rather than at the front of the queue. A test checks that every flag `flags` emits is
listed here.
"""
from __future__ import annotations

import difflib

from .values import ConfigError
from .megatron_options import ANY, OptionTable, pinned_table
from .model import MLA_KEYS

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
    "--qk-layernorm": "model.qk_layernorm",
    "--softmax-type": "model.softmax_type",
    "--window-size": "model.window_size",
    "--window-attn-skip-freq": "model.window_attn_skip_freq",
    "--multi-latent-attention": "model.multi_latent_attention",
    "--rope-type": "model.position_embedding (multi-latent attention runs it as rope-type rope)",
    **{f"--{key.replace('_', '-')}": f"model.{key}" for key in MLA_KEYS},
    # Parallel sizes.
    "--tensor-model-parallel-size": "parallel.tensor",
    "--pipeline-model-parallel-size": "parallel.pipeline",
    "--context-parallel-size": "parallel.context",
    "--sequence-parallel": "parallel.sequence_parallel",
    "--cp-comm-type": "burst.ulysses_size and burst.intra_node_size (the planned CP topology)",
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
              "--burst-document-capacity": "data.document_capacity",
              "--burst-mask-builder": "data.mask_builder",
              "--burst-remat-aware": "burst.remat_aware",
              "--burst-profile": "cluster.profile"}


# What Megatron derives from the flags above, which the plan relies on too: an option that
# changes it after parsing changes the plan (--tensor-parallel-num-weight-shards, the
# data-parallel size).
DERIVED: dict[str, str] = {
    "data_parallel_size": "cluster.nodes, cluster.gpus_per_node and parallel.* (data "
                          "parallelism follows from them)",
}


def owner_of(flag: str) -> str | None:
    """The config key that decides ``flag`` (a bare ``--name``), by spelling, or None."""
    if flag in OWNED_FLAGS:
        return OWNED_FLAGS[flag]
    if flag.startswith(BURST_PREFIX):
        return BURST_KEYS.get(flag, f"burst.{flag[len(BURST_PREFIX):].replace('-', '_')}")
    return None


def owned_dests(table: OptionTable, owned: dict[str, str] | None = None
                ) -> dict[str, tuple[str, str]]:
    """destination -> (the flag that sets it, its owner) for every flag a config key (or
    ``owned``, a caller's own flags) decides, and the derived destinations."""
    found = {dest: ("", why) for dest, why in DERIVED.items()}
    for flag, why in [*OWNED_FLAGS.items(), *(owned or {}).items()]:
        dest = table.dest(flag)
        if dest is not None:
            found[dest] = (flag, why)
    return found


def check_megatron_args(args: list[str], owned: dict[str, str] | None = None,
                        key: str = "megatron_args", table: OptionTable | None = None) -> None:
    """Refuse any entry of ``args`` that sets what a config key decides (or one of
    ``owned``: flag -> why, starting "is ": what a caller such as `slurm` sets itself).

    An entry is matched by what it sets, not by its spelling: its argparse destination in
    Megatron's parser (aliases such as --persistent-save-interval included), and the
    destinations Megatron sets from it after parsing (--recompute-activations). ``table``:
    Megatron's options (default: the pinned table, ``megatron_options``). Both ``--flag
    value`` and ``--flag=value`` are caught; the error names the entry and what to set.
    """
    table = table or pinned_table()
    dests = owned_dests(table, owned)
    for index, word in enumerate(args):
        if word.startswith("--"):
            _check_entry(word.split("=", 1)[0], f"'{key}[{index}]'", table, dests, owned)


def _check_entry(flag: str, where: str, table: OptionTable,
                 dests: dict[str, tuple[str, str]], owned: dict[str, str] | None) -> None:
    dest = table.dest(flag)
    by_spelling = (owned or {}).get(flag) or owner_of(flag)
    if dest in dests and not by_spelling:  # another spelling of an owned flag
        canonical, owner = dests[dest]
        by_spelling = owner
        flag = f"{flag} (which sets {dest}, as {canonical} does)"
    if by_spelling:
        _refuse(where, flag, by_spelling)
    if dest is None:
        _refuse_unknown(where, flag, table)
    for reached in table.reaches(dest) if dest else ():
        if reached == ANY:
            raise ConfigError(f"{where}: {flag} lets Megatron replace any argument after "
                              f"parsing (from a file or a checkpoint), the planned ones "
                              f"included; set the config's keys instead")
        if reached in dests:
            _refuse(where, f"{flag} (from which Megatron sets {reached} after parsing)",
                    dests[reached][1])


def _refuse_unknown(where: str, flag: str, table: OptionTable) -> None:
    """A flag Megatron's parser does not know would stop the job at start-up, after the
    queue: refuse it now, with the nearest spelling it knows."""
    near = difflib.get_close_matches(flag, table.dests, n=1, cutoff=0.75)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise ConfigError(f"{where}: {flag} is not an option of Megatron's parser (megatron-core "
                      f"{table.megatron_core}, launch/config/megatron_options.json){hint}; "
                      f"remove or correct it")


def _refuse(where: str, flag: str, owner: str) -> None:
    if owner.startswith("is "):
        raise ConfigError(f"{where}: {flag} {owner}")
    raise ConfigError(f"{where}: {flag} is what the plan decides; set {owner} instead of "
                      f"passing it in megatron_args")
