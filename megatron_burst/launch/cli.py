"""The `megatron-burst` command: plan, flags, run and slurm for a YAML config.

    megatron-burst plan  CONFIG [--nodes N]          check it fits; memory and ring traffic
    megatron-burst flags CONFIG [--nodes N] [--keep-vars]   the Megatron command line
    megatron-burst run   CONFIG [--cpu] [--iters N] [--dry-run]
    megatron-burst slurm CONFIG --nodes N [--partition P] [--time T] [--account A] [-o FILE]

A config error exits with status 2 and one line naming the key; nothing is launched.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .config import Config, ConfigError, load_config, with_nodes
from .flags import format_flags, megatron_flags
from .plan import make_plan, validate


def _load(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    if getattr(args, "nodes", None) is not None:
        cfg = with_nodes(cfg, args.nodes)
    return cfg


def cmd_plan(args: argparse.Namespace) -> int:
    print(make_plan(_load(args)))
    return 0


def cmd_flags(args: argparse.Namespace) -> int:
    cfg = _load(args)
    validate(cfg)
    print(format_flags(megatron_flags(cfg, expand=not args.keep_vars)))
    return 0


def torchrun_command(cfg: Config) -> list[str]:
    """The single-node torchrun command of `run` on a GPU host."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(cfg.cluster.gpus_per_node),
            "-m", "megatron_burst.megatron.pretrain_gpt", *megatron_flags(cfg)]


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    validate(cfg)
    import torch

    if args.cpu or not torch.cuda.is_available():
        from .cpu_run import run_cpu

        if args.dry_run:
            print(f"would train {cfg.model.name} on CPU gloo ranks")
            return 0
        run_cpu(cfg, iters=args.iters, compare=not args.no_compare)
        return 0
    if cfg.cluster.nodes > 1:
        raise ConfigError(f"'cluster.nodes' is {cfg.cluster.nodes}: `run` starts one node; "
                          f"use `megatron-burst slurm {args.config} --nodes "
                          f"{cfg.cluster.nodes}` for a multi-node job")
    command = torchrun_command(cfg)
    if args.iters:
        command += ["--train-iters", str(args.iters)]
    print(" ".join(shlex.quote(c) for c in command), flush=True)
    if args.dry_run:
        return 0
    # Megatron requires it with TP or CP on pre-Blackwell GPUs (ordered comm kernels).
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return subprocess.call(command, env=env)


def cmd_slurm(args: argparse.Namespace) -> int:
    from .slurm import sbatch_script

    cfg = _load(args)
    validate(cfg)
    text = sbatch_script(cfg, args.config, partition=args.partition, time=args.time,
                         account=args.account)
    out = Path(args.output or f"{Path(args.config).stem}-{cfg.cluster.nodes}n.sbatch")
    out.write_text(text)
    out.chmod(0o755)
    print(f"wrote {out}: sbatch {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the four subcommands."""
    parser = argparse.ArgumentParser(prog="megatron-burst", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="validate a config; print memory and ring traffic")
    p.add_argument("config")
    p.add_argument("--nodes", type=int, help="plan for this many nodes (DP absorbs it)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("flags", help="print the Megatron command-line flags")
    p.add_argument("config")
    p.add_argument("--nodes", type=int)
    p.add_argument("--keep-vars", action="store_true",
                   help="leave ${VARIABLES} unexpanded instead of reading the environment")
    p.set_defaults(func=cmd_flags)

    p = sub.add_parser("run", help="train: torchrun on a GPU host, gloo ranks on CPU")
    p.add_argument("config")
    p.add_argument("--cpu", action="store_true", help="use the CPU path even if CUDA exists")
    p.add_argument("--iters", type=int, help="override training.train_iters")
    p.add_argument("--no-compare", action="store_true",
                   help="CPU: skip the CP=1 reference run")
    p.add_argument("--dry-run", action="store_true", help="print what would run")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("slurm", help="write an sbatch script")
    p.add_argument("config")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--time", default="04:00:00", help="SLURM time limit (default 04:00:00)")
    p.add_argument("-o", "--output", help="script path (default CONFIG-<N>n.sbatch)")
    p.set_defaults(func=cmd_slurm)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `megatron-burst` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
        print(f"megatron-burst {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
