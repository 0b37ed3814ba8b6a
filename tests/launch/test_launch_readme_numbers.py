"""The README's numbers about the launch layer come from the code: the quick start's from the
configs and constants, the plan's claims from `plan` now against the measurements on file.
A change to the memory or time model, a config or a constant fails here until the README says
the same."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from megatron_burst.launch.config import load_config
from megatron_burst.launch.memory import GIB, estimate_memory
from megatron_burst.launch.slurm import TIME_MARGIN
from megatron_burst.launch.step_time import predict_step
from megatron_burst.tools.cpu_data import SUCCESSORS

from tests.readme import RESULTS
from tests.readme import says as _says

from .conftest import CONFIGS, REPO

MIB = 2 ** 20


def test_quick_start_numbers_are_the_configs():
    from megatron_burst.launch.sample_data import DEFAULT_VOCAB_SIZE

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
    _says(f"plus {TIME_MARGIN - 1:.0%}, start-up and the last save")


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
    speeds: dict[tuple[str, int], tuple[float, float]] = {}
    for run in runs:
        kind = "CP" if "cp8" in run["name"] else "TP"
        cfg = _as_run(run)
        error = abs(_allocations_gib(cfg) / (run["max_allocated_MiB"] * MIB / GIB) - 1)
        errors[kind] = max(errors.get(kind, 0.0), error)
        predicted = predict_step(cfg).tokens_per_s_per_gpu
        speeds[kind, run["seq_length"]] = (predicted, run["tokens_per_s"] / run["gpus"])
    _says(f"predicted each peak within {100 * errors['CP']:.1f}% (CP) and "
          f"{100 * errors['TP']:.1f}% (TP)")

    def k(x: float) -> str:
        return f"{x / 1e3:.1f}K"

    cp, tp = ([speeds[kind, s] for s in (131072, 262144)] for kind in ("CP", "TP"))
    _says(f"for CP=8 it predicted {k(cp[0][0])} and {k(cp[1][0])} tokens/s per GPU at 128K and "
          f"256K where {k(cp[0][1])} and {k(cp[1][1])} were measured (TP=8: {k(tp[0][0])} and "
          f"{k(tp[1][0])} against {k(tp[0][1])} and {k(tp[1][1])})")
    slowest = max(predicted / measured for predicted, measured in speeds.values())
    assert TIME_MARGIN > slowest, "slurm's time margin must cover the measured shortfall"


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
