"""The ``megatron-burst`` command, the package's top layer: it starts launch steps and tools.

``parser`` reads the command line (``main`` is the console script), ``commands`` runs the
commands that read a config or write files (plan, flags, slurm, data, tune) and
``run_command`` runs ``run`` (torchrun over the GPUs, or the CPU trainer of
``megatron_burst.tools``). It sits above both launch and tools so that neither imports the
other's caller.
"""
from .parser import main

__all__ = ["main"]
