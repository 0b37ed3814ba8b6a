"""Launch layer: YAML configs -> validated plans, Megatron flags, CPU runs, SLURM scripts, data.

The schema is `config` (with `config_values`, `config_file`, `hardware` and `owned_flags`:
value rules, the YAML reader, the accelerators, and the Megatron flags the keys decide, by
argparse destination and post-parse rewrites: `megatron_options`, `megatron_rewrites`).
`plan` checks a config can run; `plan_report` says what it costs: `memory` per GPU, the
topologies of the CP group ranked by the time model (`topology_candidates`) and the step and
job time built on them (`step_time`), sizes in `units`; `config_header` writes the plan's
numbers into the shipped configs. `flags` turns a config into Megatron's command line,
`slurm` into an sbatch script, `data` and `sample_data` write Megatron's indexed datasets
from JSONL text (`corpus` reads it; a version switched in by one link, under a lock:
`dataset_commit`, `dataset_lock`; the sample's other files: `staging`), `output_files` writes
the one-file outputs of `slurm -o` and `tune --out`, and `environment` says what the
installed packages can run. `cli` parses the `megatron-burst` command and hands it to `commands` or
`run_command`, which start the tools of `megatron_burst.tools` for `tune` and for `run` on
CPU ranks (`tools.cpu_run`). The run's context-parallel topology
is `resolve.topology_of(cfg)` (the one resolver, once per config), read by all of them.
"""
