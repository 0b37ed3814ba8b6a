"""The `megatron-burst` command: plan, flags, run, slurm, data and tune.

    megatron-burst plan  CONFIG [--nodes N]          check it fits; memory and ring traffic
    megatron-burst flags CONFIG [--nodes N] [--keep-vars]   the Megatron command line
    megatron-burst run   CONFIG [--cpu] [--iters N] [--no-compare] [--dry-run]
    megatron-burst slurm CONFIG --nodes N [--partition P] [--time T] [--account A] [-o FILE]
    megatron-burst data  CORPUS.jsonl --tokenizer DIR --output-prefix PREFIX [--json-key K]
    megatron-burst data  --sample-corpus DIR          an offline corpus, tokenizer and dataset
    megatron-burst tune  --out PROFILE.json [--nproc N] [--quick]   measure this host for 'auto'

Every error, in a config or on the command line, is one line on stderr naming the key or
the argument, with exit status 2; nothing is launched.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from .config import Config, ConfigError, load_config, with_nodes
from .flags import format_flags, megatron_flags
from .plan import make_plan, validate

# What a shell reports for a process that SIGPIPE ended (128 + 13), so a `set -o pipefail`
# script sees from `megatron-burst flags ... | head` what it would see from `cat ... | head`.
BROKEN_PIPE_STATUS = 141


class LaunchError(ValueError):
    """This host or environment cannot run the command; the message says what is missing."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit status 2, like config errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def positive_int(text: str) -> int:
    """argparse type of a count: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def check_run_iters(cfg: Config, iters: int | None) -> None:
    """``run --iters N`` replaces train_iters, so it must outlast the warmup as that must."""
    warmup = cfg.training.lr_warmup_iters
    if iters is not None and iters <= warmup:
        raise LaunchError(f"--iters {iters} must be more than training.lr_warmup_iters = "
                          f"{warmup} (Megatron's scheduler refuses a run that ends in warmup)")


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    validate(cfg)
    check_run_iters(cfg, args.iters)
    import torch

    if args.cpu or not torch.cuda.is_available():
        return _run_on_cpu(cfg, args)
    return _run_on_gpus(cfg, args, torch.cuda.device_count())


def _run_on_cpu(cfg: Config, args: argparse.Namespace) -> int:
    """Gloo ranks on this host; --dry-run makes every check the real run makes first."""
    from .cpu_data import open_batch_source
    from .cpu_run import check_cpu_config, describe_cpu_run, run_cpu

    tokenizer = check_cpu_config(cfg)
    if args.dry_run:
        source = open_batch_source(cfg)  # what each rank opens, with the checks it makes
        print(f"would run: {describe_cpu_run(cfg, args.iters, tokenizer)}; "
              f"data: {source.describe()}")
        return 0
    run_cpu(cfg, iters=args.iters, compare=not args.no_compare)
    return 0


def check_gpu_host(cfg: Config, config_path: str, gpus_here: int) -> None:
    """Raise naming the key or requirement if `run` cannot start ``cfg`` on this GPU host."""
    from .environment import training_entry_point_problem

    c = cfg.cluster
    if c.nodes > 1:
        raise ConfigError(f"'cluster.nodes' is {c.nodes}: `run` starts one node; use "
                          f"`megatron-burst slurm {config_path} --nodes {c.nodes}` for a "
                          f"multi-node job")
    if c.gpus_per_node > gpus_here:
        raise ConfigError(f"'cluster.gpus_per_node' is {c.gpus_per_node}, but this host has "
                          f"{gpus_here} GPU(s)")
    problem = training_entry_point_problem()
    if problem:
        raise LaunchError(problem)


def _run_on_gpus(cfg: Config, args: argparse.Namespace, gpus_here: int) -> int:
    """torchrun on this host; --dry-run makes the same checks, then prints the command."""
    check_gpu_host(cfg, args.config, gpus_here)
    command = torchrun_command(cfg)
    if args.iters is not None:
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
                         account=args.account, job_name=args.job_name)
    out = Path(args.output or f"{Path(args.config).stem}-{cfg.cluster.nodes}n.sbatch")
    out.write_text(text)
    out.chmod(0o755)
    print(f"wrote {out}: sbatch {out}")
    return 0


def _add_config_commands(sub: argparse._SubParsersAction) -> None:
    """plan, flags, run and slurm: the commands that read a YAML config."""
    p = sub.add_parser("plan", help="validate a config; print memory and ring traffic")
    p.add_argument("config")
    p.add_argument("--nodes", type=positive_int, help="plan for this many nodes (DP absorbs it)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("flags", help="print the Megatron command-line flags")
    p.add_argument("config")
    p.add_argument("--nodes", type=positive_int)
    p.add_argument("--keep-vars", action="store_true",
                   help='print ${VARIABLES} unexpanded, in double quotes ("${DATA_PATH}"), '
                        "for the shell the command is pasted into to fill in")
    p.set_defaults(func=cmd_flags)

    p = sub.add_parser("run", help="train: torchrun on a GPU host, gloo ranks on CPU")
    p.add_argument("config")
    p.add_argument("--cpu", action="store_true",
                   help="train on CPU gloo ranks even where CUDA exists (a config for cpu)")
    p.add_argument("--iters", type=positive_int,
                   help="train this many iterations instead of training.train_iters; the "
                        "learning-rate decay stretches to them, as Megatron's --train-iters")
    p.add_argument("--no-compare", action="store_true",
                   help="CPU: skip the CP=1 reference run")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the run makes, print what would run, start nothing")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("slurm", help="write an sbatch script")
    p.add_argument("config")
    p.add_argument("--nodes", type=positive_int, required=True)
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--time", default="04:00:00", help="SLURM time limit (default 04:00:00)")
    p.add_argument("--job-name", help="SLURM job name (default: the config file's name); "
                                      "letters, digits and . _ + - only")
    p.add_argument("-o", "--output", help="script path (default CONFIG-<N>n.sbatch)")
    p.set_defaults(func=cmd_slurm)


def cmd_data(args: argparse.Namespace) -> int:
    from .data import DataError, tokenize_jsonl

    if args.sample_corpus is not None:
        from .sample_data import DEFAULT_VOCAB_SIZE, write_sample

        given = [name for name, value in (("CORPUS", args.corpus), ("--tokenizer", args.tokenizer),
                                          ("--output-prefix", args.output_prefix)) if value]
        if given:
            raise DataError(f"--sample-corpus makes its own corpus, tokenizer and prefix; "
                            f"drop {', '.join(given)}")
        print(write_sample(args.sample_corpus, args.vocab_size or DEFAULT_VOCAB_SIZE,
                           force=args.force).describe())
        return 0
    if args.vocab_size is not None:
        raise DataError("--vocab-size sizes the tokenizer --sample-corpus trains; a corpus of "
                        "your own takes the vocabulary of --tokenizer")
    for name, value in (("CORPUS", args.corpus), ("--tokenizer", args.tokenizer),
                        ("--output-prefix", args.output_prefix)):
        if not value:
            raise DataError(f"{name} is required (or use --sample-corpus DIR for the "
                            f"offline sample)")
    print(tokenize_jsonl(args.corpus, args.tokenizer, args.output_prefix, args.json_key,
                         force=args.force).describe())
    return 0


def _add_data_command(sub: argparse._SubParsersAction) -> None:
    """data: a JSONL corpus to Megatron's indexed dataset, or the offline sample."""
    p = sub.add_parser("data", help="tokenize a JSONL corpus into Megatron's .bin/.idx files",
                       description="Tokenize a JSONL corpus (one JSON object per line) into "
                                   "Megatron's indexed dataset PREFIX.bin/PREFIX.idx, one "
                                   "document per line with the tokenizer's EOD after each; or, "
                                   "with --sample-corpus, make an offline sample to train on.")
    p.add_argument("corpus", nargs="?", metavar="CORPUS", help="a .jsonl file")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="a local Hugging Face tokenizer: a folder with tokenizer.json and "
                        "tokenizer_config.json (its eos_token is the EOD), or any folder "
                        "transformers' AutoTokenizer loads")
    p.add_argument("-o", "--output-prefix", metavar="PREFIX",
                   help="write PREFIX.bin and PREFIX.idx (data.data_path: PREFIX)")
    p.add_argument("--json-key", default="text", help="the key holding the text (default text)")
    p.add_argument("--sample-corpus", metavar="DIR",
                   help="instead: write DIR/corpus.jsonl (Python standard-library docstrings), "
                        "train a BPE tokenizer into DIR/tokenizer and tokenize the corpus into "
                        "DIR/text_document.bin/.idx; no network needed")
    p.add_argument("--vocab-size", type=positive_int,
                   help="--sample-corpus: tokens in the BPE vocabulary (default 1024)")
    p.add_argument("--force", action="store_true",
                   help="replace outputs that exist already (they stay as they were until the "
                        "new ones are complete)")
    p.set_defaults(func=cmd_data)


def cmd_tune(args: argparse.Namespace) -> int:
    """Measure this host with `megatron_burst.tune` on its GPUs (or on CPU gloo ranks)."""
    import torch

    nproc = args.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "-m", "megatron_burst.tune", "--out", args.out]
    if args.quick:
        command.append("--quick")
    print(" ".join(shlex.quote(c) for c in command), flush=True)
    env = {**os.environ, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
    return subprocess.call(command, env=env)


def _add_tune_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="measure links, kernels and overheads into a profile for 'auto'",
        description="Measure this host's links, attention kernel and host overheads (under a "
                    "minute on GPUs) into a profile the time model reads (config "
                    "cluster.profile, --burst-profile, or $MEGATRON_BURST_PROFILE). For "
                    "several nodes run `srun ... torchrun --nnodes N ... -m megatron_burst.tune "
                    "--out FILE` instead: that measures the inter-node link too.")
    p.add_argument("--out", required=True, help="the profile to write (JSON)")
    p.add_argument("--nproc", type=positive_int,
                   help="ranks to measure with (default: every GPU, or 2 CPU ranks)")
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.set_defaults(func=cmd_tune)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the six subcommands."""
    parser = OneLineParser(prog="megatron-burst", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_config_commands(sub)
    _add_data_command(sub)
    _add_tune_command(sub)
    return parser


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit cannot fail again
    on the closed pipe and print a BrokenPipeError after all."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `megatron-burst` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # a usage error (already printed, one line) or --help
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows up here, not at exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_STATUS
    except (ValueError, OSError) as e:  # ConfigError, LaunchError and DataError included
        message = " ".join(str(e).split())  # one line, whatever the message was
        print(f"megatron-burst {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
