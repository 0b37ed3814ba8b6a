"""A planned run as it starts: Megatron's command line and what it imports.

- ``flags``: a config as the command line ``python -m megatron_burst.megatron.pretrain_gpt``
  takes (and the torchrun line around it);
- ``runtime_deps``: the modules the run will import, why, and which install extra provides
  each.
"""
