"""The numbers at the top of each shipped config, written from the plan so they cannot drift.

A config in configs/ opens with comment lines: first what the run is for and why it is laid
out so, by hand and without numbers (a number typed there drifts from the code that computes
it), then a block between two marker lines that this module writes from the functions `plan`
prints with: topology, memory per GPU, the ring's bytes and time (a sliding-window layer's
apart), the step and the job.

    python -m megatron_burst.tools.config_header configs/*.yaml           # rewrite the blocks
    python -m megatron_burst.tools.config_header --check configs/*.yaml   # exit 1 if stale

A test regenerates every block and compares, and checks that no number is written by hand.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from ..launch.config.schema import Config, load_config
from ..launch.config.hardware import HARDWARE
from ..launch.planning.job_plan import job_plan
from ..launch.planning.topology_candidates import chosen_prediction
from ..launch.planning.memory import GIB, estimate_memory
from ..launch.planning.report import ring_traffic, window_figures
from ..launch.planning.step_time import format_duration, predict_step
from ..launch.planning.units import format_bytes

BEGIN = "# --- from `megatron-burst plan` (python -m megatron_burst.tools.config_header); do not edit:"
END = "# --- end of the plan's lines"
WIDTH = 92


def _sentences(cfg: Config) -> list[str]:
    m, p, c, tr = cfg.model, cfg.parallel, cfg.cluster, cfg.training
    mem = estimate_memory(cfg)
    device = HARDWARE[c.gpu].memory_gib
    parts = ", ".join(f"{label} {format_bytes(n)}" for label, n in mem.rows()[:-1])
    out = [
        f"{m.name}, {m.seq_length:,} tokens per sequence: TP={p.tensor} CP={p.context} "
        f"PP={p.pipeline} DP={p.data}{' +SP' if p.sequence_parallel and p.tensor > 1 else ''} "
        f"on {c.nodes} x {c.gpus_per_node} {c.gpu}, {m.seq_length // p.context:,} tokens per "
        f"CP rank, recompute {tr.recompute}.",
        f"Memory per {'GPU' if c.hardware.timed else 'rank'} ({mem.stage} pipeline stage): "
        f"{format_bytes(mem.total)} of "
        f"{device:g} GiB ({100 * mem.total / (device * GIB):.0f}%): {parts}.",
    ]
    if p.context > 1:
        t = ring_traffic(cfg)
        line = (f"Attention: {t['topology'].describe()}; per layer and microbatch a rank sends "
                f"at most {format_bytes(t['forward'])} forward and {format_bytes(t['backward'])} "
                f"backward")
        if c.hardware.timed:
            pred = chosen_prediction(cfg)
            line += (f", and the time model ({c.profile_name}) predicts "
                     f"{pred.total_s * 1e3:.2f} ms fwd+bwd, {pred.exposed_comm_s * 1e3:.2f} ms "
                     f"of it waiting on links")
        out.append(line + ".")
        out += _window_sentence(cfg)
    step = predict_step(cfg)
    if step is None:
        out.append(f"Times: not predicted for {c.gpu} ranks.")
    else:
        out.append(f"Step: {format_duration(step.step_s)} ({step.microbatches} "
                   f"microbatch(es)), {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU "
                   f"{100 * step.mfu:.0f}%; training.train_iters {tr.train_iters:,}: "
                   f"{format_duration(tr.train_iters * step.step_s)}.")
        job = job_plan(cfg)
        out.append(f"Job (`slurm`): {job.allocations} allocation(s) of --time {job.limit}; a "
                   f"{format_bytes(job.checkpoint_bytes)} checkpoint every {job.save_interval:,} "
                   f"iterations ({format_duration(job.save_s)} each at "
                   f"{job.write_gbps:g} GB/s); exit {job.exit_margin_min} min before the "
                   f"limit.")
    return out


def _window_sentence(cfg: Config) -> list[str]:
    """The sliding-window layers' bytes and time, where the model has them."""
    m = cfg.model
    figures = window_figures(cfg)
    if figures is None:
        return []
    pred, fwd, bwd = figures
    line = (f"Sliding-window layers ({m.window_layers(1, m.num_layers)} of {m.num_layers}): "
            f"the busiest rank sends {format_bytes(fwd)} forward and {format_bytes(bwd)} "
            f"backward")
    if cfg.cluster.hardware.timed:
        line += (f", and the time model predicts {pred.total_s * 1e3:.2f} ms fwd+bwd, "
                 f"{pred.exposed_comm_s * 1e3:.2f} ms of it waiting on links")
    return [line + "."]


def generated_block(cfg: Config) -> list[str]:
    """The marker lines and, between them, the plan's sentences wrapped as comments."""
    lines = [BEGIN]
    for sentence in _sentences(cfg):
        lines += textwrap.wrap(sentence, WIDTH, initial_indent="# ",
                               subsequent_indent="#   ", break_on_hyphens=False)
    return lines + [END]


def split_header(text: str) -> tuple[list[str], list[str], list[str]]:
    """(hand-written comment lines, generated lines, the rest of the file)."""
    lines = text.split("\n")
    top = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    header, rest = lines[:top], lines[top:]
    if BEGIN in header and END in header:
        begin, end = header.index(BEGIN), header.index(END)
        return header[:begin] + header[end + 1:], header[begin:end + 1], rest
    return header, [], rest


def with_generated_block(text: str, cfg: Config) -> str:
    """``text`` with its generated block replaced (or added, after the hand-written lines)."""
    hand, _, rest = split_header(text)
    while hand and hand[-1] == "#":
        hand.pop()
    return "\n".join([*hand, "#", *generated_block(cfg), *rest])


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or, with --check, compare) the generated blocks of the given configs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="+", type=Path, help="config files to update")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming each config whose block is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in args.configs:
        text = path.read_text()
        fresh = with_generated_block(text, load_config(path))
        if fresh != text:
            stale.append(str(path))
            if not args.check:
                path.write_text(fresh)
    if stale:
        verb = "stale" if args.check else "rewrote"
        print(f"{verb}: {' '.join(stale)}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
