"""The step time's calibrated part is the fit to the end-to-end runs on file, every run's error
is printed, and a job's margin covers the worst of them."""
from __future__ import annotations

import math

from megatron_burst.launch.planning import step_time
from megatron_burst.tools.calibration import fit_passes, main, margin, rows
from megatron_burst.tools.measured_runs import megatron_flags_of, read_runs

from tests.readme import RESULTS


def test_shipped_constants_are_the_fit(capsys):
    assert main([str(RESULTS), "--check"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    table, skipped = rows(RESULTS)
    # Every comparable run is printed with its measured error, and every other one with why.
    for row in table:
        assert f": {row.run.name} | {row.run.cfg.cluster.world_size} |" in out
        assert f"{row.error(step_time.REST_PASSES):+.0%} |" in out
    assert all(f"left out: {label} ({why})" in out for label, why in skipped)


def test_calibration_improves_every_measure_and_the_margin_covers_it():
    table, _ = rows(RESULTS)
    passes = fit_passes(table)

    def rms(p: float) -> float:
        return math.sqrt(sum(r.error(p) ** 2 for r in table) / len(table))

    assert rms(passes) < rms(0) and rms(passes) <= min(rms(passes - 10), rms(passes + 10))
    assert max(abs(r.error(passes)) for r in table) < max(abs(r.error(0)) for r in table)
    worst = max(r.run.step_s / r.predicted_s(passes) for r in table)
    assert worst <= 1 + margin(table, passes) < worst + 0.05
    # The planner as shipped predicts the calibrated step.
    for r in table:
        predicted = step_time.predict_step(r.run.cfg).step_s
        assert math.isclose(predicted, r.predicted_s(step_time.REST_PASSES), rel_tol=1e-9)


def test_runs_are_read_as_they_ran():
    runs, skipped = read_runs(RESULTS)
    assert len(runs) >= 10 and all(r.step_s > 0 for r in runs)
    eight = next(r for r in runs if r.name == "cp8 burst 256K")
    assert (eight.cfg.model.seq_length, eight.cfg.parallel.context) == (262144, 8)
    assert eight.cfg.training.global_batch_size == 1 and eight.cfg.cluster.gpu == "h200-141gb"
    reasons = {why for _, why in skipped}
    assert any("document masks" in why for why in reasons)
    assert any("upstream" in why for why in reasons)
    # The last occurrence of a flag wins, as in Megatron's parser.
    flags = megatron_flags_of("python -m torch.distributed.run -m "
                              "megatron_burst.megatron.pretrain_gpt --num-layers 16 --swiglu "
                              "--num-layers 4 --data-path 0.5 a 0.5 b")
    assert flags["--num-layers"] == ["4"] and flags["--swiglu"] == []
    assert flags["--data-path"] == ["0.5", "a", "0.5", "b"]
    assert megatron_flags_of("python pretrain_gpt.py --num-layers 4") is None
