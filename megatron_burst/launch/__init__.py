"""Launch layer: YAML configs -> validated plans, Megatron flags, CPU runs, SLURM scripts, data.

The schema is `config` (with `model_config`, `config_values`, `config_file`, `hardware` and
`owned_flags`: the model section, value rules, the YAML reader, the accelerators, and the
Megatron flags the keys decide, by argparse destination and post-parse rewrites:
`megatron_options` and its `megatron_options.json`, `megatron_rewrites`). `resolve` gives a
config's context-parallel topology (`topology_of(cfg)`: the one resolver, once per config),
read by all of them. `plan` checks a config can run; `plan_report` says what it costs:
`memory` per GPU (`attention_params`: one attention layer's parameters and what it keeps),
the topologies of the CP group ranked by the time model (`topology_candidates`) and the step and
job time built on them (`step_time`; `calibration` and `measured_runs` hold it against the
end-to-end runs on file), sizes in `units`; `config_header` writes the plan's numbers into
the shipped configs. `flags` turns a config into Megatron's command line; `slurm` into an
sbatch script (`job_plan`: allocations and saves; `slurm_time`: time limits as sbatch
reads them; `slurm_preflight`: the checks the script runs before training; `slurm_run`:
the run's folder, the signals that make training save, the requeue;
`checkpoint_retention`: the checkpoints a run keeps), `login_checks` what a machine without
GPUs can check of a GPU run, and
`runtime_deps` says what a planned run will import and which extra provides it. `data` and
`sample_data` write Megatron's indexed datasets from JSONL text (`corpus` reads it;
`data_error` is their one error; a version switched in by one link, under a lock:
`dataset_commit`, `dataset_lock`; the sample's other files: `staging`), and `output_files`
writes the one-file outputs of `slurm -o` and `tune --out`. The `megatron-burst` command
that starts them is `megatron_burst.cli`; what the installed packages can run is
`megatron_burst.megatron.environment`'s.
"""
