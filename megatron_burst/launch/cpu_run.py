"""The CPU path of `megatron-burst run`: train a config's model on gloo ranks, no GPU.

It runs the model path a GPU run uses (megatron-core's GPTModel, the BurstAttention layer
spec, Megatron's zigzag CP split and TP/SP layers) on ``gpus_per_node`` CPU processes, with
megatron-core's CUDA-only call sites patched by ``cpu_shims`` for the run's duration and the
training step from ``cpu_model``. Megatron's training loop itself needs CUDA, so the loop
here is a small one: AdamW, Megatron's warmup + decay
learning-rate shape, global-norm gradient clipping.

The data is synthetic and learnable: token sequences from a fixed random bigram table in
which every token has four possible successors, so the loss falls from ln(vocab) towards
ln(4). After the run it repeats the same training with CP = 1 (same TP, seed and batches)
and reports the largest loss difference, and how many bytes the burst ring moved on rank 0
next to what the cost model predicts.
"""
from __future__ import annotations

import dataclasses
import math
import socket
import time
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..cp_layout import CPLayout
from .config import Config, ConfigError
from .cpu_shims import megatron_on_cpu
from .memory import padded_vocab

SUCCESSORS = 4  # bigram fan-out of the synthetic data: the loss floor is ln(4)


@dataclasses.dataclass
class RunResult:
    """What one CPU training run reports back from rank 0."""

    losses: list[float]
    seconds: float
    tokens_per_iter: int
    forward_bytes: int  # sent by rank 0 in all forward ring passes
    backward_bytes: int


def check_cpu_config(cfg: Config) -> None:
    """Raise ConfigError naming the field if ``cfg`` cannot run on CPU ranks."""
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
    if not cfg.data.mock:
        raise ConfigError("'data.mock' must be true for a CPU run (synthetic data)")


def lr_at(cfg: Config, it: int) -> float:
    """Megatron's schedule shape: linear warmup, then decay to min_lr at train_iters."""
    tr = cfg.training
    if it < tr.lr_warmup_iters:
        return tr.lr * (it + 1) / tr.lr_warmup_iters
    if tr.lr_decay_style == "constant":
        return tr.lr
    frac = (it - tr.lr_warmup_iters) / max(1, tr.train_iters - tr.lr_warmup_iters)
    if tr.lr_decay_style == "linear":
        return tr.min_lr + (tr.lr - tr.min_lr) * (1 - frac)
    return tr.min_lr + (tr.lr - tr.min_lr) * 0.5 * (1 + math.cos(math.pi * frac))


def synthetic_batch(cfg: Config, it: int) -> dict[str, torch.Tensor]:
    """The global batch of iteration ``it``: the same on every rank and in every run."""
    m, tr = cfg.model, cfg.training
    table_gen = torch.Generator().manual_seed(tr.seed)
    successors = torch.randint(0, m.vocab_size, (m.vocab_size, SUCCESSORS), generator=table_gen)
    gen = torch.Generator().manual_seed(tr.seed * 1000003 + it)
    tokens = torch.empty(tr.global_batch_size, m.seq_length + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, m.vocab_size, (tr.global_batch_size,), generator=gen)
    choice = torch.randint(0, SUCCESSORS, tokens.shape, generator=gen)
    for i in range(m.seq_length):
        tokens[:, i + 1] = successors[tokens[:, i], choice[:, i]]
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "loss_mask": torch.ones(tr.global_batch_size, m.seq_length),
        "position_ids": torch.arange(m.seq_length).expand(tr.global_batch_size, -1).contiguous(),
    }


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


def _rank_main(rank: int, world: int, port: int, cfg: Config, iters: int, verbose: bool,
               results: Any) -> None:
    """One gloo rank: build, train ``iters`` steps, rank 0 prints progress and reports."""
    torch.set_num_threads(1)  # several ranks share a few cores
    # megatron-core and torch.distributed warn about their own internals (missing TE/Apex,
    # deprecated collectives) once per rank and call; on 4 ranks that buries the progress.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        with megatron_on_cpu():
            _train(rank, cfg, iters, verbose, results)
    finally:
        dist.destroy_process_group()


def _train(rank: int, cfg: Config, iters: int, verbose: bool, results: Any) -> None:
    """The training loop of one rank (inside ``megatron_on_cpu``)."""
    import megatron_burst as mb
    from megatron.core import parallel_state

    from .cpu_model import init_parallel, split_batch_for_cp, train_step

    p, tr = cfg.parallel, cfg.training
    init_parallel(tp=p.tensor, pp=p.pipeline, cp=p.context,
                  hierarchical_cp=CPLayout.from_run_config(cfg).hierarchical_sizes,
                  seed=tr.seed)
    model = _build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tr.lr, weight_decay=tr.weight_decay,
                                  betas=(tr.adam_beta1, tr.adam_beta2))
    dp_rank = parallel_state.get_data_parallel_rank()
    rows = slice(dp_rank * tr.micro_batch_size, (dp_rank + 1) * tr.micro_batch_size)
    tokens_per_iter = tr.global_batch_size * cfg.model.seq_length
    losses: list[float] = []
    fwd_bytes = bwd_bytes = 0
    start = time.perf_counter()
    for it in range(iters):
        batch = {k: v[rows] for k, v in synthetic_batch(cfg, it).items()}
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
        if rank == 0 and verbose and (it % tr.log_interval == 0 or it == iters - 1):
            elapsed = time.perf_counter() - start
            per_iter = elapsed / (it + 1)
            left = per_iter * (iters - it - 1)
            print(f"iter {it + 1:4d}/{iters} | loss {losses[-1]:.4f} | "
                  f"lr {lr_at(cfg, it):.2e} | grad norm {float(norm):.3f} | "
                  f"{tokens_per_iter / per_iter:8.0f} tokens/s | "
                  f"{per_iter:.2f} s/iter | left {left:5.0f} s", flush=True)
    if rank == 0:
        results.put(RunResult(losses, time.perf_counter() - start, tokens_per_iter,
                              fwd_bytes, bwd_bytes))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg: Config, iters: int, *, verbose: bool = True) -> RunResult:
    """Run ``cfg`` on tensor x context x pipeline x data CPU processes; rank 0's result."""
    world = cfg.parallel.tensor * cfg.parallel.context * cfg.parallel.pipeline * cfg.parallel.data
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, cfg, iters, verbose, results),
                         daemon=True) for r in range(world)]
    for proc in procs:
        proc.start()
    # Poll rather than join in order: if one rank dies, the others would wait on it forever.
    while any(proc.is_alive() for proc in procs):
        failed = [(r, proc.exitcode) for r, proc in enumerate(procs)
                  if proc.exitcode not in (None, 0)]
        if failed:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join()
            raise RuntimeError(f"CPU rank {failed[0][0]} exited with code {failed[0][1]}")
        time.sleep(0.2)
    bad = [(r, proc.exitcode) for r, proc in enumerate(procs) if proc.exitcode != 0]
    if bad:
        raise RuntimeError(f"CPU rank {bad[0][0]} exited with code {bad[0][1]}")
    return results.get()


def run_cpu(cfg: Config, *, iters: int | None = None, compare: bool = True,
            echo: Callable[[str], None] = print) -> tuple[RunResult, RunResult | None]:
    """Train ``cfg`` on CPU ranks, then (with CP > 1 and ``compare``) the CP = 1 reference."""
    check_cpu_config(cfg)
    iters = iters or cfg.training.train_iters
    p = cfg.parallel
    echo(f"CPU run: {cfg.model.name}, {p.tensor * p.context * p.pipeline * p.data} gloo ranks "
         f"(TP={p.tensor} CP={p.context} PP={p.pipeline} DP={p.data}), {iters} iterations, "
         f"synthetic bigram data (loss floor ln {SUCCESSORS} = {math.log(SUCCESSORS):.3f})")
    main = launch(cfg, iters)
    echo(f"done in {main.seconds:.1f} s ({main.tokens_per_iter * iters / main.seconds:.0f} "
         f"tokens/s); loss {main.losses[0]:.4f} -> {main.losses[-1]:.4f}")
    fwd_pred, bwd_pred = predicted_ring_bytes(cfg, iters)
    echo(f"burst ring, rank 0 sent: forward {main.forward_bytes:,} B (cost model "
         f"{fwd_pred:,}), backward {main.backward_bytes:,} B (cost model {bwd_pred:,})")
    if not compare or p.context == 1:
        return main, None
    ref_cfg = dataclasses.replace(
        cfg, parallel=dataclasses.replace(p, context=1),
        burst=dataclasses.replace(cfg.burst, intra_node_size=1, ulysses_size=1))
    echo(f"reference run: same model, seed and batches with CP=1 "
         f"({p.tensor * p.pipeline * p.data} ranks) ...")
    ref = launch(ref_cfg, iters, verbose=False)
    diffs = [abs(a - b) for a, b in zip(main.losses, ref.losses)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    echo(f"loss vs CP=1: max |difference| {diffs[worst]:.2e} at iteration {worst + 1} "
         f"(final {main.losses[-1]:.6f} vs {ref.losses[-1]:.6f})")
    return main, ref

