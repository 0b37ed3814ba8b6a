"""The call path: ``burst_attn`` from its arguments to the ring and back.

One module per job, in the order a call meets them:

- ``api``: ``burst_attn``, the public entry point; ``call``: its arguments as one value;
- ``prepare``: tensors checked, topology resolved, kernel chosen, signed and planned, once;
- ``agree``: every rank passed the same arguments; ``call_count``: every rank made the same
  number of calls in a micro-batch;
- ``ring_spec``: what the ring loops need besides the tensors; ``burst``: the forward ring
  with the online-softmax merge and the two backward rings;
- ``ulysses``: the head-parallel all-to-all of the hybrid; ``sinks``: attention sinks as one
  more partial; ``remat``: a kept output so the recompute skips the ring;
- ``sharding``: ``shard_seq`` and ``unshard_seq``.
"""
