"""Tools around the attention core: they measure, demonstrate and train on CPU.

- `tune`: `megatron-burst tune` (``python -m megatron_burst.tools.tune`` under torchrun)
  measures a cluster's links, kernel and overheads into the profile the time model reads.
- `demo`: ``python -m megatron_burst.tools.demo`` shows BurstAttention on CPU ranks equal to
  one-process attention.
- the CPU trainer of `megatron-burst run`: `cpu_run` starts gloo ranks that each run
  `cpu_rank`, with megatron-core's model from `cpu_model`, the CUDA-only call sites patched
  by `cpu_shims` and the batches of `cpu_data`.
- the numbers shipped beside the planner, kept honest: `config_header` writes the plan's
  numbers into the configs' headers (``python -m megatron_burst.tools.config_header``), and
  `calibration` holds the step time against the end-to-end runs on file (`measured_runs`).

Layering: tools import the core, the Megatron adapter and the launch layer; nothing below
imports them, and only the command line (``megatron_burst.cli``) starts them (the
maintenance tools run by ``python -m``; tests/test_layering.py checks it).
"""
