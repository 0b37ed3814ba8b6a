"""The gradient accumulators of a backward ring: this rank's own, and those that travel.

In both backward modes the gradients of a payload that visits other ranks (K/V in the
``ring`` mode, the queries in the ``burst`` mode) are summed where it is computed: each
holder from step 1 adds its part into an fp32 accumulator that follows the payload one
step behind (``comm.rings.AccumulatorRoute``, along the route the call's plan made) and
lands home after the payload's last use, where it is added to the home accumulator.
"""
from __future__ import annotations

import torch

from ..comm.rings import AccumulatorRoute
from .call_plan import StepPlan


class Travelling:
    """The gradient accumulators of one backward ring: this rank's own (home) and the
    ones of the payload it holds, which an ``AccumulatorRoute`` passes on from step 1."""

    def __init__(self, route: AccumulatorRoute | None, home: tuple[torch.Tensor, ...],
                 row_dim: int):
        self.route, self.home, self.row_dim = route, home, row_dim
        self._incoming = None  # the accumulator of the next step's payload, in flight
        self._returns: list = []
        self._batches: list = []

    def target(self, i: int, step: StepPlan) -> tuple[tuple[torch.Tensor, ...] | None, object]:
        """(tensors to add step ``i``'s gradients into, the travelling buffer or None)."""
        if i == 0 or self.route is None:
            return self.home, None
        acc = self.route.new(step.acc, zero=not step.acc_fresh)
        if acc is None:
            return None, None
        at = step.acc.held_at  # the held rows begin there in the accumulator
        return (acc.views if not at else tuple(
            t.narrow(self.row_dim, at, t.shape[self.row_dim] - at) for t in acc.views)), acc

    def pass_on(self, i: int, step: StepPlan, acc) -> None:
        """Fold in what earlier holders accumulated for this payload, and send it on."""
        if i == 0 or self.route is None:
            return
        if self._incoming is not None:
            for mine, theirs in zip(acc.views, self._incoming.wait()):
                mine += theirs
        self._incoming, home, batch = self.route.pass_on(step.acc, acc)
        if home is not None:
            self._returns.append((home, step.acc.home_runs or step.acc.home_at))
        self._batches.append(batch)

    def finish(self) -> tuple[torch.Tensor, ...]:
        """This rank's gradients: its own, plus what the other holders sent home."""
        for pending, at in self._returns:
            for mine, theirs in zip(self.home, pending.wait()):
                if isinstance(at, int):
                    mine.narrow(self.row_dim, at, theirs.shape[self.row_dim]).add_(theirs)
                    continue
                held = 0  # runs of the own rows (``AccumulatorStep.home_runs``), packed
                for a, z in at:
                    mine.narrow(self.row_dim, a, z - a).add_(
                        theirs.narrow(self.row_dim, held, z - a))
                    held += z - a
        for batch in self._batches:  # the sent buffers may be freed after this
            batch.wait()
        return self.home
