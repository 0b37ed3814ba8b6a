"""Tests of the launch layer: configs, plan, flags, sbatch scripts, the CLI and the CPU run."""
