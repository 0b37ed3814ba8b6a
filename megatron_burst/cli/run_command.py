"""`megatron-burst run`: train a config on this host, torchrun over its GPUs or gloo ranks on
CPU, with --dry-run making every check the run makes and starting nothing; for a GPU config
on a machine without its GPUs (a login node), every check but the GPUs (``login_checks``)."""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from .commands import load_for_command
from ..launch.config.schema import Config, ConfigError
from ..launch.run.flags import LAUNCH_ENV, megatron_flags, torchrun_words
from ..launch.planning.plan import validate
from ..launch.run.runtime_deps import import_problem, run_needs


class LaunchError(ValueError):
    """This host or environment cannot run the command; the message says what is missing."""


def torchrun_command(cfg: Config) -> list[str]:
    """The single-node torchrun command of `run` on a GPU host (this interpreter's torch)."""
    program = [sys.executable, "-m", "torch.distributed.run"]
    return [*torchrun_words(cfg, program, "run"), *megatron_flags(cfg)]


def check_run_iters(cfg: Config, iters: int | None) -> None:
    """``run --iters N`` replaces train_iters, so it must outlast the warmup as that must."""
    warmup = cfg.training.lr_warmup_iters
    if iters is not None and iters <= warmup:
        raise LaunchError(f"--iters {iters} must be more than training.lr_warmup_iters = "
                          f"{warmup} (Megatron's scheduler refuses a run that ends in warmup)")


def cmd_run(args: argparse.Namespace) -> int:
    cfg, _ = load_for_command(args)  # `run` takes no --nodes
    validate(cfg)
    check_run_iters(cfg, args.iters)
    gpu_run = cfg.cluster.hardware.timed and not args.cpu
    gpus = _gpus_here()
    if args.dry_run and gpu_run and (gpus < cfg.cluster.gpus_per_node or cfg.cluster.nodes > 1):
        return _dry_run_without_gpus(cfg, args.config, gpus)
    if args.cpu or not gpus:
        return _run_on_cpu(cfg, args)
    return _run_on_gpus(cfg, args, gpus)


def _gpus_here() -> int:
    """The GPUs torch sees here (0 where torch or CUDA is missing: a login node)."""
    try:
        import torch  # only now: the checks before answer without it
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _dry_run_without_gpus(cfg: Config, config_path: str, gpus: int) -> int:
    """A GPU config on a machine without its GPUs (a login node): every check but the GPUs."""
    from ..launch.login_checks import check_without_gpus

    found, problems = check_without_gpus(cfg, config_path)
    for line in found:
        print(f"checked: {line}")
    c = cfg.cluster
    where = (f"`megatron-burst slurm {config_path}` writes its job" if c.nodes > 1
             else f"`megatron-burst run {config_path}` on a host with {c.gpus_per_node} GPUs")
    print(f"not checked: the GPUs ({c.nodes} x {c.gpus_per_node} {c.gpu}; {gpus} here): "
          f"{where}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 2 if problems else 0


def check_imports(cfg: Config) -> None:
    """Import what the run of ``cfg`` will (its topology's and tokenizer's modules included),
    so a missing one stops it here, in one line, not in every rank after start-up."""
    problem = import_problem(run_needs(cfg))
    if problem:
        raise LaunchError(problem)


def _run_on_cpu(cfg: Config, args: argparse.Namespace) -> int:
    """Gloo ranks on this host; --dry-run makes every check the real run makes first."""
    from ..tools.cpu_data import open_batch_source
    from ..tools.cpu_run import check_cpu_config, describe_cpu_run, run_cpu

    tokenizer = check_cpu_config(cfg)
    check_cpu_attention(cfg)
    check_imports(cfg)
    if args.dry_run:
        source = open_batch_source(cfg)  # what each rank opens, with the checks it makes
        print(f"would run: {describe_cpu_run(cfg, args.iters, tokenizer)}; "
              f"data: {source.describe()}")
        return 0
    run_cpu(cfg, iters=args.iters, compare=not args.no_compare)
    return 0


def check_cpu_attention(cfg: Config) -> None:
    """Refuse, naming the key, an attention variant the CPU trainer does not build (its
    layers are plain Llama attention), rather than train without it."""
    m = cfg.model
    unbuilt = [("softmax_type", m.softmax_type != "vanilla"),
               ("window_size", m.window_size is not None),
               ("multi_latent_attention", m.multi_latent_attention),
               ("qk_layernorm", m.qk_layernorm)]
    for key, set_ in unbuilt:
        if set_:
            raise ConfigError(f"'model.{key}': the CPU run builds plain Llama attention; "
                              f"sinks, sliding windows, MLA and Q/K norms train on GPUs "
                              f"through Megatron (`megatron-burst flags` carries them)")


def check_gpu_host(cfg: Config, config_path: str, gpus_here: int) -> None:
    """Raise naming the key or requirement if `run` cannot start ``cfg`` on this GPU host."""
    c = cfg.cluster
    if c.nodes > 1:
        raise ConfigError(f"'cluster.nodes' is {c.nodes}: `run` starts one node; use "
                          f"`megatron-burst slurm {config_path} --nodes {c.nodes}` for a "
                          f"multi-node job")
    if c.gpus_per_node > gpus_here:
        raise ConfigError(f"'cluster.gpus_per_node' is {c.gpus_per_node}, but this host has "
                          f"{gpus_here} GPU(s)")
    check_imports(cfg)
    _check_with_installed_megatron(cfg)


def _check_with_installed_megatron(cfg: Config) -> None:
    """megatron_args checked again with the installed Megatron's own parser and source (the
    config was checked with the pinned table when loaded): this host runs that Megatron.
    Where it will not import after all, the entry point says why in one line as it starts."""
    from ..launch.config.megatron_options import live_table
    from ..launch.config.owned_flags import check_megatron_args

    try:
        table = live_table()
    except ImportError:
        return
    check_megatron_args(cfg.megatron_args, table=table)


def _run_on_gpus(cfg: Config, args: argparse.Namespace, gpus_here: int) -> int:
    """torchrun on this host; --dry-run makes the same checks, then prints the command."""
    check_gpu_host(cfg, args.config, gpus_here)
    command = torchrun_command(cfg)
    if args.iters is not None:
        command += ["--train-iters", str(args.iters)]
    print(" ".join(shlex.quote(c) for c in command), flush=True)
    if args.dry_run:
        return 0
    env = {**os.environ, **LAUNCH_ENV}
    return subprocess.call(command, env=env)
