"""The `megatron-burst` commands that read a config or write files: plan, flags, slurm, data,
tune (`run` is in ``run_command``). Each takes the parsed arguments and returns the exit
status; errors are raised as ValueError subclasses for ``cli.main`` to print in one line."""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ..launch.config.schema import Config, load_config, resize_note, with_nodes


def load_for_command(args: argparse.Namespace) -> tuple[Config, list[str]]:
    """The config of ``args.config``, resized to ``--nodes`` where the command takes it, and
    a note saying what that changed (none if nothing did)."""
    cfg = load_config(args.config)
    if getattr(args, "nodes", None) is None:
        return cfg, []
    resized = with_nodes(cfg, args.nodes)
    note = resize_note(cfg, resized)
    return resized, [note] if note else []


def cmd_plan(args: argparse.Namespace) -> int:
    from ..launch.planning.plan import make_plan

    cfg, notes = load_for_command(args)
    print(make_plan(cfg, notes))
    return 0


def cmd_flags(args: argparse.Namespace) -> int:
    from ..launch.run.flags import format_flags, launch_line, megatron_flags
    from ..launch.planning.plan import validate

    cfg, notes = load_for_command(args)
    validate(cfg)
    launcher = launch_line(cfg, args.launcher, Path(args.config).stem)
    if launcher and cfg.cluster.nodes > 1:
        notes.append(f"run the same line on each of the {cfg.cluster.nodes} nodes, with "
                     f"MASTER_ADDR (the first node's address) and MASTER_PORT set")
    for note in notes:  # on stderr: stdout stays a command to paste
        print(f"note: {note}", file=sys.stderr)
    print(format_flags([*launcher, *megatron_flags(cfg, expand=not args.keep_vars)]))
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    from ..launch.planning.job_plan import job_plan
    from ..launch.output_files import check_output_file, write_output_file
    from ..launch.planning.plan import validate
    from ..launch.slurm.sbatch import sbatch_script
    from ..launch.slurm.lifecycle import home_warning

    cfg, notes = load_for_command(args)
    validate(cfg)
    text = sbatch_script(cfg, args.config, partition=args.partition, time=args.time,
                         account=args.account, job_name=args.job_name, setup=args.setup,
                         run_name=args.run_name)
    if args.output:
        out, where = Path(args.output), ""
    else:  # never beside the sources: runs/ is where jobs write, and git ignores it
        out = Path("runs") / f"{Path(args.config).stem}-{cfg.cluster.nodes}n.sbatch"
        where = " (the default place, under the current folder; -o FILE to choose)"
        out.parent.mkdir(parents=True, exist_ok=True)
    option = "-o" if args.output else "the default script"
    check_output_file(out, option, args.force, reads=[args.config])
    write_output_file(out, text, option, args.force, executable=True)
    for note in notes:
        print(f"note: {note}")
    plan = job_plan(cfg, args.time)
    print("\n".join(plan.lines()))
    warning = home_warning(cfg, plan, os.environ, Path.cwd())
    if warning:
        print(warning)
    print(f"wrote {out}{where}: sbatch {out}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from ..launch.data.dataset import DataError, tokenize_jsonl

    if args.sample_corpus is not None:
        from ..launch.data.sample import DEFAULT_VOCAB_SIZE, existing_sample, write_sample

        given = [name for name, value in (("CORPUS", args.corpus), ("--tokenizer", args.tokenizer),
                                          ("--output-prefix", args.output_prefix)) if value]
        if given:
            raise DataError(f"--sample-corpus makes its own corpus, tokenizer and prefix; "
                            f"drop {', '.join(given)}")
        vocab = args.vocab_size or DEFAULT_VOCAB_SIZE
        if args.keep_existing:
            if args.force:
                raise DataError("--keep-existing keeps a complete sample and --force replaces "
                                "it: pass one of them")
            kept = existing_sample(args.sample_corpus, vocab)
            if kept:
                print(kept)
                return 0
        print(write_sample(args.sample_corpus, vocab,
                           force=args.force).describe())
        return 0
    if args.keep_existing:
        raise DataError("--keep-existing keeps the sample of --sample-corpus; for a corpus of "
                        "your own, outputs that exist need --force")
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


def cmd_tune(args: argparse.Namespace) -> int:
    """Measure this host with `megatron_burst.tools.tune` on its GPUs (or on CPU gloo ranks)."""
    from ..tools.tune import check_outputs

    check_outputs(args.out, args.force)  # before torchrun starts ranks that would fail on it
    import torch

    nproc = args.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    if nproc == 1:
        print("note: one rank measures no link: the profile's link rates are copied from its "
              "base profile, not measured here; use --nproc 2 or more", file=sys.stderr)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "-m", "megatron_burst.tools.tune", "--out", args.out]
    command += [flag for flag, on in (("--quick", args.quick), ("--force", args.force)) if on]
    print(" ".join(shlex.quote(c) for c in command), flush=True)
    env = {**os.environ, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
    return subprocess.call(command, env=env)
