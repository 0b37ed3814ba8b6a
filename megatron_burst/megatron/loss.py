"""The loss this package's entry point trains on, with the checks Megatron-LM's own takes.

Megatron-LM's `pretrain_gpt.py` sums the token losses under the loss mask and, before the
data-parallel all-reduce, hands the sum to Megatron's rerun state machine: a NaN or an Inf
stops the run (``--check-for-nan-in-loss-and-grad``, on by default) and a loss ten times the
largest seen is reported (``--check-for-spiky-loss``). This package's entry point
(`megatron_burst.megatron.pretrain_gpt`) took the same flags and skipped both checks, so a
run through it trained on through a NaN that the patched upstream script would have
stopped, and its steps were faster only for skipping them (each check reads the loss back
to the host: one sync a micro-batch). Both ways in now check alike.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

# Megatron-LM's pretrain_gpt.py: a spiky loss is ten times the largest seen.
SPIKY_LOSS_FACTOR = 10


def token_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor, args: Any
               ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(the token-summed loss, the token count, the 'lm loss' report Megatron logs), after
    the loss checks ``args`` asks for (``check_for_nan_in_loss_and_grad``,
    ``check_for_spiky_loss``), run as Megatron-LM's ``loss_func`` runs them."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
    check_loss(loss, args)
    return loss, num_tokens, report


def check_loss(loss: torch.Tensor, args: Any) -> None:
    """Megatron-LM's checks of a micro-batch's local loss, before the data-parallel
    all-reduce: NaN and Inf stop the run, a spiky loss is reported."""
    nan_check = getattr(args, "check_for_nan_in_loss_and_grad", True)
    spiky_check = getattr(args, "check_for_spiky_loss", False)
    if not (nan_check or spiky_check):
        return
    from megatron.core.rerun_state_machine import get_rerun_state_machine

    machine = get_rerun_state_machine()
    if nan_check:
        for reject, what in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            machine.validate_result(result=loss, rejection_func=reject,
                                    message=f"found {what} in local forward loss calculation",
                                    tolerance=0.0, fatal=True)
    if spiky_check:
        machine.validate_result(
            result=loss, rejection_func=partial(machine.is_unexpectedly_large,
                                                threshold=SPIKY_LOSS_FACTOR, context="loss"),
            message="Spiky loss", tolerance=0.0, fatal=False)
