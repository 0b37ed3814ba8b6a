"""The call path: ``burst_attn`` from its arguments to the ring and back.

One module per job, in the order a call meets them:

- ``api``: ``burst_attn``, the public entry point; ``call``: its arguments as one value;
- ``prepare``: tensors checked, topology resolved, kernel chosen, signed and planned, once;
- ``agree``: every rank passed the same arguments; ``call_count``: every rank made the same
  number of calls in a micro-batch;
- ``call_plan``: a call's plan, one frozen value per key (schedule, ring position, each
  step's kernel calls, hops and accumulator routes), made by one function behind one cache;
  ``bound_plan``: the plan with the call's kernel, scale and group; ``burst``: the forward
  ring with the online-softmax merge and the two backward rings, which only launch kernels
  and post messages;
- ``ulysses``: the head-parallel all-to-all of the hybrid; ``sinks``: attention sinks as one
  more partial; ``remat``: a kept output so the recompute skips the ring;
- ``sharding``: ``shard_seq`` and ``unshard_seq``.
"""
