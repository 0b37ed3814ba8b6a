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
import os
import socket
import time
from typing import Any, Callable, Iterator

import torch.multiprocessing as mp

from ..launch.config.burst import topology_of
from ..launch.config.schema import Config, ConfigError
from .cpu_data import SUCCESSORS, check_text_config, describe_data
from .cpu_rank import Progress, RankFailure, RunResult, lr_at, rank_main

# Iterations over which the CP run must equal the CP = 1 run to rounding (see compare_losses).
EARLY_ITERATIONS = 10

# Re-exported: the CPU run's public names, wherever they live.
__all__ = ["SUCCESSORS", "RankFailure", "RunResult", "check_cpu_config", "describe_cpu_run",
           "lr_at", "predicted_ring_bytes", "run_cpu", "with_train_iters"]

def check_cpu_config(cfg: Config) -> Any:
    """Raise ConfigError naming the field if ``cfg`` cannot run on CPU ranks.

    Returns the text tokenizer for a run on text (None for synthetic data). The checks that
    read the dataset itself happen where it is opened (``cpu_data.TextWindows.open``).
    """
    from ..megatron.environment import megatron_core_problem

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
    if cfg.data.mask_builder is not None:
        raise ConfigError("'data.mask_builder': the CPU run trains on whole windows of text; "
                          "slice masks run on GPUs with python -m "
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


def predicted_ring_bytes(cfg: Config, iters: int) -> tuple[int, int]:
    """(forward, backward) bytes CP rank 0 sends over ``iters`` steps, per the topology."""
    m, p, tr = cfg.model, cfg.parallel, cfg.training
    if p.context == 1:
        return 0, 0
    fwd, bwd = topology_of(cfg).rank_bytes(
        0, batch=tr.micro_batch_size, s_local=m.seq_length // p.context)
    # Full recompute runs every layer's forward (and its ring) a second time in backward.
    forwards = 2 if tr.recompute == "full" else 1
    return iters * m.num_layers * forwards * fwd, iters * m.num_layers * bwd


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
    procs = [ctx.Process(target=rank_main, args=(r, world, port, cfg, iters, progress,
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
    """One line: the model, the ranks and their topology, the iterations and the data."""
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
