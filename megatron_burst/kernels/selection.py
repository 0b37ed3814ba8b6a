"""Which kernel runs a call: chosen once, checked against the call's blocks before it runs.

Why apart: choosing needs every backend, and no backend needs the choice. ``select_kernel``
is the one place a call's kernel is decided (``prepare`` asks, before the call's first
message): either the fastest that works, or the one ``kernel=`` forces by name. Either way
the choice is checked against what the call will ask of it:

- the tensors (device, dtype, head dim) and every block of the call's schedule against the
  kernel's ``Capabilities``: a block it cannot compute (a sliding-window band for cuDNN,
  CUDA tensors for the CPU kernel) raises ValueError naming the kernel and the block;
- the kernel itself, once per kernel, head shape, dtype, device and block kind: a tiny
  forward and backward against the plain reference (``_probe``). Automatic choice skips a
  backend that fails its probe; a forced kernel that fails raises.

Automatic choice: on CUDA, ``flash_attn`` when importable, then PyTorch's cuDNN and flash;
``BandDispatch`` sends each block to the fastest kernel that admits it (band blocks and
small blocks to flash, which takes windows and any size; the forward of large band blocks
to FlexAttention, ``flex.FlexBandForward``). On CPU the CPU flash kernel, and the plain
reference is the last resort everywhere.
"""
from __future__ import annotations

import collections
import math
from typing import Callable, Iterable

import torch

from ..plan.schedule import Block
from . import flex
from .cuda import CudnnAttention, FlashAttnPackage, TorchFlashAttention
from .in_place import probe_in_place
from .padded import PaddedHeads
from .protocol import Capabilities, LocalAttention, VarlenByLoop
from .reference import CpuFlashAttention, ReferenceAttention
from .thresholds import LONE_BAND_AREA, VARLEN_DENSE_MIN_AREA, VARLEN_GPU_BOUND_MIN_AREA

KERNELS = {kernel.name: kernel for kernel in (  # each kernel class says its own name
    ReferenceAttention, CpuFlashAttention, CudnnAttention, TorchFlashAttention, FlashAttnPackage)}
KERNEL_NAMES = tuple(sorted(KERNELS))  # what ``kernel=`` may force


def default_scale(head_dim: int) -> float:
    """The softmax scale when none is given: 1 / sqrt(head dim of Q and K)."""
    return 1.0 / math.sqrt(head_dim)


def _agrees(got: tuple, ref: tuple) -> bool:
    """(out, lse, dq, dk, dv) against the reference's, at bf16-level tolerances."""
    out, lse, *grads = got
    r_out, r_lse, *r_grads = ref
    ok = torch.allclose(lse.float(), r_lse.float(), atol=2e-2) and torch.allclose(
        out.float(), r_out.float(), atol=3e-2)
    for g, rg in zip(grads, r_grads):
        ok = ok and g.shape == rg.shape and torch.allclose(g.float(), rg.float(),
                                                           atol=5e-2, rtol=5e-2)
    return bool(ok)


_PROBE_BLOCKS = {"full": Block(0, 96, 0, 128, "full"), "causal": Block(0, 128, 0, 128, "causal"),
                 "band": Block(0, 128, 0, 128, "band", -40, 3)}


def _probe(kernel: LocalAttention, dtype: torch.dtype, hq: int, hkv: int, d: int,
           device: torch.device, kind: str, dv: int | None = None) -> bool:
    """A tiny fwd+bwd of one ``kind`` block against the reference; False if it fails.
    ``dv``: V's head dim where it differs from Q/K's (MLA)."""
    dv = d if dv is None else dv
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        blk = _PROBE_BLOCKS[kind]
        n, m = blk.q_stop, blk.k_stop
        q = torch.randn(1, n, hq, d, generator=gen).to(device, dtype)
        do = torch.randn(1, n, hq, dv, generator=gen).to(device, dtype)
        k = torch.randn(1, m, hkv, d, generator=gen).to(device, dtype)
        v = torch.randn(1, m, hkv, dv, generator=gen).to(device, dtype)
        scale, ref = d ** -0.5, ReferenceAttention()
        out, lse = kernel.forward(q, k, v, blk, scale)
        r_out, r_lse = ref.forward(q, k, v, blk, scale)
        grads = kernel.backward(do, q, k, v, r_out, r_lse, blk, scale)
        r_grads = ref.backward(do, q, k, v, r_out, r_lse, blk, scale)
        return _agrees((out, lse, *grads), (r_out, r_lse, *r_grads))
    except Exception:  # an op missing or refusing this shape/arch: not usable here
        return False


def _probe_varlen(kernel: LocalAttention, dtype: torch.dtype, hq: int, hkv: int, d: int,
                  device: torch.device, dv: int | None = None) -> bool:
    """Its one-launch varlen form against the reference's loop, on three causal sequences of
    different lengths, given the reference's lse (as the ring's backward gives it)."""
    from .varlen import plan_calls
    try:
        gen = torch.Generator(device="cpu").manual_seed(1)
        blocks, a = [], 0
        for n in (37, 128, 90):
            blocks.append(Block(a, a + n, a, a + n, "causal"))
            a += n
        (call,) = plan_calls(blocks, varlen=True, dense_min_area=float("inf"),
                             coalesce=False)  # the varlen form is what is probed
        dv = d if dv is None else dv
        q = torch.randn(a, hq, d, generator=gen).to(device, dtype)
        do = torch.randn(a, hq, dv, generator=gen).to(device, dtype)
        k = torch.randn(a, hkv, d, generator=gen).to(device, dtype)
        v = torch.randn(a, hkv, dv, generator=gen).to(device, dtype)
        scale, ref = d ** -0.5, ReferenceAttention()
        out, lse = kernel.forward_varlen(q, k, v, call, scale)
        r_out, r_lse = ref.forward_varlen(q, k, v, call, scale)
        grads = kernel.backward_varlen(do, q, k, v, r_out, r_lse, call, scale)
        r_grads = ref.backward_varlen(do, q, k, v, r_out, r_lse, call, scale)
        return _agrees((out, lse, *grads), (r_out, r_lse, *r_grads))
    except Exception:  # an op missing or refusing this shape/arch: no one-launch varlen
        return False


class BandDispatch(VarlenByLoop):
    """Each block to the fastest of its kernels that admits it: dense blocks to ``dense``;
    band blocks, and blocks too small to be worth cuDNN, to ``band`` (flash: windows and any
    size); varlen calls to ``varlen``, a one-launch kernel that passed its probe, if any."""

    SMALL = 128

    def __init__(self, dense: LocalAttention, band: LocalAttention,
                 varlen: LocalAttention | None = None):
        self.dense, self.band, self.varlen = dense, band, varlen
        # A block alone in its call below this area runs on ``band`` too (LONE_BAND_AREA).
        self.lone_band_area = LONE_BAND_AREA
        self.name = dense.name if dense is band else f"{dense.name}+{band.name}"
        # What any of them runs: each block then goes to one that admits it.
        caps = [dense.capabilities, band.capabilities]
        self.capabilities = Capabilities(
            devices=caps[0].devices & caps[1].devices, dtypes=caps[0].dtypes & caps[1].dtypes,
            kinds=caps[0].kinds | caps[1].kinds, one_launch_varlen=varlen is not None,
            min_side=min(c.min_side for c in caps))
        if varlen is not None:
            self.name += f", varlen {varlen.name}"
            if varlen is not dense:  # (the same kernel for both: pack everything)
                self.dense_min_area = VARLEN_DENSE_MIN_AREA  # big blocks go dense
                self.gpu_bound_min_area = VARLEN_GPU_BOUND_MIN_AREA

    def _pick(self, block: Block) -> LocalAttention:
        small = (min(block.q_stop - block.q_start, block.k_stop - block.k_start) < self.SMALL
                 or block.area < self.lone_band_area)
        first, second = (self.band, self.dense) if small else (self.dense, self.band)
        for kernel in (first, second):
            caps = kernel.capabilities
            if block.kind in caps.kinds and (caps.min_side <= 1 or caps.admits(block)):
                return kernel
        raise ValueError(f"burst_attn: no kernel of {self.name} runs a {block.describe()}")

    def forward(self, q, k, v, block, scale):
        return self._pick(block).forward(q, k, v, block, scale)

    def native(self, q, k, v, block, scale):
        return self._pick(block).native(q, k, v, block, scale)

    def has_native(self, block: Block) -> bool:
        return has_native(self._pick(block), block)

    def backward(self, dout, q, k, v, out, lse, block, scale):
        return self._pick(block).backward(dout, q, k, v, out, lse, block, scale)

    def forward_varlen(self, q, k, v, call, scale):
        if self.varlen is None:
            return super().forward_varlen(q, k, v, call, scale)
        return self.varlen.forward_varlen(q, k, v, call, scale)

    def forward_varlen_in_place(self, q, k, v, call, scale):
        if self.varlen is None:
            return super().forward_varlen_in_place(q, k, v, call, scale)
        return self.varlen.forward_varlen_in_place(q, k, v, call, scale)

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        if self.varlen is None:
            return super().backward_varlen(dout, q, k, v, out, lse, call, scale)
        return self.varlen.backward_varlen(dout, q, k, v, out, lse, call, scale)


def has_native(kernel: LocalAttention, block: Block) -> bool:
    """Whether ``kernel`` computes ``block``'s output with aten's own autograd (``native``):
    then a single rank's call that needs no lse is that one differentiable op."""
    if hasattr(kernel, "has_native"):  # a kernel of kernels: the one that runs the block
        return kernel.has_native(block)
    if isinstance(kernel, CudnnAttention) and kernel.expand_kv:
        return False
    return hasattr(kernel, "native")


_CHECKED: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_CHECKED_SIZE = 256  # kernels x head shapes x kinds: a run has a handful


def _once(key: tuple, compute):
    """``compute()`` once per ``key`` (a value: names, shapes, dtypes, devices), bounded.
    Probing runs small kernels and copies from the host: inside a CUDA graph capture it
    would fail, so a capture that reaches an unprobed shape raises instead."""
    if key not in _CHECKED:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"burst_attn: kernel {key[0]!r} not checked yet for {key[1:]}; run "
                             f"the call once outside the CUDA graph capture first "
                             f"(make_graphed_callables' warm-up does)")
        _CHECKED[key] = compute()
        if len(_CHECKED) > _CHECKED_SIZE:
            _CHECKED.popitem(last=False)
    return _CHECKED[key]


def _fit(kernel: LocalAttention, d: int, dv: int) -> LocalAttention:
    """``kernel`` as it runs Q/K of dim ``d`` with V of dim ``dv``: as it is, or with the
    smaller side padded where it takes one head dim (``padded``)."""
    if d == dv or kernel.capabilities.other_v_dim:
        return kernel
    return PaddedHeads(kernel)


def _refusal(kernel: LocalAttention, device_type: str, dtype, d: int, dv: int) -> str | None:
    dims = (d, dv) if kernel.capabilities.other_v_dim and not isinstance(kernel, PaddedHeads) \
        else (max(d, dv),)
    for dim in dims:
        refusal = kernel.capabilities.tensor_refusal(device_type, dtype, dim)
        if refusal:
            return refusal
    return None


def _auto(dtype: torch.dtype, hq: int, hkv: int, d: int, device: torch.device, dv: int
          ) -> LocalAttention:
    """The fastest backends that pass their probes for this head shape on this device."""
    probe = lambda c, kind: _probe(c, dtype, hq, hkv, d, device, kind, dv)  # noqa: E731
    if device.type != "cuda":
        cpu = _fit(CpuFlashAttention(), d, dv)
        usable = (_refusal(cpu, device.type, dtype, d, dv) is None
                  and all(probe(cpu, kind) for kind in _PROBE_BLOCKS))
        return cpu if usable else ReferenceAttention()
    base: list[LocalAttention] = []
    try:
        base.append(FlashAttnPackage())
    except ImportError:
        pass
    # PyTorch's memory-efficient kernel is not in the chain: its backward, given an lse
    # it did not produce itself, returned wrong gradients on H200 (torch 2.11).
    base += [CudnnAttention(), TorchFlashAttention()]
    if hkv != hq:  # a cuDNN that does not take fewer K/V heads: with them expanded
        base.insert(-1, CudnnAttention(expand_kv=True))
    candidates = [_fit(c, d, dv) for c in base]
    if d != dv:  # where a kernel fails Q/K and V of two dims as they are: padded
        candidates += [PaddedHeads(c) for c in base if c.capabilities.other_v_dim]
    ok = [c for c in candidates if _refusal(c, "cuda", dtype, d, dv) is None]
    dense = next((c for c in ok if all(probe(c, kind) for kind in ("full", "causal"))),
                 ReferenceAttention())
    band = next((c for c in ok if "band" in c.capabilities.kinds and c.capabilities.min_side == 1
                 and probe(c, "band")), ReferenceAttention())
    if flex.available() and not isinstance(band, ReferenceAttention):
        band = flex.FlexBandForward(band)  # large windows' forward: FlexAttention
    varlen = next((c for c in ok if c.capabilities.one_launch_varlen
                   and _probe_varlen(c, dtype, hq, hkv, d, device, dv)), None)
    dispatch = BandDispatch(dense, band, varlen)
    dispatch.varlen_in_place = (getattr(varlen, "in_place_launch", False)
                                and probe_in_place(varlen, dtype, hq, hkv, d, device, dv))
    return dispatch


def _forced(name: str, dtype: torch.dtype, hq: int, hkv: int, d: int,
            device: torch.device, dv: int) -> LocalAttention:
    """The kernel ``name`` names, checked for these tensors (before any block)."""
    if name not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNEL_NAMES} or None, got {name!r}")
    try:
        kernel = _fit(KERNELS[name](), d, dv)
    except ImportError as err:
        raise ValueError(f"kernel={name!r} is not available here ({err})") from None
    refusal = _refusal(kernel, device.type, dtype, d, dv)
    if refusal:
        raise ValueError(f"kernel={name!r} {refusal}")
    return kernel


def choose_kernel(name: str | None, dtype: torch.dtype, hq: int, hkv: int, d: int,
                  device: torch.device, *, blocks: Callable[[], Iterable[Block]] = tuple,
                  varlen: bool = False, dv: int | None = None) -> LocalAttention:
    """The kernel for attention of ``hq``:``hkv`` heads of dim ``d`` (V: ``dv``, default
    ``d``): the fastest that works, or the one ``name`` forces; checked against ``blocks()``
    (every block the call will run) and, with ``varlen``, its one-launch varlen form, as the
    module docstring says. Raises ValueError naming the kernel and what it cannot run."""
    kernel = pick_kernel(name, dtype, hq, hkv, d, device, dv=dv)
    check_kernel(kernel, name, dtype, hq, hkv, d, device, blocks=blocks, varlen=varlen, dv=dv)
    return kernel


def pick_kernel(name: str | None, dtype: torch.dtype, hq: int, hkv: int, d: int,
                device: torch.device, *, dv: int | None = None) -> LocalAttention:
    """``choose_kernel``'s kernel before its check against a call's blocks (the call's plan
    depends on the kernel's ``dense_min_area``; ``check_kernel`` follows, before any
    message moves)."""
    dv = d if dv is None else dv
    shape = (str(dtype), hq, hkv, d, dv, str(device))
    if name is None:
        return _once(("auto", *shape), lambda: _auto(dtype, hq, hkv, d, device, dv))
    return _once((name, *shape), lambda: _forced(name, dtype, hq, hkv, d, device, dv))


def check_kernel(kernel: LocalAttention, name: str | None, dtype: torch.dtype, hq: int,
                 hkv: int, d: int, device: torch.device, *,
                 blocks: Callable[[], Iterable[Block]] = tuple, varlen: bool = False,
                 dv: int | None = None) -> None:
    """Raise ValueError unless ``kernel`` (``pick_kernel``'s for ``name``) computes every
    block of ``blocks()`` exactly: its capabilities admit each, and a forced kernel passes
    its probe on each kind of block (and on varlen calls, with ``varlen``)."""
    if name is None and kernel.capabilities.runs_every_block:
        return  # the automatic choice holds a kernel for every block
    dv = d if dv is None else dv
    shape = (str(dtype), hq, hkv, d, dv, str(device))
    kinds = set()
    for blk in blocks():
        refusal = kernel.capabilities.block_refusal(blk)
        if refusal:
            raise ValueError(f"kernel={name or kernel.name!r} {refusal}: it would compute "
                             f"another mask; leave kernel=None to choose one that runs it")
        kinds.add(blk.kind)
    if name is not None and name != ReferenceAttention.name:  # the yardstick itself
        for kind in sorted(kinds):
            if not _once((name, *shape, kind),
                         lambda kind=kind: _probe(kernel, dtype, hq, hkv, d, device, kind, dv)):
                raise ValueError(f"kernel={name!r} fails its check on {kind} blocks of "
                                 f"{hq}:{hkv} heads of dim {d} in {dtype} on {device} (it "
                                 f"raised, or its result differs from the reference)")
        if varlen and kernel.capabilities.one_launch_varlen and not _once(
                (name, *shape, "varlen"),
                lambda: _probe_varlen(kernel, dtype, hq, hkv, d, device, dv)):
            raise ValueError(f"kernel={name!r} fails its check on varlen calls of {hq}:{hkv} "
                             f"heads of dim {d} in {dtype} on {device}")


def select_kernel(q: torch.Tensor, k: torch.Tensor, name: str | None = None,
                  v: torch.Tensor | None = None) -> LocalAttention:
    """``choose_kernel`` for tensors ``q``, ``k`` (and ``v``) (bshd), without a call's blocks
    (the benchmarks' and ``tune``'s dense calls)."""
    return choose_kernel(name, q.dtype, q.shape[2], k.shape[2], q.shape[3], q.device,
                         dv=None if v is None else v.shape[3])
