"""`megatron-burst slurm`: a config as an sbatch script that carries the run through its jobs.

- ``sbatch``: the script (``sbatch_script``), its directives and the training line;
- ``preflight``: what the script checks before training (the environment, imports, the
  ${VARIABLES} the config leaves to the cluster);
- ``lifecycle``: the run's folder, the signals that make training save, the requeue;
- ``checkpoint_retention``: the checkpoints a run keeps, watched while it trains (the script
  runs it with ``python -m``).
"""
