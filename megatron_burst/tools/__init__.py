"""Tools around the attention core: they measure, emulate, demonstrate and train on CPU.

- `tune`: `megatron-burst tune` (``python -m megatron_burst.tools.tune`` under torchrun)
  measures a cluster's links, kernel and overheads into the profile the time model reads.
- `emulate`: makes one host's GPUs behave as virtual nodes joined by a slower link, for
  benchmarks; switched on by ``$MEGATRON_BURST_EMULATE`` (`megatron_burst.link_emulation`).
- `demo`: ``python -m megatron_burst.tools.demo`` shows BurstAttention on CPU ranks equal to
  one-process attention.
- the CPU trainer of `megatron-burst run`: `cpu_run` starts gloo ranks that each run
  `cpu_rank`, with megatron-core's model from `cpu_model`, the CUDA-only call sites patched
  by `cpu_shims` and the batches of `cpu_data`.

Layering: tools import the core (``megatron_burst`` top level, ``megatron_burst.megatron``)
and the launch layer's config schema; the core never imports tools (but for the emulator's
switch, `link_emulation.maybe_emulate_links`, which imports `emulate` only once
``$MEGATRON_BURST_EMULATE`` is set), and of the launch layer only the CLI's commands do, to
start `tune` and `run` on CPU ranks. tests/test_tools_layering.py checks it.
"""
