"""The package's entry point checks its loss as Megatron-LM's pretrain_gpt.py does.

`--check-for-nan-in-loss-and-grad` (Megatron's default) must stop a run whose loss is NaN or
Inf, and `--no-check-for-nan-in-loss-and-grad` must not; `--check-for-spiky-loss` reports
a loss ten times the largest seen. The entry point took these flags and ignored them.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core import rerun_state_machine  # noqa: E402

from megatron_burst.megatron.loss import token_loss  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_state_machine(monkeypatch):
    """Megatron's rerun state machine is a process-wide singleton: each test gets its own.
    Its error names the CUDA device, which a CPU machine has none of."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    rerun_state_machine.destroy_rerun_state_machine()
    rerun_state_machine.initialize_rerun_state_machine()
    yield
    rerun_state_machine.destroy_rerun_state_machine()


def _args(nan: bool = True, spiky: bool = False) -> SimpleNamespace:
    return SimpleNamespace(check_for_nan_in_loss_and_grad=nan, check_for_spiky_loss=spiky)


def test_the_loss_is_the_masked_token_sum_and_its_report() -> None:
    gen = torch.Generator().manual_seed(0)
    losses = torch.rand(2, 37, generator=gen, dtype=torch.float64)
    mask = (torch.rand(2, 37, generator=gen) > 0.3).float()
    loss, tokens, report = token_loss(mask, losses, _args())
    assert torch.equal(loss, torch.sum(losses.view(-1).float() * mask.view(-1)))
    assert tokens.item() == int(mask.sum()) and tokens.dtype == torch.int
    assert torch.equal(report["lm loss"], torch.stack([loss.detach(), tokens.float()]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_loss_stops_the_run_unless_the_check_is_off(bad: float) -> None:
    losses = torch.ones(1, 8)
    losses[0, 3] = bad
    with pytest.raises(RuntimeError, match="NaN|Inf"):
        token_loss(torch.ones(1, 8), losses, _args(nan=True))
    loss, _, _ = token_loss(torch.ones(1, 8), losses, _args(nan=False))
    assert not torch.isfinite(loss)


def test_a_spiky_loss_is_reported_not_fatal(caplog) -> None:
    args = _args(nan=False, spiky=True)
    for _ in range(100):  # Megatron learns the largest loss from its first 100
        token_loss(torch.ones(1, 4), torch.ones(1, 4), args)
    assert not any("Spiky loss" in r.getMessage() for r in caplog.records)
    token_loss(torch.ones(1, 4), torch.full((1, 4), 1000.0), args)  # must not raise
    assert any("Spiky loss" in r.getMessage() for r in caplog.records)
