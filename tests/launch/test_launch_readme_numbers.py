"""The README's numbers about the launch layer come from the code: the quick start's from the
configs and constants, the plan's claims from `plan` now against the measurements on file.
A change to the memory or time model, a config or a constant fails here until the README says
the same."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re

import pytest

from megatron_burst.launch.planning.memory import GIB, estimate_memory
from megatron_burst.tools.calibration import rows
from megatron_burst.launch.config.schema import SlurmConfig, load_config
from megatron_burst.launch.planning.job_plan import job_plan
from megatron_burst.launch.config.slurm_time import parse_time_limit
from megatron_burst.launch.planning.units import format_bytes
from megatron_burst.launch.planning.step_time import REST_PASSES, STEP_MARGIN, predict_step
from megatron_burst.tools.cpu_data import SUCCESSORS

from tests.readme import RESULTS
from tests.readme import says as _says

from .conftest import CONFIGS, REPO

MIB = 2 ** 20


def test_quick_start_numbers_are_the_configs():
    from megatron_burst.launch.data.sample import DEFAULT_VOCAB_SIZE

    tiny = load_config(REPO / "configs" / "tiny-llama-cpu.yaml")
    p = tiny.parallel
    _says(f"trained with CP={p.context} x TP={p.tensor} on {tiny.cluster.gpus_per_node} CPU ranks")
    _says(f"every token has {SUCCESSORS} possible successors")
    _says(f"ln {SUCCESSORS} = {math.log(SUCCESSORS):.3f}")
    text = load_config(REPO / "configs" / "tiny-llama-cpu-text.yaml")
    _says(f"trains a {DEFAULT_VOCAB_SIZE}-token byte-level BPE")
    _says(f"in windows of {text.model.seq_length + 1} tokens for {text.training.train_iters} "
          f"iterations")
    _says(f"ln {text.model.vocab_size} = {math.log(text.model.vocab_size):.2f}")
    _says("megatron-burst data --sample-corpus data/sample --keep-existing && megatron-burst "
          "run configs/tiny-llama-cpu-text.yaml")


def _allocations_gib(cfg) -> float:
    """What `plan` expects Megatron to allocate: its total without the reserve."""
    mem = estimate_memory(cfg)
    return (mem.total - mem.reserved) / GIB


def _as_run(run: dict):
    """The config a benchmark run used: its file at the run's length and batch."""
    cfg = load_config(REPO / run["config"])
    s = run["seq_length"]
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, seq_length=s, max_position_embeddings=s),
        training=dataclasses.replace(cfg.training, global_batch_size=run["global_batch_size"]))


def test_four_gpu_memory_claim_is_the_plans():
    check = json.loads((RESULTS / "megatron_h200x4.json").read_text())["memory_check"]
    cfg = load_config(REPO / check["config"])
    planned, measured = _allocations_gib(cfg), check["measured_max_allocated_MiB"] * MIB / GIB
    mem = estimate_memory(cfg)
    _says(f"within {100 * abs(planned / measured - 1):.1f}% of Megatron's measured peak "
          f"allocation ({planned:.2f} vs {measured:.2f} GiB; `plan` prints "
          f"{mem.total / GIB:.2f} GiB, which adds the {mem.reserved / GIB:.2f} GiB it reserves")


def test_eight_gpu_claims_are_the_plans():
    runs = json.loads((RESULTS / "megatron_h200x8.json").read_text())["runs"]
    errors: dict[str, float] = {}
    speeds: dict[tuple[str, int], tuple[float, float, float]] = {}
    for run in runs:
        kind = "CP" if "cp8" in run["name"] else "TP"
        cfg = _as_run(run)
        error = abs(_allocations_gib(cfg) / (run["max_allocated_MiB"] * MIB / GIB) - 1)
        errors[kind] = max(errors.get(kind, 0.0), error)
        step = predict_step(cfg)
        bare = dataclasses.replace(step, rest_passes=0.0)
        speeds[kind, run["seq_length"]] = (step.tokens_per_s_per_gpu,
                                           run["tokens_per_s"] / run["gpus"],
                                           bare.tokens_per_s_per_gpu)
    _says(f"predicted each peak within {100 * errors['CP']:.1f}% (CP) and "
          f"{100 * errors['TP']:.1f}% (TP)")

    def k(x: float) -> str:
        return f"{x / 1e3:.1f}K"

    cp, tp = ([speeds[kind, s] for s in (131072, 262144)] for kind in ("CP", "TP"))
    _says(f"for CP=8 it predicts {k(cp[0][0])} and {k(cp[1][0])} tokens/s per GPU at 128K and "
          f"256K where {k(cp[0][1])} and {k(cp[1][1])} were measured (TP=8: {k(tp[0][0])} and "
          f"{k(tp[1][0])} against {k(tp[0][1])} and {k(tp[1][1])}); before the calibration "
          f"{k(cp[0][2])} and {k(cp[1][2])}")
    slowest = max(predicted / measured for predicted, measured, _ in speeds.values())
    assert 1 + STEP_MARGIN > slowest, "a job's time margin must cover the measured shortfall"
    ratios = [bare / measured for _, measured, bare in speeds.values()]
    _says(f"its step time before the calibration {min(ratios) - 1:.0%}-"
          f"{max(ratios) - 1:.0%} optimistic")


def test_calibration_claims_are_the_fit():
    table, _ = rows(RESULTS)
    errors = [abs(r.error(REST_PASSES)) for r in table]
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    _says(f"fitted to the {len(table)} end-to-end runs on file")
    _says(f"{REST_PASSES:g} passes over each token's (hidden + ffn) row")
    _says(f"the step time's error is at most {max(errors):.0%} (root mean square {rms:.0%}; "
          f"{max(abs(r.error(0)) for r in table):.0%} before)")
    _says(f"a job's time adds {STEP_MARGIN:.0%}")


def test_slurm_example_is_the_plans():
    from megatron_burst.launch.planning import job_plan as jobs
    from megatron_burst.launch.config.schema import ClusterConfig

    docs = " ".join((REPO / "docs" / "configs.md").read_text().split())
    for text in (f"the shortest of {jobs.DEFAULT_ALLOCATION_MIN // 60} hours, `slurm.max_time` and the "
                 f"whole job",
                 f"at most {jobs.SAVE_SHARE:.0%} of training and at most one per "
                 f"{jobs.MIN_SAVE_EVERY_MIN} minutes"):
        _says(text)
        assert text in docs, text
    _says(f"(default {ClusterConfig.checkpoint_write_gbps:g} GB/s: set your file system's)")
    _says(f"one more step, the save twice over and {jobs.TEARDOWN_MIN} minutes of tear-down")
    assert jobs.SAVE_SAFETY == 2
    plan = job_plan(load_config(REPO / "configs" / "llama2-70b-128k.yaml"))
    _says(f"`llama2-70b-128k` asks for --time {plan.limit} and expects {plan.allocations} "
          f"allocations, a {plan.checkpoint_bytes / GIB:.0f} GiB checkpoint every "
          f"{plan.save_interval} iterations, and Megatron's exit {plan.exit_margin_min} "
          f"minutes before the limit; it holds at most {plan.checkpoints_on_disk} checkpoints "
          f"({format_bytes(plan.checkpoints_on_disk * plan.checkpoint_bytes)}) on disk, where "
          f"keeping every one would take {plan.train_iters // plan.save_interval}")
    _says(f"`slurm.keep_checkpoints` (default {SlurmConfig.keep_checkpoints})")
    _says(f"(default {int(parse_time_limit(SlurmConfig.max_time) / 1440)} days; `scontrol show "
          f"partition` shows yours)")
    four = load_config(REPO / "configs" / "llama3.2-1b-128k-4gpu.yaml").cluster
    _says(f"(`llama3.2-1b-128k-4gpu`, {four.gpus_per_node} of a node's "
          f"{four.hardware.node_gpus})")


def test_readme_says_what_sbatch_does_with_the_environment_and_cites_the_repo_only():
    """Issue 43: the README said a batch job does not inherit the submitting shell's
    environment (sbatch's default --export=ALL passes it) and cited a file outside the
    repository."""
    text = (REPO / "README.md").read_text()
    _says("`sbatch` passes the submitting shell's environment to the job (its default "
          "`--export=ALL`)")
    assert "does not start in your shell" not in text and "not inherit" not in text
    outside = re.findall(r"`(\.\./[^`]*)`", text)
    assert outside == [], f"the README cites files outside the repository: {outside}"


def test_projection_table_is_generated_by_the_projection():
    """The README's projection table is benchmarks/projection.py's output, and its claim
    that the link speed changes nothing holds for every row."""
    spec = importlib.util.spec_from_file_location("projection",
                                                  REPO / "benchmarks" / "projection.py")
    projection = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(projection)
    rows = projection.project([25.0, 50.0], projection.README_CONFIGS)
    text = (REPO / "README.md").read_text()
    assert projection.with_readme_table(text, projection.readme_table(rows)) == text, (
        "the README's projection table is stale: python benchmarks/projection.py --readme "
        "README.md")
    for name in projection.README_CONFIGS:  # only the last accumulator's trip home waits
        at = {r["inter_gbps"]: r for r in rows if r["config"] == name}
        assert abs(at[25.0]["step_s"] / at[50.0]["step_s"] - 1) < 0.001, name
    _says("so the step time and tokens/s per GPU are within 0.1% of each other at both speeds")


def test_remat_claim_is_the_plans():
    runs = json.loads((RESULTS / "megatron_remat_h200x2.json").read_text())["runs"]
    plain, remat = (r for r in runs if "remat" not in r["name"]), (
        r for r in runs if "remat-aware" in r["name"])
    plain, remat = next(plain), next(remat)

    def cfg_of(run: dict, remat_aware: bool):
        cfg = _as_run(run)
        return dataclasses.replace(
            cfg, parallel=dataclasses.replace(cfg.parallel, context=run["gpus"]),
            cluster=dataclasses.replace(cfg.cluster, gpus_per_node=run["gpus"]),
            training=dataclasses.replace(cfg.training, recompute="full"),
            burst=dataclasses.replace(cfg.burst, remat_aware=remat_aware))

    planned = (estimate_memory(cfg_of(remat, True)).activations
               - estimate_memory(cfg_of(plain, False)).activations) / GIB
    measured = (remat["max_allocated_MiB"] - plain["max_allocated_MiB"]) * MIB / GIB
    _says(f"(plan: +{planned:.2f} GiB, measured +{measured:.2f})")


@pytest.mark.parametrize("name", [p.stem for p in CONFIGS])
def test_config_table_tokens_are_the_configs(name):
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    row = next(line for line in (REPO / "README.md").read_text().splitlines()
               if line.startswith("| `") and f"`{name}.yaml`" in line.split("|")[1])
    names = [cell.strip("` ") for cell in row.split("|")[1].split(",")]
    tokens = [cell.strip() for cell in row.split("|")[3].split(",")]
    s = cfg.model.seq_length
    expected = (f"{s // 2 ** 20}M" if s >= 2 ** 20 else f"{s // 1024}K" if s >= 1024
                else str(s))
    assert tokens[names.index(f"{name}.yaml")] == expected
