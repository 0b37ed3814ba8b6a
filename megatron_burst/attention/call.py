"""A ``burst_attn`` call's arguments as one value, validated once.

Everything about a call besides its tensors and its group is a ``BurstCall``: made and
checked in ``burst_attn`` (a bad argument raises ValueError naming it, before any
communication), frozen, compared and hashed by value. The prepared-call cache key, the
ranks' agreement signature and the preparation all derive from it (``prepare``), so they
can never read the arguments differently. Its fields are the one list of the arguments
(``ARGUMENTS``, which ``burst_attn``'s keywords must match): a new argument is one new
field here and one keyword there.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import operator
from typing import Any, Mapping

import torch

from ..comm.settings import current
from ..decide.topology import CPTopology
from ..kernels.selection import KERNEL_NAMES
from ..decide.options import NOT_GIVEN, BurstOptions, is_given
from ..plan.packs import DeviceBoundaries, DocumentPack, device_boundaries, pack_documents
from ..plan.layouts import AREA, MASK, PACK_ZIGZAG, layout_named
from ..plan.slices import SliceMask
from .remat import AttentionKeep

QKV_FORMATS = ("bshd", "sbhd")
_DEFAULT_OPTIONS = BurstOptions()


@dataclasses.dataclass(frozen=True, kw_only=True)
class BurstCall:
    """The non-tensor arguments of one call (see the module docstring), each field named as
    ``burst_attn``'s argument it holds (so an error can name it)."""

    causal: bool
    softmax_scale: float | None
    window_size: tuple[int, int]
    layout: str
    qkv_format: str
    kernel: str | None
    call_label: int | str | None  # the caller's name for the call site
    options: BurstOptions  # backward, ulysses_size, intra_node_size, as given
    topology: CPTopology | None  # decided elsewhere, or None: resolved from ``options``
    # the documents, as their pack (compared by content), or read on the device
    cu_seqlens: DocumentPack | DeviceBoundaries | None
    keep: bool  # an AttentionKeep was passed
    sinks: bool = False  # attention sinks were passed (their values are a tensor's)
    # lse is handed back: its backward passes run on every rank, used in a loss or not
    return_lse: bool = False
    mask: SliceMask | None = None  # a general slice mask (compared by value)

    def __post_init__(self) -> None:
        if not isinstance(self.causal, bool):  # "False" or None would silently pick a mask
            raise ValueError(f"causal must be a bool, got {self.causal!r}")
        if not isinstance(self.return_lse, bool):
            raise ValueError(f"return_lse must be a bool, got {self.return_lse!r}")
        scale = self.softmax_scale
        if scale is not None and not (isinstance(scale, (int, float))
                                      and not isinstance(scale, bool) and math.isfinite(scale)
                                      and scale > 0):
            raise ValueError(f"softmax_scale must be a finite positive number or None, got "
                             f"{scale!r}")
        window = self.window_size
        if (not isinstance(window, (tuple, list)) or len(window) != 2
                or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1
                           for w in window)):
            raise ValueError(f"window_size must be a pair of ints >= -1 (left, right), got "
                             f"{window!r}")
        if self.mask is not None:
            self._check_mask()
        elif self.device_docs:
            self._check_device_docs()
        else:
            layout_named(self.layout)  # ValueError for a layout that places no sequence
        if self.qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got "
                             f"{self.qkv_format!r}")
        if self.kernel is not None and self.kernel not in KERNEL_NAMES:
            raise ValueError(f"kernel must be one of {KERNEL_NAMES} or None, got "
                             f"{self.kernel!r}")
        label = self.call_label
        if label is not None and (not isinstance(label, (int, str)) or isinstance(label, bool)):
            raise ValueError(f"call_label must be an int, a str or None, got {label!r}")
        if self.topology is not None and not isinstance(self.topology, CPTopology):
            raise ValueError(f"topology must be a megatron_burst CPTopology or None, got "
                             f"{type(self.topology).__name__}")
        # One spelling of each value, so equal calls compare (and hash) equal.
        object.__setattr__(self, "window_size", tuple(window))
        if scale is not None:
            object.__setattr__(self, "softmax_scale", float(scale))
        # Hashed once: a call keys the prepared-call cache at every call.
        object.__setattr__(self, "_hash", hash(_ALL_FIELDS(self)))

    def __hash__(self) -> int:
        return self._hash

    def _check_mask(self) -> None:
        """A mask says the whole mask: the other ways to say one are refused beside it
        (they would be silently dropped, or silently combined)."""
        if not isinstance(self.mask, SliceMask):
            raise ValueError(f"mask must be a megatron_burst.SliceMask or None, got "
                             f"{type(self.mask).__name__}")
        for name, value, default in (("causal", self.causal, False),
                                     ("window_size", tuple(self.window_size), (-1, -1)),
                                     ("cu_seqlens", self.cu_seqlens, None)):
            if value != default:
                raise ValueError(f"{name} cannot be combined with mask= (the mask says which "
                                 f"pairs are visible: put it in the slices), got "
                                 f"{name}={value!r}")
        layout_named(self.layout, MASK)  # ValueError for a layout that places no mask

    def _check_device_docs(self) -> None:
        """What documents read on the device cannot take (it is never dropped silently)."""
        if tuple(self.window_size) != (-1, -1):
            raise ValueError(f"window_size cannot be combined with layout 'pack_zigzag' (its "
                             f"documents are causal or full masks read on the device), got "
                             f"window_size={self.window_size!r}: use layout 'whole_docs' or "
                             f"'zigzag' for windows over documents")
        if self.keep:
            raise ValueError("keep= cannot be combined with layout 'pack_zigzag': a kept "
                             "output is matched to its recompute by arguments the host "
                             "reads, and this layout's documents are never read there")

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> "BurstCall":
        """The call of ``burst_attn``'s arguments, by name (``ARGUMENTS``; options left out
        are NOT_GIVEN; a layout left out is 'area' with a mask, else 'zigzag')."""
        layout, mask = arguments["layout"], arguments.get("mask")
        if not is_given(layout):
            layout = AREA.name if mask is not None else layout.default
        keep, cu_seqlens = arguments.get("keep"), arguments.get("cu_seqlens")
        if keep is not None and not isinstance(keep, AttentionKeep):
            raise ValueError(f"keep must be a megatron_burst.attention.remat.AttentionKeep or "
                             f"None, got {type(keep).__name__}")
        given = {name: arguments[name] for name in TOPOLOGY_FIELDS
                 if is_given(arguments.get(name, NOT_GIVEN))}
        # most calls give none: one value, made once
        options = BurstOptions(**given) if given else _DEFAULT_OPTIONS
        return cls(**{name: arguments[name] for name in _AS_GIVEN if name in arguments},
                   layout=layout, options=options, keep=keep is not None,
                   sinks=arguments.get("sinks") is not None,
                   cu_seqlens=_documents(cu_seqlens, layout))

    @property
    def device_docs(self) -> bool:
        """Whether the GPU reads this call's documents (``layout='pack_zigzag'``)."""
        return isinstance(self.cu_seqlens, DeviceBoundaries)

    @property
    def needs_cluster(self) -> bool:
        """Whether preparing reads the cluster (profile, ranks per node): 'auto' to settle."""
        return self.topology is None and self.options.has_auto


# Every field's value, as one tuple, in one C call (the hash every call takes).
_ALL_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(BurstCall)))

# What a call's signature holds besides these fields' values (``signature``), in order.
TENSOR_FIELDS = ("batch", "s_local", "hq", "hkv", "head_dim", "v_head_dim", "dtype",
                 "device", "requires_grad")
TOPOLOGY_FIELDS = ("backward", "ulysses_size", "intra_node_size")
_SIGNED = tuple(f.name for f in dataclasses.fields(BurstCall)
                if f.name not in ("options", "topology"))
# ``replay``: the setting (``attention.replay``), so ranks that would capture differently
# refuse together.
SIGNATURE_FIELDS = (*TENSOR_FIELDS, *_SIGNED, *TOPOLOGY_FIELDS, "replay", "error")


# ``burst_attn``'s arguments besides its tensors and group, each a field of the call (named
# as the argument it holds) but the three that make its ``options``: the one list of them.
_AS_GIVEN = tuple(f.name for f in dataclasses.fields(BurstCall)
                  if f.name not in ("options", "layout", "cu_seqlens", "keep", "sinks"))
ARGUMENTS = (*(f.name for f in dataclasses.fields(BurstCall) if f.name != "options"),
             *TOPOLOGY_FIELDS)
# Keyed by value and type; ``keep`` and ``sinks`` by their kind only (a call holds whether
# they were passed: their objects are the caller's, never kept here).
_VALUED = tuple(name for name in ARGUMENTS if name not in ("keep", "sinks"))
_VALUED_BUT_DOCUMENTS = tuple(name for name in _VALUED if name != "cu_seqlens")

_CALLS: "collections.OrderedDict[tuple, BurstCall]" = collections.OrderedDict()
CALLS_KEPT = 256  # distinct argument sets remembered (layers x masks x packs in flight)


def call_of(arguments: Mapping[str, Any]) -> BurstCall:
    """``BurstCall.of(arguments)``, validated once per distinct set of arguments.

    Remembered by value and type (``True`` and ``1``, ``1`` and ``1.0``, a tuple and a list
    are told apart, as validation tells them apart), so a repeated call skips the checks it
    passed; arguments that cannot be hashed are validated every time."""
    key = _typed(arguments)
    try:
        found = _CALLS.get(key) if key is not None else None
    except TypeError:  # an unhashable argument (a list, say): validated every time
        found = key = None
    if found is None:
        found = BurstCall.of(arguments)
        if key is not None:
            _CALLS[key] = found
            if len(_CALLS) > CALLS_KEPT:
                _CALLS.popitem(last=False)
    return found


def _typed(a: Mapping[str, Any]) -> tuple | None:
    """The arguments as a value that keeps each one's type (``window_size``'s elements'
    too); None for boundaries given as a tensor, which are read at every call."""
    w, cu, keep, sinks = a["window_size"], a["cu_seqlens"], a["keep"], a["sinks"]
    if cu is not None and not isinstance(cu, DocumentPack):
        if not (isinstance(cu, torch.Tensor) and a["layout"] == PACK_ZIGZAG.name):
            return None
        cu = ("read on the device", cu.dtype, cu.shape)  # all its call holds of it
    if w.__class__ is not tuple or len(w) != 2:
        return None  # not a pair: BurstCall says what is wrong with it
    # A default is its own kind of value (``NotGiven``): told from the same value given.
    return (*[(v.default if v.__class__ is _NOT_GIVEN else v, v.__class__)
              for v in map(a.__getitem__, _VALUED_BUT_DOCUMENTS)],
            (cu, cu.__class__), w[0].__class__, w[1].__class__, keep.__class__, sinks is None)


_NOT_GIVEN = NOT_GIVEN.__class__


def _documents(cu_seqlens, layout: str) -> DocumentPack | DeviceBoundaries | None:
    """The call's documents: read on the device in layout 'pack_zigzag', else a pack."""
    if cu_seqlens is None:
        return None
    if layout == PACK_ZIGZAG.name:
        return device_boundaries(cu_seqlens)
    return pack_documents(cu_seqlens)


def signature(call: BurstCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              topology: CPTopology, sinks: torch.Tensor | None = None) -> dict[str, object]:
    """What every rank must agree on, as hashable values with stable reprs: the tensors'
    shapes and dtype, every field of ``call`` (documents by their description), and the
    resolved topology ('auto' must have resolved alike everywhere). The device index is
    left out on purpose: each rank has its own GPU."""
    seq_first = call.qkv_format == "sbhd"
    sig: dict[str, object] = {
        "batch": q.shape[1] if seq_first else q.shape[0],
        "s_local": q.shape[0] if seq_first else q.shape[1],
        "hq": q.shape[2], "hkv": k.shape[2], "head_dim": q.shape[3], "v_head_dim": v.shape[3],
        "dtype": q.dtype, "device": q.device.type,
        # The backward ring runs only where autograd will call it: all ranks or none.
        "requires_grad": torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, sinks)),
    }
    for name in _SIGNED:
        value = getattr(call, name)
        sig[name] = value.described if isinstance(value, (DocumentPack, SliceMask)) else value
    sig.update(backward=topology.backward, ulysses_size=topology.ulysses,
               intra_node_size=topology.intra_node_size, replay=current().replay, error=None)
    return sig


def failed_signature(error: str) -> dict[str, object]:
    """The signature of a rank whose arguments failed its own validation."""
    return {**{name: None for name in SIGNATURE_FIELDS}, "error": error}


__all__ = [
    "ARGUMENTS", "BurstCall", "NOT_GIVEN", "QKV_FORMATS", "SIGNATURE_FIELDS",
    "failed_signature", "signature"]
