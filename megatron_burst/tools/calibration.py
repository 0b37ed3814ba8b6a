"""Calibrate the step time's non-attention part against the end-to-end runs on file, and say
how far every prediction is from what was measured.

    python -m megatron_burst.tools.calibration benchmarks/results          # the table
    python -m megatron_burst.tools.calibration benchmarks/results --check  # exit 1 if stale

What is calibrated on what: attention stays the time model's (``timing.predict`` with the
profile `megatron-burst tune` measured; the same time `auto` chooses topologies by), and so do
the matmuls at the GPU's measured GEMM rate, the TP collectives and the logits. The one
fitted number is ``step_time.REST_PASSES``: what the rest of every layer costs, as passes over
each token's (hidden + ffn) row at the memory rate, fitted by least squares on the relative
error of the step time over every comparable run in ``measured_runs`` (all on H200, 1-8
GPUs, head dim 64, 4-16 layers). It absorbs whatever those runs spent beyond the modelled
parts, including any shortfall of the attention kernel at head dim 64 against tune's
measurement at 128; on other GPUs it is an extrapolation at their memory rate.
``step_time.STEP_MARGIN`` is the calibrated model's worst under-prediction on the same runs,
rounded up to 5%: what a job's time limit adds.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from ..launch.planning import step_time
from .measured_runs import MeasuredRun, read_runs
from ..launch.planning.step_time import predict_step

MARGIN_STEP = 0.05  # STEP_MARGIN is rounded up to a multiple of this
PASSES_STEP = 0.5  # REST_PASSES is rounded to a multiple of this


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured run against the model without the calibrated part and with it."""

    run: MeasuredRun
    uncalibrated_s: float
    one_pass_s: float  # what one pass of the rest adds to the step

    def predicted_s(self, passes: float) -> float:
        return self.uncalibrated_s + passes * self.one_pass_s

    def error(self, passes: float) -> float:
        """Predicted over measured, minus one (negative: the model is optimistic)."""
        return self.predicted_s(passes) / self.run.step_s - 1


def rows(results: Path) -> tuple[list[Row], list[tuple[str, str]]]:
    """The comparable runs with their predictions, and the runs left out with why."""
    runs, skipped = read_runs(results)
    out = []
    for run in runs:
        step = predict_step(run.cfg)
        bare = dataclasses.replace(step, rest_passes=0.0)
        one = dataclasses.replace(step, rest_passes=1.0)
        out.append(Row(run, bare.step_s, one.step_s - bare.step_s))
    return out, skipped


def fit_passes(table: list[Row]) -> float:
    """The passes that minimise the summed squared relative error (closed form: one
    parameter), rounded to PASSES_STEP, never below 0."""
    num = sum((r.run.step_s - r.uncalibrated_s) * r.one_pass_s / r.run.step_s ** 2 for r in table)
    den = sum(r.one_pass_s ** 2 / r.run.step_s ** 2 for r in table)
    return max(0.0, round(num / den / PASSES_STEP) * PASSES_STEP)


def margin(table: list[Row], passes: float) -> float:
    """The worst under-prediction (measured over predicted, minus one), rounded up."""
    worst = max(r.run.step_s / r.predicted_s(passes) - 1 for r in table)
    return math.ceil(round(worst / MARGIN_STEP, 6)) * MARGIN_STEP


def report(table: list[Row], skipped: list[tuple[str, str]], passes: float) -> str:
    """The table: every run, measured, predicted before and after, and the errors."""
    out = [f"step time against {len(table)} measured end-to-end runs "
           f"(rest of each layer: {passes:g} passes; error = predicted / measured - 1)",
           "| run | GPUs | measured | uncalibrated | error | calibrated | error |",
           "|---|---|---|---|---|---|---|"]
    for r in table:
        source = r.run.source.removeprefix("megatron_").removesuffix(".json")
        out.append(f"| {source}: {r.run.name} | {r.run.cfg.cluster.world_size} | "
                   f"{r.run.step_s * 1e3:,.0f} ms | {r.uncalibrated_s * 1e3:,.0f} ms | "
                   f"{r.error(0):+.0%} | {r.predicted_s(passes) * 1e3:,.0f} ms | "
                   f"{r.error(passes):+.0%} |")
    errors = [abs(r.error(passes)) for r in table]
    out.append(f"calibrated: |error| at most {max(errors):.0%}, root mean square "
               f"{math.sqrt(sum(e * e for e in errors) / len(errors)):.0%}; uncalibrated at "
               f"most {max(abs(r.error(0)) for r in table):.0%}; job margin "
               f"{margin(table, passes):.0%}")
    out += [f"left out: {label} ({why})" for label, why in skipped]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the calibration table; --check: exit 1 if step_time's constants are not the fit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="the folder of megatron_*.json results")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if REST_PASSES or STEP_MARGIN differ from the fit")
    args = parser.parse_args(argv)
    table, skipped = rows(args.results)
    if not table:
        print(f"error: no comparable run under {args.results}", file=sys.stderr)
        return 2
    passes = fit_passes(table)
    print(report(table, skipped, passes))
    fitted = (passes, margin(table, passes))
    shipped = (step_time.REST_PASSES, step_time.STEP_MARGIN)
    print(f"fit: REST_PASSES = {fitted[0]:g}, STEP_MARGIN = {fitted[1]:.2f} "
          f"(step_time.py has {shipped[0]:g}, {shipped[1]:.2f})")
    return 1 if args.check and not all(math.isclose(a, b) for a, b in zip(fitted, shipped)) else 0


if __name__ == "__main__":
    sys.exit(main())
