"""Launch layer: YAML configs -> validated plans, Megatron flags, CPU runs, SLURM scripts, data.

`config` is the schema, `memory`, `attention_plan` and `plan` check a config fits and say
what it costs (in `units`), `flags` turns it into Megatron's command line, `slurm` into an
sbatch script, `cpu_run` trains it on CPU ranks (with `cpu_model`, `cpu_shims` and the
batches of `cpu_data`), `data` and `sample_data` write Megatron's indexed datasets from JSONL
text, `environment` says what the installed packages can run, and `cli` is the
`megatron-burst` command over all of them. The run's context-parallel layout is
`megatron_burst.cp_layout.CPLayout.from_run_config(cfg)`, read by all of them.
"""
