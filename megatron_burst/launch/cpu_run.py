"""The CPU path of `megatron-burst run`: train a config's model on gloo ranks, no GPU.

It runs the model path a GPU run uses (megatron-core's GPTModel, the BurstAttention layer
spec, Megatron's zigzag CP split and TP/SP layers) on ``gpus_per_node`` CPU processes, with
megatron-core's CUDA-only call sites patched by ``cpu_shims`` for the run's duration and the
training step from ``cpu_model``. Megatron's training loop itself needs CUDA, so the loop
here is a small one: AdamW, Megatron's warmup + decay learning-rate shape, global-norm
gradient clipping.

The data (``cpu_data``) is synthetic bigrams (``data.mock``) or real text: windows of a Megatron
indexed dataset such as `megatron-burst data` writes. After the run it repeats the same
training with CP = 1 (same TP, seed and batches) and reports the largest loss difference, and
how many bytes the burst ring moved on rank 0 next to what the cost model predicts.

Start-up (spawning the ranks, each importing torch and megatron-core, building the model)
takes seconds on a small machine, so it is announced as it happens and reported apart from
the training time, for the reference run too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import sys
import time
import warnings
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..cp_layout import CPLayout
from .config import Config, ConfigError
from .cpu_data import SUCCESSORS, check_text_config, describe_data, open_batch_source
from .cpu_shims import megatron_on_cpu
from .memory import padded_vocab

__all__ = ["SUCCESSORS", "RunResult", "check_cpu_config", "describe_cpu_run", "lr_at",
           "predicted_ring_bytes", "run_cpu", "with_train_iters"]

# Exit status of a rank that stopped on a ConfigError it already reported to the parent.
CONFIG_ERROR_EXIT = 3
# Iterations over which the CP run must equal the CP = 1 run to rounding (see compare_losses).
EARLY_ITERATIONS = 10


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


def check_cpu_config(cfg: Config) -> Any:
    """Raise ConfigError naming the field if ``cfg`` cannot run on CPU ranks.

    Returns the text tokenizer for a run on text (None for synthetic data). The checks that
    read the dataset itself happen where it is opened (``cpu_data.TextWindows.open``).
    """
    from .environment import megatron_core_problem

    c, tr = cfg.cluster, cfg.training
    if c.gpu != "cpu":
        raise ConfigError(f"'cluster.gpu' is {c.gpu!r}: this config needs GPUs; on a machine "
                          f"without one run configs/tiny-llama-cpu.yaml")
    if c.nodes != 1:
        raise ConfigError(f"'cluster.nodes' must be 1 for a CPU run, got {c.nodes}")
    if tr.precision != "fp32":
        raise ConfigError("'training.precision' must be fp32 for a CPU run")
    if tr.global_batch_size != tr.micro_batch_size * cfg.parallel.data:
        raise ConfigError("'training.global_batch_size' must equal micro_batch_size x "
                          "parallel.data on CPU (one microbatch per step)")
    if cfg.parallel.pipeline != 1:
        raise ConfigError("'parallel.pipeline' must be 1 for a CPU run")
    if cfg.data.document_mask:
        raise ConfigError("'data.document_mask': the CPU run trains on whole windows of text; "
                          "document masks run on GPUs with python -m "
                          "megatron_burst.megatron.pretrain_gpt (the CPU tests cover them)")
    problem = megatron_core_problem("the CPU run (megatron-core's GPTModel)")
    if problem:
        raise ConfigError(problem)
    return None if cfg.data.mock else check_text_config(cfg)


def with_train_iters(cfg: Config, iters: int) -> Config:
    """``cfg`` as a run of ``iters`` iterations: the learning-rate decay ends at ``iters``.

    This is what Megatron does with `--train-iters N` (its decay length defaults to the
    training length), which `run --iters N` passes on a GPU host: the same schedule both ways.
    """
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training,
                                                                 train_iters=iters))


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


def predicted_ring_bytes(cfg: Config, iters: int) -> tuple[int, int]:
    """(forward, backward) bytes CP rank 0 sends over ``iters`` steps, per the layout."""
    m, p, tr = cfg.model, cfg.parallel, cfg.training
    if p.context == 1:
        return 0, 0
    fwd, bwd = CPLayout.from_run_config(cfg).rank_bytes(
        0, batch=tr.micro_batch_size, s_local=m.seq_length // p.context)
    # Full recompute runs every layer's forward (and its ring) a second time in backward.
    forwards = 2 if tr.recompute == "full" else 1
    return iters * m.num_layers * forwards * fwd, iters * m.num_layers * bwd


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


def _build_model(cfg: Config) -> torch.nn.Module:
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
    # The run's one layout, on the config, where every attention layer reads it.
    config.burst_layout = CPLayout.from_run_config(cfg)
    spec = get_llama_layer_burst_spec(config, use_te=False)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=shape.vocab_size,
                    max_sequence_length=m.max_position_embeddings or m.seq_length,
                    position_embedding_type="rope", rotary_base=m.rotary_base,
                    share_embeddings_and_output_weights=not m.untie_embeddings)


def _rank_main(rank: int, world: int, port: int, cfg: Config, iters: int, progress: Progress,
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
                  hierarchical_cp=CPLayout.from_run_config(cfg).hierarchical_sizes,
                  seed=tr.seed)
    model = _build_model(cfg)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _cuda_hidden_from_new_processes() -> Iterator[None]:
    """Start the ranks with no visible GPU: `--cpu` on a CUDA host must train on CPU, and the
    megatron-core patches (`cpu_shims`) refuse a process that sees CUDA."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def launch(cfg: Config, iters: int, progress: Progress | None = None) -> RunResult:
    """Run ``cfg`` on tensor x context x pipeline x data CPU processes; rank 0's result.

    A ConfigError in a rank (found where the dataset is opened) is raised here, once.
    """
    progress = progress or Progress("", cfg.training.log_interval, detailed=True)
    world = cfg.parallel.tensor * cfg.parallel.context * cfg.parallel.pipeline * cfg.parallel.data
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    launched_at = time.time()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, cfg, iters, progress,
                                                  launched_at, results), daemon=True)
             for r in range(world)]
    with _cuda_hidden_from_new_processes():
        for proc in procs:
            proc.start()
    # Poll rather than join in order: if one rank dies, the others would wait on it forever.
    while any(proc.is_alive() for proc in procs):
        failed = [(r, proc.exitcode) for r, proc in enumerate(procs)
                  if proc.exitcode not in (None, 0)]
        if failed:
            _stop(procs)
            _raise_rank_failure(results, *failed[0])
        time.sleep(0.2)
    bad = [(r, proc.exitcode) for r, proc in enumerate(procs) if proc.exitcode != 0]
    if bad:
        _raise_rank_failure(results, *bad[0])
    return results.get()


def _stop(procs: list) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join()


def _raise_rank_failure(results: Any, rank: int, exitcode: int) -> None:
    """A rank's reported ConfigError as one, else a RuntimeError naming the rank."""
    while not results.empty():
        item = results.get()
        if isinstance(item, RankFailure):
            raise ConfigError(item.message)
    raise RuntimeError(f"CPU rank {rank} exited with code {exitcode}")


def describe_cpu_run(cfg: Config, iters: int | None = None, tokenizer: Any = None) -> str:
    """One line: the model, the ranks and their layout, the iterations and the data."""
    p = cfg.parallel
    iters = iters or cfg.training.train_iters
    return (f"{cfg.model.name}, {p.tensor * p.context * p.pipeline * p.data} gloo ranks "
            f"(TP={p.tensor} CP={p.context} PP={p.pipeline} DP={p.data}), {iters} iterations, "
            f"{describe_data(cfg, tokenizer)}")


def _reference_config(cfg: Config) -> Config:
    """The same run at CP = 1: same TP, seed and batches, no ring."""
    return dataclasses.replace(
        cfg, parallel=dataclasses.replace(cfg.parallel, context=1),
        burst=dataclasses.replace(cfg.burst, intra_node_size=1, ulysses_size=1))


def _timing(result: RunResult, iters: int) -> str:
    return (f"start-up {result.startup_seconds:.1f} s, training {result.seconds:.1f} s "
            f"({result.tokens_per_iter * iters / result.seconds:.0f} tokens/s)")


def run_cpu(cfg: Config, *, iters: int | None = None, compare: bool = True,
            echo: Callable[[str], None] = print) -> tuple[RunResult, RunResult | None]:
    """Train ``cfg`` on CPU ranks, then (with CP > 1 and ``compare``) the CP = 1 reference.

    ``iters`` replaces training.train_iters, the learning-rate schedule included (see
    ``with_train_iters``).
    """
    tokenizer = check_cpu_config(cfg)
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    iters = iters or cfg.training.train_iters
    cfg = with_train_iters(cfg, iters)
    p = cfg.parallel
    world = p.tensor * p.context * p.pipeline * p.data
    echo(f"CPU run: {describe_cpu_run(cfg, iters, tokenizer)}")
    echo(f"starting {world} gloo ranks (each imports torch and megatron-core) ...")
    main = launch(cfg, iters)
    echo(f"done: {_timing(main, iters)}; loss {main.losses[0]:.4f} -> {main.losses[-1]:.4f}")
    fwd_pred, bwd_pred = predicted_ring_bytes(cfg, iters)
    echo(f"burst ring, rank 0 sent: forward {main.forward_bytes:,} B (cost model "
         f"{fwd_pred:,}), backward {main.backward_bytes:,} B (cost model {bwd_pred:,})")
    if not compare or p.context == 1:
        return main, None
    echo(f"reference run: same model, seed and batches with CP=1; starting "
         f"{p.tensor * p.pipeline * p.data} gloo ranks ...")
    ref = launch(_reference_config(cfg), iters,
                 Progress("  CP=1 ", every=max(1, iters // 4), detailed=False))
    echo(f"reference done: {_timing(ref, iters)}")
    echo(compare_losses(main.losses, ref.losses))
    return main, ref


def compare_losses(losses: list[float], reference: list[float]) -> str:
    """The CP run's losses against the CP = 1 run's, early on and over the whole run.

    One step of the two is the same computation up to fp32 rounding (the ring merges partial
    results in another order), so early losses agree to ~1e-6. Training feeds each step's
    rounding into the next, and at a high learning rate Adam amplifies it, so over a long run
    the curves drift apart by far more while following the same course: both are reported.
    """
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    early = min(len(diffs), EARLY_ITERATIONS)
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    line = (f"loss vs CP=1: max |difference| {max(diffs[:early]):.2e} over the first {early} "
            f"iteration(s)")
    if len(diffs) > early:
        line += f", {diffs[worst]:.2e} over all {len(diffs)} (at iteration {worst + 1})"
    return line + f"; final {losses[-1]:.6f} vs {reference[-1]:.6f}"
