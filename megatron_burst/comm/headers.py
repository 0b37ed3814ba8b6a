"""Every ring message says which call and pass it belongs to, and its receiver checks.

Why: the ring trusts that the ranks of a group make the same calls in the same order with
the same arguments. ``agree`` compares the arguments before a signature's first call, with a
collective; after that, nothing stopped a rank that called with other arguments, another
layer, or one call too many from pairing its messages with a peer's other call, and every
rank computing garbage in silence. So each message starts with a header of four int64s,

    [call number on this group, signature hash, pass, call label]

(the signature hash covers shapes, dtype, flags and the documents; the pass is forward or
backward and the payload or its gradient accumulator; the label is the caller's, e.g. the
Megatron layer number), which the sender writes and the receiver compares with its own.

On CPU (gloo) the receiver reads the header as the message arrives, before the data is used,
and raises ValueError naming the sender and both calls. On CUDA a host read would make the
host wait for the GPU at every hop; there the headers are compared on the device once per
pass and the result comes back by an asynchronous copy: the next ``burst_attn`` call on the
process (or the end of the backward) raises the same error. What stays undetected: a rank
making one call too many at the same call site with the same label, since every later
message pairs positionally with a call of the same number and signature; and messages whose
sizes differ, which NCCL cannot deliver (the process group's timeout ends those).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

from . import consensus
from .settings import AGREE_ENV

BYTES = 32  # the header's room at the start of a message (int64 words, 16-byte aligned)
PASSES = {"forward": 0, "backward": 1}


def digest(value: Any) -> int:
    """``digest_text(repr(value))``."""
    return digest_text(repr(value))


def digest_text(text: str) -> int:
    """63 bits of blake2b over ``text``: the same in every process (unlike ``hash()``,
    salted per process for strings), and it fits an int64."""
    raw = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 1


def describe_call(fields: dict) -> str:
    """A short readable name of a call's arguments, with their digest."""
    shape = "x".join(str(fields.get(k)) for k in ("batch", "s_local", "hq", "hkv", "head_dim"))
    return f"{shape} {fields.get('dtype')} causal={fields.get('causal')} " \
           f"#{digest(sorted(fields.items())):016x}"


@dataclasses.dataclass(frozen=True)
class CallTag:
    """What identifies one ``burst_attn`` call on its group (see the module docstring)."""

    call: int
    signature: int
    label: int = 0

    def words(self, phase: str) -> tuple[int, int, int, int]:
        return (self.call, self.signature, PASSES[phase], self.label)


class HeaderCheck:
    """The headers of one pass of one call: stamped on what it sends, checked on what it
    receives (``received``), and, on CUDA, compared once at the end (``finish``).

    On CUDA one pinned host buffer per pass holds the pass's words (row 0, what every send
    is stamped with by one host-to-device copy) and, row by row, the headers received (one
    device-to-host copy each): nothing else is allocated or launched for the headers, and
    the host never waits for them. ``receives``: how many messages the pass expects (more
    are taken in a second buffer)."""

    def __init__(self, tag: CallTag, phase: str, device: torch.device, rank: int,
                 receives: int = 4):
        self.tag, self.phase, self.device, self.rank = tag, phase, device, rank
        self._words = tag.words(phase)
        self._cuda = device.type == "cuda"
        self._host = torch.tensor([self._words] * (1 + receives if self._cuda else 1),
                                  dtype=torch.int64, pin_memory=self._cuda)
        self._stamp = self._host[0]
        self._got: list[torch.Tensor] = []  # CUDA: the host rows the headers arrive in
        self._senders: list[int] = []

    def stamp(self, header: torch.Tensor) -> None:
        """Write this pass's header into a message about to be sent."""
        header.copy_(self._stamp, non_blocking=True)

    def received(self, header: torch.Tensor, sender: int) -> None:
        """A message from global rank ``sender`` has arrived (its transfer waited on)."""
        if not self._cuda:
            got = tuple(header.tolist())
            if got != self._words:
                raise ValueError(mismatch(self.rank, sender, got, self._words))
            return
        row = len(self._got) + 1
        if row >= self._host.shape[0]:  # more messages than expected: another buffer
            self._host = torch.empty((row + 4, 4), dtype=torch.int64, pin_memory=True)
        slot = self._host[row]
        slot.copy_(header, non_blocking=True)  # waits for nothing: read in ``consensus.poll``
        self._got.append(slot)
        self._senders.append(sender)

    def finish(self) -> None:
        """CUDA: every header this pass received is on its way to the host; mark where the
        copies end (``consensus.poll`` compares them once they are there, without waiting)."""
        if not self._got:
            return
        got, senders, words, rank = self._got, self._senders, self._words, self.rank
        consensus.defer(lambda: _compare(rank, senders, got, words))
        self._got, self._senders = [], []


def _compare(rank: int, senders: list[int], rows: list[torch.Tensor],
             expected: tuple[int, ...]) -> None:
    """Raise for the first header (a pinned host row) of another call than ``expected``."""
    for sender, row in zip(senders, rows):
        got = tuple(row.tolist())
        if got != expected:
            raise ValueError(mismatch(rank, sender, got, expected))


def mismatch(rank: int, sender: int, got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """The error: who sent what to whom, and what the receiver was doing."""
    def what(words):
        call, sig, phase, label = words
        pass_ = {v: k for k, v in PASSES.items()}.get(phase, f"pass {phase}")
        return (f"call #{call} ({pass_}, signature {sig:016x}"
                + (f", label {label:x}" if label else "") + ")")

    return (f"burst_attn: rank {rank} received from rank {sender} a message of {what(got)} "
            f"while running {what(want)}: the ranks' calls pair up wrongly (a rank made a "
            f"call its peers did not, in another order, or with other arguments; set "
            f"{AGREE_ENV}=always to compare every call's arguments)")
