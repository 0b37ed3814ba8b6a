"""Pretrain a GPT/Llama model with Megatron and BurstAttention context parallelism.

    torchrun --nproc-per-node 4 -m megatron_burst.megatron.pretrain_gpt <Megatron flags> \\
        --context-parallel-size 4 --cp-comm-type burst [--burst-backward auto] \\
        [--burst-intra-node-size 8] [--burst-ulysses-size 1] --attention-dropout 0 \\
        (--mock-data | --data-path PREFIX ... --tokenizer-type ...)

Built on `megatron.training.pretrain` (shipped in the megatron-core wheel from 0.17; for older
releases put Megatron-LM on PYTHONPATH). With `--cp-comm-type burst` (or `a2a+burst`) and no
`--spec`, the layers use `megatron_burst.megatron.spec.get_gpt_layer_burst_spec`. Batches are
split across CP ranks by megatron-core's `get_batch_on_this_cp_rank` (zigzag), which is the
layout BurstAttention expects; the CP topology chosen is logged at start-up.

With `--burst-document-mask` (and `--micro-batch-size 1`) every sample is a pack of
documents that end at EOD tokens: attention stays inside each document and RoPE positions
restart in each. The batch is sharded with `--burst-document-layout` (`whole_docs` by
default) and carries a `DocumentParams` to the attention (`megatron_burst.megatron.documents`);
the model is `document_model.DocumentGPTModel`. Every pipeline stage reads the data then,
because middle stages need the boundaries and positions too. Each micro-batch's documents
(shards, pack, ring plans) are made two micro-batches ahead on a background thread
(`$MEGATRON_BURST_PREFETCH=0`: on the step); `$MEGATRON_BURST_TRACE=DIR` records a
torch.profiler trace of a few of them (`megatron_burst.megatron.trace`).

Rank 0 prints the FLOPs of one sequence as this run does them (padded vocabulary, documents,
recompute; `megatron_burst.decide.flops`), which `benchmarks/megatron_documents.py` reads back.
"""
from __future__ import annotations

import inspect
import sys
from functools import partial
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.utils import get_batch_on_this_cp_rank
try:
    from megatron.training import get_args, get_tokenizer, pretrain, print_rank_0
    from megatron.training.arguments import core_transformer_config_from_args
except ImportError as _missing:  # megatron-core < 0.17, or a checkout for a newer Python
    from megatron_burst.megatron.environment import missing_training_message

    if __name__ == "__main__":  # `python -m` / torchrun: one line per rank, no traceback
        print(f"error: {missing_training_message(_missing)}", file=sys.stderr)
        sys.exit(2)
    raise ImportError(missing_training_message(_missing)) from _missing

from megatron_burst.megatron import entry, model_parts
from megatron_burst.megatron.arguments import add_burst_args
from megatron_burst.megatron.document_model import as_document_model
from megatron_burst.megatron.documents import BATCH_KEYS
from megatron_burst.megatron.loss import token_loss

_NEW_PRETRAIN = "cfg_container" in inspect.signature(pretrain).parameters  # megatron-core 0.17+


def get_batch(data_iterator: Optional[Iterator]) -> Tuple[Any, ...]:
    """This rank's part of the next batch, and its packed_seq_params (None without documents).

    Every TP rank reads it (datasets are built on every rank, see
    `is_dataset_built_on_rank`), then CP ranks keep their zigzag chunks. Document batches
    are `entry.document_batch`'s, the same as through Megatron-LM's pretrain_gpt.py.
    """
    args = get_args()
    if args.burst_document_mask:
        return entry.document_batch(data_iterator, args)
    if args.burst_mask_builder:  # a slice mask per micro-batch (mask_batches)
        return entry.mask_batch(data_iterator, args)
    entry.plain_flops_once(args)  # the FLOPs line the benchmarks read (documents print theirs)
    if not (mpu.is_pipeline_first_stage() or mpu.is_pipeline_last_stage()):
        return None, None, None, None, None
    data = next(data_iterator)
    batch: Dict[str, Any] = {key: data[key].cuda(non_blocking=True) for key in BATCH_KEYS}
    kwargs: Dict[str, Any] = {"cp_group": mpu.get_context_parallel_group()}
    if "is_hybrid_cp" in inspect.signature(get_batch_on_this_cp_rank).parameters:
        kwargs["is_hybrid_cp"] = False  # 0.19 made it a required argument
    batch = get_batch_on_this_cp_rank(batch, **kwargs)
    return (*(batch[key] for key in BATCH_KEYS), None)


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Token-summed loss, token count, and the 'lm loss' report Megatron logs, after the loss
    checks Megatron-LM's own pretrain_gpt.py takes (`megatron_burst.megatron.loss`)."""
    return token_loss(loss_mask, output_tensor, get_args())


def forward_step(data_iterator: Iterator, model: torch.nn.Module):
    """Megatron forward step: the attention mask is not needed (causal is in the spec, and
    documents travel as packed_seq_params)."""
    tokens, labels, loss_mask, position_ids, packed_seq_params = get_batch(data_iterator)
    output_tensor = model(tokens, position_ids, None, labels=labels,
                          packed_seq_params=packed_seq_params)
    return output_tensor, partial(loss_func, loss_mask)


def is_dataset_built_on_rank(vp_stage: Optional[int] = None) -> bool:
    """Build on first/last pipeline stages of every TP rank, so no TP broadcast is needed;
    with document masks on every stage (middle stages need the boundaries and positions)."""
    if entry.dataset_on_every_rank(get_args()):
        return True
    return mpu.is_pipeline_first_stage() or mpu.is_pipeline_last_stage()


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage: Optional[int] = None):
    """Mock or indexed (Megatron .bin/.idx) GPT datasets."""
    from megatron.training.utils import get_blend_and_blend_per_split

    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=False,
    )
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset
    print_rank_0(f"> building {dataset_type.__name__} train/valid/test datasets ...")
    return BlendedMegatronDatasetBuilder(
        dataset_type, train_val_test_num_samples, is_dataset_built_on_rank, config
    ).build()


train_valid_test_datasets_provider.is_distributed = True


_RUN: Optional[Any] = None  # entry.BurstRun, made once per run


def configure(args: Any, model_cfg: Any = None) -> Any:
    """The run's BurstAttention choices (`entry.configure_run`), made once: the pre-0.17
    `pretrain` calls `model_provider` once per virtual pipeline chunk. What only this entry
    point cannot build is refused first (`entry.check_own_entry`)."""
    global _RUN
    if _RUN is None:
        entry.check_own_entry(args)
        _RUN = entry.configure_run(args, model_cfg)
    return _RUN


def model_provider(pre_process: bool = True, post_process: bool = True,
                   vp_stage: Optional[int] = None, **kwargs: Any):
    """GPTModel with BurstAttention layers (the pre-0.17 `pretrain` calls this)."""
    from megatron.core.models.gpt import GPTModel

    args = get_args()
    config = core_transformer_config_from_args(args)
    run = configure(args)
    spec = model_parts.layer_spec(args, config, run, vp_stage)
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
        post_process=post_process, fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling,
        **model_parts.virtual_stage(GPTModel, vp_stage),
    )
    return as_document_model(model) if run.documents or run.mask_builder else model


def use_prebuilt_dataset_helpers() -> None:
    """Skip megatron.training's `make` of the dataset helpers when a prebuilt one imports.

    The megatron-core wheel ships ``helpers_cpp`` compiled but not the Makefile that
    initialisation runs ``make`` with, so a wheel install fails there ("No targets
    specified") before training starts. A Megatron-LM checkout has the Makefile and no
    prebuilt module, and is left alone.
    """
    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401
    except ImportError:
        return
    import megatron.core.datasets.utils as dataset_utils

    dataset_utils.compile_helpers = lambda: None


def main() -> None:
    """Parse Megatron's flags plus --burst-*, log the CP topology, and train."""
    use_prebuilt_dataset_helpers()
    defaults = {"tokenizer_type": "GPT2BPETokenizer"}
    if not _NEW_PRETRAIN:
        if {"-h", "--help"} & set(sys.argv[1:]):
            # core_v0.17's pretrain() first parses the flags without ours (its fault-tolerance
            # set-up), so --help would answer there, listing no --burst-* option.
            from megatron.training.arguments import parse_args

            parse_args(extra_args_provider=add_burst_args)  # prints the help and exits
        # Older megatron.training parses arguments inside pretrain().
        pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder,
                 forward_step, extra_args_provider=add_burst_args, args_defaults=defaults)
        return
    from megatron.training.argument_utils import (gpt_config_from_args,
                                                   pretrain_cfg_container_from_args)
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(extra_args_provider=add_burst_args, args_defaults=defaults)
    model_cfg = gpt_config_from_args(args)
    configure(args, model_cfg)
    pretrain(pretrain_cfg_container_from_args(args, model_cfg), train_valid_test_datasets_provider,
             ModelType.encoder_or_decoder, forward_step)


if __name__ == "__main__":
    main()
