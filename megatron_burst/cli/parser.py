"""The `megatron-burst` command: plan, flags, run, slurm, data and tune.

    megatron-burst plan  CONFIG [--nodes N]          does it fit, what it costs, how long it takes
    megatron-burst flags CONFIG [--nodes N] [--keep-vars] [--launcher torchrun]   the command line
    megatron-burst run   CONFIG [--cpu] [--iters N] [--no-compare] [--dry-run]
    megatron-burst slurm CONFIG [--nodes N] [--partition P] [--time T] [--account A]
                         [--setup FILE] [--run-name NAME] [-o FILE] [--force]
    megatron-burst data  CORPUS.jsonl --tokenizer DIR --output-prefix PREFIX [--force]
    megatron-burst data  --sample-corpus DIR [--keep-existing]   an offline corpus, tokenizer, dataset
    megatron-burst tune  --out PROFILE.json [--nproc N] [--quick] [--force]   measure for 'auto'

Every error, in a config or on the command line, is one line on stderr naming the key or
the argument, with exit status 2; nothing is launched.

This module only parses: the commands live in ``commands`` and ``run_command`` and are
imported once the arguments are known, so `--help`, a bare call and a usage error answer at
once, and torch is imported only by the commands that run something (run, data, tune).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

# What a shell reports for a process that SIGPIPE ended (128 + 13), so a `set -o pipefail`
# script sees from `megatron-burst flags ... | head` what it would see from `cat ... | head`.
BROKEN_PIPE_STATUS = 141
CONFIG_HELP = "a YAML run config, e.g. configs/llama3-8b-128k.yaml (docs/configs.md lists the keys)"
NODES_HELP = ("plan for this many nodes instead of cluster.nodes; data parallelism absorbs the "
              "change (the output says what changed)")


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


def _command(sub: argparse._SubParsersAction, name: str, summary: str,
             description: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=summary, description=description)
    parser.set_defaults(command_name=name)
    return parser


def _add_config_commands(sub: argparse._SubParsersAction) -> None:
    """plan, flags, run and slurm: the commands that read a YAML config."""
    _add_plan_command(sub)
    _add_flags_command(sub)
    _add_run_command(sub)
    _add_slurm_command(sub)


def _add_plan_command(sub: argparse._SubParsersAction) -> None:
    """plan: check a config and say what it costs."""
    p = _command(sub, "plan", "check a config fits; memory, ring traffic, step and job time",
                 "Check that a config can run (sizes that divide, memory per GPU), and print "
                 "what it costs: memory per GPU, the ring's traffic, the context-parallel "
                 "topologies the time model considered (and those the config excludes, with why), "
                 "the predicted step time, tokens/s per GPU, MFU and the time to train "
                 "training.train_iters iterations.")
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("--nodes", type=positive_int, help=NODES_HELP)


def _add_flags_command(sub: argparse._SubParsersAction) -> None:
    """flags: a config as Megatron's command line (or a whole launch line)."""
    p = _command(sub, "flags", "print the Megatron command-line flags (or a whole launch line)",
                 "Print the flags of `python -m megatron_burst.megatron.pretrain_gpt` for a "
                 "config, one per line, ready to paste; ${VARIABLES} are expanded from the "
                 "environment unless --keep-vars.")
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("--nodes", type=positive_int, help=NODES_HELP)
    p.add_argument("--keep-vars", action="store_true",
                   help='print ${VARIABLES} unexpanded, in double quotes ("${TOKENIZER_MODEL}"), '
                        "for the shell the command is pasted into to fill in; the data path's "
                        "unquoted (${DATA_PATH:?...}), so a blend \"0.7 a 0.3 b\" becomes its "
                        "words and an unset or empty one stops the command")
    p.add_argument("--launcher", choices=("none", "torchrun"), default="none",
                   help="torchrun: print the whole launch line (environment, torchrun with "
                        "--standalone, or the c10d rendezvous at ${MASTER_ADDR}:${MASTER_PORT} "
                        "for several nodes, and the entry point) before the flags; none (the "
                        "default): the flags only")


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    """run: train a config on this host (GPUs, or CPU gloo ranks)."""
    p = _command(sub, "run", "train: torchrun on a GPU host, gloo ranks on CPU",
                 "Train a config on this host: torchrun over its GPUs, or, without CUDA (or "
                 "with --cpu), on CPU gloo ranks followed by a CP=1 reference run.")
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("--cpu", action="store_true",
                   help="train on CPU gloo ranks even where CUDA exists (a config for cpu)")
    p.add_argument("--iters", type=positive_int,
                   help="train this many iterations instead of training.train_iters; the "
                        "learning-rate decay stretches to them, as Megatron's --train-iters")
    p.add_argument("--no-compare", action="store_true",
                   help="CPU: skip the CP=1 reference run")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the run makes, print what would run, start nothing; "
                        "a GPU config on a machine without its GPUs (a login node) gets every "
                        "check but the GPUs")


def _add_slurm_command(sub: argparse._SubParsersAction) -> None:
    """slurm: an sbatch script for a multi-node job."""
    p = _command(sub, "slurm", "write an sbatch script for a multi-node job",
                 "Write an sbatch script: one torchrun per node under srun, c10d rendezvous, "
                 "one folder per run (under slurm.run_root, else $RUN_ROOT, else runs/ in the "
                 "submit folder) that every job of the run resumes from, saves sized to the "
                 "checkpoint and kept to slurm.keep_checkpoints, a save on SLURM's signal "
                 "before the time limit (or on preemption) and requeue until done, stopping "
                 "if an allocation saves no progress.")
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("--nodes", type=positive_int, help=NODES_HELP + " (default cluster.nodes)")
    p.add_argument("--partition", help="SLURM partition (or a comma-separated list)")
    p.add_argument("--account", help="SLURM account to charge")
    p.add_argument("--time", help="one allocation's SLURM time limit, in any format sbatch "
                                  "takes (30 = 30 minutes, 04:00:00, 2-12 = 2 days 12 hours, "
                                  "UNLIMITED); default slurm.time_limit, else the shorter of "
                                  "24 hours and the whole job. A longer job requeues itself "
                                  "until done; the output says how many allocations it expects")
    p.add_argument("--setup", metavar="FILE",
                   help="a file the script sources before anything else (module load, venv or "
                        "conda activation; a relative path starts from the folder sbatch is run "
                        "in); default slurm.setup")
    p.add_argument("--job-name", help="SLURM job name (default: the config file's name); "
                                      "letters, digits and . _ + - only")
    p.add_argument("--run-name", help="the run's folder under the run root, shared by every "
                                      "job of the run so that a resubmission resumes (default "
                                      "slurm.run_name, else the job name); another name starts "
                                      "another run")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write the script (default runs/CONFIG-<N>n.sbatch under the "
                        "current folder; the repository's .gitignore covers runs/); its "
                        "folder must exist")
    p.add_argument("--force", action="store_true",
                   help="replace the script if it exists (the config it reads never)")


def _add_data_command(sub: argparse._SubParsersAction) -> None:
    """data: a JSONL corpus to Megatron's indexed dataset, or the offline sample."""
    p = _command(sub, "data", "tokenize a JSONL corpus into Megatron's .bin/.idx files",
                 "Tokenize a JSONL corpus (one JSON object per line) into Megatron's indexed "
                 "dataset PREFIX.bin/PREFIX.idx, one document per line with the tokenizer's "
                 "EOD after each; or, with --sample-corpus, make an offline sample to train on. "
                 "Outputs are written under temporary names and renamed when complete.")
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
    p.add_argument("--keep-existing", action="store_true",
                   help="--sample-corpus: if DIR holds a complete sample (corpus, tokenizer of "
                        "the same vocabulary, dataset), keep it and say so instead of refusing; "
                        "so the quick start can be run again")


def _add_tune_command(sub: argparse._SubParsersAction) -> None:
    """tune: measure this host into a profile for the time model."""
    p = _command(sub, "tune", "measure links, kernels and overheads into a profile for 'auto'",
                 "Measure this host's links, attention kernel and host overheads (under a "
                 "minute on GPUs) into a profile the time model reads (config "
                 "cluster.profile, --burst-profile, or $MEGATRON_BURST_PROFILE). For "
                 "several nodes run `srun ... torchrun --nnodes N ... -m "
                 "megatron_burst.tools.tune --out FILE` instead: that measures the inter-node "
                 "link too.")
    p.add_argument("--out", required=True,
                   help="the profile to write (JSON; the raw measurements go beside it, as "
                        "NAME.raw.json); its folder must exist")
    p.add_argument("--force", action="store_true",
                   help="replace the profile (and its .raw.json) if they exist")
    p.add_argument("--nproc", type=positive_int,
                   help="ranks to measure with (default: every GPU, or 2 CPU ranks)")
    p.add_argument("--quick", action="store_true", help="fewer repeats")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the six commands."""
    parser = OneLineParser(
        prog="megatron-burst", description=__doc__.split("\n")[0],
        epilog="`megatron-burst COMMAND --help` describes a command's options. Every error is "
               "one line naming the key or argument, with exit status 2.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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


def _run_command(args: argparse.Namespace) -> int:
    """Import the command's module (only now) and run it."""
    if args.command_name == "run":
        from .run_command import cmd_run
        return cmd_run(args)
    from . import commands
    return getattr(commands, f"cmd_{args.command_name}")(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `megatron-burst` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (already printed, one line) or --help
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    if args.command is None:  # a bare `megatron-burst`: say what it can do
        parser.print_help()
        return 0
    try:
        status = _run_command(args)
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
