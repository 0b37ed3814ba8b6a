"""`megatron-burst plan`: whether a config can run, and what it costs.

- ``plan``: the checks (``validate``) and the plan (``make_plan``); ``report`` the text it
  prints; sizes and counts in ``units``;
- ``memory``: per GPU (``attention_params``: one attention layer's parameters and what it
  keeps per token);
- ``topology_candidates``: the topologies of the CP group, ranked by the time model;
- ``step_time``: one training step and the job built on it; ``job_plan``: the job as SLURM
  runs it (allocations of a length partitions take, saves that fit them).
"""
