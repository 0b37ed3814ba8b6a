"""How large a block must be to run alone on the dense kernel, pass by pass: measured numbers.

Why apart: the planner (``attention.prepare``) reads them for a call's key and the automatic
kernel (``selection.BandDispatch``) carries them, and neither needs the other to say where
a pass is bound by its host and where by its GPU. A dense call (cuDNN) runs a large block
faster than a varlen flash call, but costs the host more per call: so the threshold is lower
where the GPU bounds the pass than where the host does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no torch at import: the planner's numbers only
    from .protocol import LocalAttention

# From this many visible pairs a block runs alone on the dense kernel (cuDNN, ~550 TFLOP/s
# fwd+bwd on H200), not in a varlen flash call (~325). A small ring's eager forward is bound
# by its host, which a dense call costs more: 2^20 slowed it back to back. The passes the GPU
# bounds (a ring's backward, one GPU's, a large call's forward: ``forward_min_area``) gain
# from 2^20 (results/h200x2_issue42_dense_threshold{,_per_pass}/, h200x2_issue42_in_layer/).
VARLEN_DENSE_MIN_AREA = float(2 ** 21)
VARLEN_GPU_BOUND_MIN_AREA = float(2 ** 20)
# Where a rank's queries hold more elements than this (tokens x heads x head dim: 8K tokens
# of 16 heads of 128), the GPU bounds a call in a model's layer: there the host prepares the
# attention while the GPU runs the layer's matrix products. In a Llama-70B layer at 8K
# tokens per GPU (queries of 2^26 elements) the host was ahead of every timed span, and the
# ring's forward planned with 2^20 ran up to 10% faster than with 2^21 (others within 1.5%)
# (results/h200x2_issue42_in_layer/); below it, replay's measurement found the host the
# bound (``attention.replay``, which draws its line here too).
HOST_BOUND_MAX_ELEMENTS = 1 << 24

# A slice mask that changes from call to call plans shape-free (``attention.varying_masks``):
# cuDNN builds a graph for every new block shape, so its blocks go to the varlen flash
# kernel. A single member's full and causal blocks are carved instead into cores whose
# sides are this grain times a power of two (``blocks.carved``): few shapes whatever the
# pack, each a graph built once, at cuDNN's rate; the strips go varlen. On one H200 (16K
# tokens, a new pack a step, in a layer) the forward ran 9-27% faster, the backward 8-30%
# (results/h200_issue42_carved_cores/); a shape first seen costs its graph once (tens of
# ms). A ring's plan is not carved: there every new pack's forward ran 8-17x slower
# (results/h200x2_issue42_carved_cores_ring_rejected/), the host behind, mostly because
# cuDNN's graphs are keyed by strides and a ring's K/V buffer changes length with the pack
# (mended: ``cuda._batch_strided``; results/h200x2_issue42_carved_cores_ring_strides/).
# Once the core shapes' graphs are built (40 warm-up packs), a ring carved ran its forward
# 13-16% faster than not carved, and its backward the same to 12% faster, in each of three
# families on 2x H200 (results/h200x2_issue42_carved_rings_steady/), so a ring carves too. The
# smallest core holds 1024^2 = 2^20 pairs, the GPU-bound threshold.
SHAPE_FREE_GRAIN = 1024
# Whether a ring's shape-free plan carves too (an A/B's switch: ``in_layer.py
# --no-carve-rings``, ``shape_free_check.py`` with CARVE_RINGS=0).
CARVE_RINGS = True
# Whether a document pack's plan (``cu_seqlens``: Megatron's packs, layout whole_docs) carves
# too, under a plain causal or full mask: its documents of at least the grain, whole or
# split, as cores on cuDNN, its small whole documents in their one varlen call as before
# (``pack_calls.carved_whole``). Exact on CPU ranks (tests/test_pack_carving.py) and on 2
# GPUs. Off: on 2x H200 (results/h200x2_carve_packs_min/) a pack holding a 16K-token document
# ran 1.5x faster carved, but lognormal packs and 8K-token long documents ran slower (small
# cores' cuDNN calls cost the host more than they save; rare core shapes build graphs late).
CARVE_PACKS = False
# A carving pack's smallest carved side: its documents (and split documents' blocks) shorter
# than this stay in the varlen calls, as a core of a few million pairs saves the GPU tens of
# microseconds against the host's 100-200 for its cuDNN call (``varlen.plan_calls``'s
# ``least``; ``documents.py --pack-carve-min`` for an A/B).
PACK_CARVE_MIN = 1024

# Below this many visible pairs a block that runs alone (the only one of its shape in its
# step) would go to the band kernel (flash) rather than cuDNN, whose call costs the host
# 100-200 us against flash's 45-60 (2x H100). Off (0): at 2^21 it gained nothing on 2x H200
# (1.001-1.019 of the forward's time, results/h200x2_issue42_kernel_splits_rejected/);
# ``benchmarks/split_ab.py`` sets it on the kernel to measure it on another machine.
LONE_BAND_AREA = 0.0


def forward_min_area(kernel: "LocalAttention", q_elements: int) -> float:
    """The dense threshold a ring's forward plans with: ``kernel``'s ``dense_min_area``, or
    its ``gpu_bound_min_area`` where the call is large enough that the GPU bounds it
    (``q_elements``, a rank's query elements, above ``HOST_BOUND_MAX_ELEMENTS``)."""
    gpu = kernel.gpu_bound_min_area
    if gpu is not None and q_elements > HOST_BOUND_MAX_ELEMENTS:
        return gpu
    return kernel.dense_min_area
