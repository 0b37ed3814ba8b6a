"""What each gloo rank of `megatron-burst run --cpu` runs: build the model, train, report.

``cpu_run`` starts the ranks (torch.multiprocessing, spawn) with ``rank_main`` as their
target and collects rank 0's ``RunResult``; a rank's ConfigError comes back as a
``RankFailure``, for the parent to print once. The loop is a small one (Megatron's own needs
CUDA): AdamW, Megatron's warmup + decay learning-rate shape (``lr_at``), global-norm gradient
clipping, with megatron-core's CUDA-only call sites patched by ``cpu_shims``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

from ..launch.config.burst import topology_of
from ..launch.config.schema import Config, ConfigError
from ..launch.planning.memory import padded_vocab
from .cpu_data import open_batch_source
from .cpu_shims import megatron_on_cpu

# Exit status of a rank that stopped on a ConfigError it already reported to the parent.
CONFIG_ERROR_EXIT = 3


@dataclasses.dataclass
class RunResult:
    """What one CPU training run reports back from rank 0."""

    losses: list[float]
    seconds: float  # training only: from the first iteration to the last
    startup_seconds: float  # spawning the ranks, imports, process groups, the model
    tokens_per_iter: int
    forward_bytes: int  # sent by rank 0 in all forward ring passes
    backward_bytes: int


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """A rank's ConfigError (say, a dataset too short), for the parent to report in one line."""

    rank: int
    message: str


@dataclasses.dataclass(frozen=True)
class Progress:
    """What rank 0 prints: ``label`` before each line, an iteration line every ``every``."""

    label: str
    every: int
    detailed: bool  # lr, grad norm and tokens/s too


def lr_at(cfg: Config, it: int) -> float:
    """Megatron's schedule shape: linear warmup, then decay to min_lr at train_iters, and
    min_lr from there on (never rising again)."""
    tr = cfg.training
    if it < tr.lr_warmup_iters:
        return tr.lr * (it + 1) / tr.lr_warmup_iters
    if tr.lr_decay_style == "constant":
        return tr.lr
    frac = min(1.0, (it - tr.lr_warmup_iters) / max(1, tr.train_iters - tr.lr_warmup_iters))
    if tr.lr_decay_style == "linear":
        return tr.min_lr + (tr.lr - tr.min_lr) * (1 - frac)
    return tr.min_lr + (tr.lr - tr.min_lr) * 0.5 * (1 + math.cos(math.pi * frac))


def _grad_norm(model: torch.nn.Module) -> torch.Tensor:
    """Global L2 norm of the gradients, each TP-replicated parameter counted once."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

    sq = torch.zeros(())
    for param in model.parameters():
        if param.grad is not None and param_is_not_tensor_parallel_duplicate(param):
            sq += param.grad.float().pow(2).sum()
    dist.all_reduce(sq, group=parallel_state.get_model_parallel_group())
    return sq.sqrt()


def build_model(cfg: Config) -> torch.nn.Module:
    """GPTModel with the BurstAttention Llama spec, shaped by the config."""
    from megatron.core.models.gpt import GPTModel

    from ..megatron.spec import get_llama_layer_burst_spec
    from .cpu_model import ModelShape, transformer_config

    m, p, tr = cfg.model, cfg.parallel, cfg.training
    shape = ModelShape(hidden_size=m.hidden_size, num_layers=m.num_layers,
                       num_heads=m.num_attention_heads, num_kv_heads=m.num_query_groups,
                       ffn_hidden_size=m.ffn_hidden_size, vocab_size=padded_vocab(cfg),
                       seq_length=m.seq_length)
    config = transformer_config(
        shape, sequence_parallel=p.sequence_parallel and p.tensor > 1,
        recompute=None if tr.recompute == "none" else tr.recompute,
        layernorm_epsilon=m.norm_epsilon, init_method_std=m.init_method_std)
    # The run's one topology, handed to every attention layer through the spec's params.
    spec = get_llama_layer_burst_spec(config, use_te=False, topology=topology_of(cfg),
                                      remat_aware=cfg.burst.remat_aware)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=shape.vocab_size,
                    max_sequence_length=m.max_position_embeddings or m.seq_length,
                    position_embedding_type="rope", rotary_base=m.rotary_base,
                    share_embeddings_and_output_weights=not m.untie_embeddings)


def rank_main(rank: int, world: int, port: int, cfg: Config, iters: int, progress: Progress,
               launched_at: float, results: Any) -> None:
    """One gloo rank: build, train ``iters`` steps; rank 0 prints progress and reports."""
    torch.set_num_threads(1)  # several ranks share a few cores
    # megatron-core and torch.distributed warn about their own internals (missing TE/Apex,
    # deprecated collectives) once per rank and call; on 4 ranks that buries the progress.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        with megatron_on_cpu():
            _train(rank, cfg, iters, progress, launched_at, results)
    except ConfigError as e:  # the parent prints it once, in one line; no traceback per rank
        # Every rank reports: whichever the parent notices first has its message queued.
        results.put(RankFailure(rank, str(e)))
        sys.exit(CONFIG_ERROR_EXIT)
    finally:
        dist.destroy_process_group()
    _leave()


def _leave() -> None:
    """End a rank that finished its work (result sent, process group destroyed) without the
    interpreter's teardown. Once in about 40 runs of the CPU job a rank trained every
    iteration, sent its result, destroyed its group and then died in that teardown
    ("terminate called without an active exception": a C++ thread of torch's still joinable
    when its owner was freed), and the parent failed the run on its exit status. Nothing is
    left to do by then: the result went through a SimpleQueue (written at ``put``, no
    feeder thread) and the output is flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _say(rank: int, progress: Progress, text: str) -> None:
    if rank == 0:
        print(f"{progress.label}{text}", flush=True)


def _train(rank: int, cfg: Config, iters: int, progress: Progress, launched_at: float,
           results: Any) -> None:
    """The training loop of one rank (inside ``megatron_on_cpu``)."""
    import megatron_burst as mb
    from megatron.core import parallel_state

    from .cpu_model import init_parallel, split_batch_for_cp, train_step

    p, tr = cfg.parallel, cfg.training
    _say(rank, progress, f"ranks up after {time.time() - launched_at:.1f} s (started, torch "
                         f"and megatron-core imported); reading the data, building the model ...")
    source = open_batch_source(cfg)
    _say(rank, progress, f"data: {source.describe()}")
    init_parallel(tp=p.tensor, pp=p.pipeline, cp=p.context,
                  hierarchical_cp=topology_of(cfg).hierarchical_sizes,
                  seed=tr.seed)
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tr.lr, weight_decay=tr.weight_decay,
                                  betas=(tr.adam_beta1, tr.adam_beta2))
    dp_rank = parallel_state.get_data_parallel_rank()
    rows = slice(dp_rank * tr.micro_batch_size, (dp_rank + 1) * tr.micro_batch_size)
    tokens_per_iter = tr.global_batch_size * cfg.model.seq_length
    parameters = sum(param.numel() for param in model.parameters())
    startup = time.time() - launched_at
    _say(rank, progress, f"model built ({parameters:,} parameters on rank 0); start-up took "
                         f"{startup:.1f} s; training ...")
    losses: list[float] = []
    fwd_bytes = bwd_bytes = 0
    start = time.perf_counter()
    for it in range(iters):
        batch = {k: v[rows] for k, v in source.batch(it).items()}
        num_tokens = int(batch["loss_mask"].sum())
        with mb.count_comm() as stats:
            loss = train_step(model, split_batch_for_cp(batch), num_tokens=num_tokens)
        fwd_bytes += stats.forward_bytes
        bwd_bytes += stats.backward_bytes
        norm = _grad_norm(model)
        if tr.clip_grad > 0 and norm > tr.clip_grad:
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.mul_(tr.clip_grad / (norm + 1e-6))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, it)
        optimizer.step()
        # Each DP rank saw its own rows: the batch loss is their mean.
        loss = loss.reshape(1).clone()
        dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
        losses.append(float(loss) / parallel_state.get_data_parallel_world_size())
        if rank == 0 and (it % progress.every == 0 or it == iters - 1):
            _report_iteration(cfg, progress, it, iters, losses[-1], float(norm),
                              time.perf_counter() - start, tokens_per_iter)
    if rank == 0:
        results.put(RunResult(losses, time.perf_counter() - start, startup, tokens_per_iter,
                              fwd_bytes, bwd_bytes))


def _report_iteration(cfg: Config, progress: Progress, it: int, iters: int, loss: float,
                      norm: float, elapsed: float, tokens_per_iter: int) -> None:
    """One progress line: loss, and how long the rest of the training will take."""
    per_iter = elapsed / (it + 1)
    left = per_iter * (iters - it - 1)
    line = f"iter {it + 1:4d}/{iters} | loss {loss:.4f}"
    if progress.detailed:
        line += (f" | lr {lr_at(cfg, it):.2e} | grad norm {norm:.3f} | "
                 f"{tokens_per_iter / per_iter:8.0f} tokens/s")
    print(f"{progress.label}{line} | {per_iter:.2f} s/iter | training left {left:5.0f} s",
          flush=True)
