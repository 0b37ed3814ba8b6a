"""A run config: what a YAML file may say, read and checked once.

- ``schema``: the dataclasses of a config's sections, the strict loader (``load_config``) and
  ${VAR} expansion; ``file`` reads the YAML (plain data out, every mistake one line);
  ``values`` the rules of each value (ranges, text); ``model`` the ``model:`` section (the
  decoder's shape and its attention variant); ``hardware`` the accelerators
  ``cluster.gpu`` names; ``slurm_time`` time limits as ``sbatch --time`` reads them;
- ``burst``: the config's BurstAttention, decided: its options, what keeps them from the run,
  and the CP topology they resolve to (``topology_of``, the one resolver, once per config);
- ``owned_flags``: the Megatron flags the config's keys decide, so that ``megatron_args``
  cannot set them again, checked against Megatron's options by meaning
  (``megatron_options`` and its ``megatron_options.json``, with the arguments Megatron sets
  again after parsing read from its source by ``megatron_rewrites``).
"""
