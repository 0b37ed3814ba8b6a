"""The decision: how a context-parallel group runs attention, and what that costs.

Reads the plan data and the comm layer's ring positions, never a tensor. One module per job:

- ``topology``: the decided topology, one frozen value (``CPTopology``);
- ``options``: every knob a user sets, valid by construction (``BurstOptions``), and the one
  resolver of ``"auto"`` (``resolve``);
- ``cost``: the bytes each rank sends, per pass and mode (what ``count_comm`` is tested
  against); ``timing``: seconds from a measured profile; ``rates``: the profile's links
  and kernels, their rates by size; ``scheduled_time``: the same seconds, step by step, for
  layers whose steps differ (sliding windows, packs);
- ``cluster``: how many CP ranks share a node (``max_intra_node_size``);
- ``flops``: what a training step computes, the one count planner and benchmarks share.
"""
