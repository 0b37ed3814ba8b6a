"""Launch layer: YAML configs -> validated plans, Megatron flags, SLURM scripts, datasets.

A config is read, planned, started and scripted, each step a sub-package that imports only
those before it (``tests/test_layering.py``: ``LAUNCH_PARTS``):

- `config`: what a config may say: the schema and its loader, the values' rules, the model
  section, the accelerators, the config's BurstAttention decided (its CP topology, once per
  config), and the Megatron flags its keys own, checked against Megatron's options;
- `planning`: `megatron-burst plan`: whether it can run and what it costs: memory per GPU,
  the topologies ranked by the time model, the step and the job as SLURM runs it;
- `run`: the run as it starts: Megatron's command line and what it will import;
- `slurm`: `megatron-burst slurm`: the sbatch script, its checks before training, the
  run's folder, signals and requeue, and the checkpoints it keeps;
- `data`: `megatron-burst data`: Megatron's indexed datasets from JSONL text, switched in
  whole, one writer at a time, and the offline sample corpus.

Two modules stay at the top: `output_files` writes the one-file outputs of `slurm -o` and
`tune --out` (the datasets' files take its modes), and `login_checks` says what a machine
without GPUs can check of a GPU run (it reads all the others). The tools that keep the
shipped numbers honest (the configs' headers, the step time's calibration) are
`megatron_burst.tools`'. The `megatron-burst` command that starts these steps is
`megatron_burst.cli`; what the installed packages can run is
`megatron_burst.megatron.environment`'s.
"""
