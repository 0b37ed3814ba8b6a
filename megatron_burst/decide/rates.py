"""A profile's rates by size: a link's bandwidth and a kernel's TFLOP/s, and the checks of
their numbers.

Apart from ``timing`` (the model that adds them up) because they are the profile's data:
``measure`` fits them, ``machine`` and ``tune`` store them, and a file's numbers are checked
here, by name, before the model divides by any.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Link:
    """One message of b bytes takes ``latency_us`` + b / bandwidth(b), per direction.

    NCCL's bandwidth grows with the message size (H200 NVLink: 74 GB/s at 16 MB, 272 at 256
    MB, ``tune_h200x4.json``), so a measured link carries ``points`` [[bytes, GB/s], ...],
    interpolated on log(bytes); outside them, and for published figures, it is ``gbps``.
    """

    latency_us: float
    gbps: float
    points: tuple = ()

    def bandwidth(self, nbytes: float) -> float:
        if not self.points:
            return self.gbps
        return _interpolated(sorted(tuple(p) for p in self.points), nbytes)

    def seconds(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth(nbytes) * 1e9)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """Achieved fwd+bwd attention rate at ``n`` tokens.

    A measured kernel carries ``points`` [[tokens, TFLOP/s], ...], interpolated on
    log(tokens) and held flat outside them: the rate saturates (an H100's cuDNN at 8K-32K
    tokens: 490-545 TFLOP/s under sustained load, ``benchmarks/results/h100x2_issue41_wire``),
    and a fitted curve extrapolated past the largest point ran 25% fast at 32K. Without
    points (published figures): ``peak_tflops * n / (n + half_tokens)``.
    """

    peak_tflops: float
    half_tokens: float
    points: tuple = ()

    def tflops(self, tokens: float) -> float:
        if self.points:
            return _interpolated(sorted(tuple(p) for p in self.points), tokens)
        return self.peak_tflops * tokens / (tokens + self.half_tokens)


def _interpolated(pts: list, x: float) -> float:
    """y at ``x`` between sorted (x, y) ``pts`` on log(x); the end points' y outside them."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + math.log(x / x0) / math.log(x1 / x0) * (y1 - y0)
    return pts[-1][1]


def with_points(cls, raw: dict):
    """A Link or Kernel from its JSON object, its points as tuples (hashable, frozen)."""
    return cls(**{**raw, "points": tuple(tuple(p) for p in raw.get("points", ()))})


# What each number of a profile may be: the time model divides by rates and sizes, so a 0
# there (a hand-edited file, a link that measured nothing) must fail at load, by name.
_ABOVE_ZERO, _AT_LEAST_ZERO = "a number above 0", "a number of at least 0"
_LINK_FIELDS = {"latency_us": _AT_LEAST_ZERO, "gbps": _ABOVE_ZERO}
_KERNEL_FIELDS = {"peak_tflops": _ABOVE_ZERO, "half_tokens": _AT_LEAST_ZERO}
_TOP_FIELDS = {"memory_gbps": _ABOVE_ZERO, "step_overhead_us": _AT_LEAST_ZERO,
               "call_overhead_us": _AT_LEAST_ZERO, "gpus_per_node": _ABOVE_ZERO,
               "ulysses_call_overhead_us": _AT_LEAST_ZERO}
# The host's measured figures beyond a plain call's: None where not measured (missing or
# written as null), the model's stand-ins then (``host_time``).
_HOST_MEASURED = ("ulysses_call_overhead_us", "pack_call_overhead_us", "pack_doc_overhead_us",
                  "ulysses_pack_call_overhead_us", "ulysses_pack_doc_overhead_us")
_TOP_FIELDS.update((name, _AT_LEAST_ZERO) for name in _HOST_MEASURED)
# Profile's defaults stand in for these where missing (gpus_per_node 8)
_OPTIONAL = {"gpus_per_node", *_HOST_MEASURED}
_NULLABLE = set(_HOST_MEASURED)


def _check_number(value: Any, rule: str, where: str) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > 0 if rule == _ABOVE_ZERO else value >= 0))
    if not ok:
        raise ValueError(f"{where} must be {rule}, got {value!r}")


def check_profile_numbers(raw: Any) -> None:
    """Raise ValueError naming the first number of a profile's JSON that the time model
    cannot use (a rate of 0 would divide by zero; NaN or a string would poison every sum)."""
    if not isinstance(raw, dict):
        raise ValueError(f"a profile is a JSON object, got {type(raw).__name__}")
    groups = [(k, _LINK_FIELDS) for k in ("intra", "inter", "alltoall")] + [
        (k, _KERNEL_FIELDS) for k in ("dense", "varlen")]
    for group, fields in groups:
        units = ("tokens", "TFLOP/s") if fields is _KERNEL_FIELDS else ("bytes", "GB/s")
        if not isinstance(raw.get(group), dict):
            raise ValueError(f"'{group}' must be an object with {', '.join(fields)}")
        for name, rule in fields.items():
            _check_number(raw[group].get(name), rule, f"{group}.{name}")
        for i, point in enumerate(raw[group].get("points") or ()):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ValueError(f"{group}.points[{i}] must be [{units[0]}, {units[1]}], got "
                                 f"{point!r}")
            for value, what in zip(point, units):
                _check_number(value, _ABOVE_ZERO, f"{group}.points[{i}] ({what})")
    for name, rule in _TOP_FIELDS.items():
        if name in _NULLABLE and raw.get(name) is None:
            continue
        if name in raw or name not in _OPTIONAL:
            _check_number(raw.get(name), rule, name)
