"""Launch layer: YAML configs -> validated plans, Megatron flags, CPU runs, SLURM scripts.

`config` is the schema, `memory` and `plan` check a config fits, `flags` turns it into
Megatron's command line, `slurm` into an sbatch script, `cpu_run` trains it on CPU ranks,
and `cli` is the `megatron-burst` command over all of them.
"""
