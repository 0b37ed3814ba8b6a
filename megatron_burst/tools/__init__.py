"""Tools around the attention core: they measure, demonstrate and train on CPU.

- `tune`: `megatron-burst tune` (``python -m megatron_burst.tools.tune`` under torchrun)
  measures a cluster's links, kernel and overheads into the profile the time model reads.
- `demo`: ``python -m megatron_burst.tools.demo`` shows BurstAttention on CPU ranks equal to
  one-process attention.
- the CPU trainer of `megatron-burst run`: `cpu_run` starts gloo ranks that each run
  `cpu_rank`, with megatron-core's model from `cpu_model`, the CUDA-only call sites patched
  by `cpu_shims` and the batches of `cpu_data`.

Layering: tools import the core, the Megatron adapter and the launch layer's config schema;
nothing below imports them, and only the command line (``megatron_burst.cli``) starts them
(tests/test_layering.py checks it).
"""
