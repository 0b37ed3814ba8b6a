"""The CPU run's ranks forked from a warm forkserver instead of spawned, for tests of what the
job computes (not of how it starts): a spawned rank spends seconds importing torch and
megatron-core, a forked one none.

``WarmStart`` stands in for ``torch.multiprocessing`` in ``megatron_burst.tools.cpu_run``:
its "spawn" context is multiprocessing's forkserver (one per session, those modules
preloaded), whose processes take the environment of the moment they start, as spawned ones
do (a forkserver's children would otherwise get the server's). Everything else in the
launcher (its queue, the exit-code polling, the failure reports) runs as it is.
"""
from __future__ import annotations

import multiprocessing
import os
from multiprocessing.context import ForkServerProcess

PRELOAD = ["torch", "torch.distributed", "megatron.core", "megatron.core.models.gpt",
           "megatron_burst.tools.cpu_run", "megatron_burst.tools.cpu_model",
           "megatron_burst.megatron.spec", __name__]


def _with_environment(env: dict, target, args, kwargs) -> None:
    os.environ.clear()
    os.environ.update(env)
    target(*args, **kwargs)


class _Process(ForkServerProcess):
    """A forkserver process that carries the environment of the moment it starts."""

    def start(self) -> None:
        self._args = (dict(os.environ), self._target, self._args, self._kwargs)
        self._target, self._kwargs = _with_environment, {}
        super().start()


class _Context:
    """The forkserver context (modules preloaded), with ``_Process`` for its processes."""

    Process = _Process

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)


_CONTEXT: _Context | None = None


class WarmStart:
    """``mp`` for ``cpu_run``: ``get_context("spawn")`` gives the warm forkserver context."""

    def get_context(self, method: str | None = None) -> _Context:
        global _CONTEXT
        assert method == "spawn", method
        if _CONTEXT is None:
            _CONTEXT = _Context()
        return _CONTEXT
