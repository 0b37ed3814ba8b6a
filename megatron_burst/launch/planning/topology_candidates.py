"""The context-parallel topologies a run could use, as `plan` shows them: ranked by the time model,
the chosen one marked, and those the config or the shape rules out said so, with why.

The universe is what ``timing.candidates`` enumerates for the CP group with nothing fixed
(every Ulysses split the heads and the node allow, flat or double ring, either backward);
the topologies the config admits are what it enumerates with the config's fixed values, the
same call `auto` chooses from. Every row's time is ``timing.predict`` for the run's tokens
per rank and profile, so the chosen row is the attention time the step time is built on.
The ranking is of a full-attention layer (the one `auto` chooses by); a model's sliding-window
layers run the chosen topology and are timed apart (``window_prediction``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ...decide.topology import CPTopology, HeadShape, TopologyError, check_heads
from ...decide.scheduled_time import predict_scheduled
from ...decide.timing import Prediction, candidates, load_profile, predict
from ..config.schema import Config
from ..config.burst import max_intra_node_size_of, tokens_per_rank, topology_of


def chosen_prediction(cfg: Config) -> Prediction:
    """The time model's prediction for the run's own topology: one layer, one microbatch."""
    return predict(topology_of(cfg), load_profile(cfg.cluster.profile_name),
                   tokens=tokens_per_rank(cfg), causal=True,
                   max_intra_node_size=max_intra_node_size_of(cfg))


def window_prediction(cfg: Config) -> Prediction | None:
    """The same for one of the model's sliding-window layers, step by step from its
    schedule (``scheduled_time``); None where the model has none."""
    m = cfg.model
    if m.window_layers(1, m.num_layers) == 0:
        return None
    return predict_scheduled(topology_of(cfg), load_profile(cfg.cluster.profile_name),
                             batch=cfg.training.micro_batch_size,
                             s_local=m.seq_length // cfg.parallel.context, window=m.window,
                             max_intra_node_size=max_intra_node_size_of(cfg))


@dataclasses.dataclass(frozen=True)
class TopologyRow:
    """One topology of the plan's table: its predicted time, and whether it could run here."""

    ulysses: int
    prediction: Prediction | None  # None: no topology with this Ulysses split can run
    excluded: str | None  # why this run does not consider it; None: considered
    chosen: bool = False

    def describe(self) -> str:
        mark = "*" if self.chosen else " " if self.excluded is None else "x"
        what = (self.prediction.describe() if self.prediction is not None
                else f"ulysses {self.ulysses}, any ring")
        why = "chosen" if self.chosen else (
            "considered" if self.excluded is None else f"excluded: {self.excluded}")
        return f"{mark} {what}; {why}"


def config_fixes(cfg: Config) -> dict[str, Any]:
    """What the config fixes of the topology, as ``timing.candidates`` takes it."""
    b = cfg.burst
    fixed: dict[str, Any] = {}
    if b.intra_node_size != "auto":
        fixed["intra_node_size"] = None if b.intra_node_size in (None, 1) else b.intra_node_size
    if b.ulysses_size != "auto":
        fixed["ulysses"] = b.ulysses_size
    if b.backward != "auto":
        fixed["backward"] = b.backward
    return fixed


def _why_excluded(topology: CPTopology, cfg: Config, fixed: dict[str, Any]) -> str:
    """Which of the config's fixed values rules ``topology`` out."""
    b, reasons = cfg.burst, []
    if "ulysses" in fixed and topology.ulysses != fixed["ulysses"]:
        reasons.append(f"burst.ulysses_size is {b.ulysses_size} (auto would consider it)")
    if "intra_node_size" in fixed:
        try:
            ring = CPTopology.build(topology.cp, ulysses=topology.ulysses,
                                    backward=topology.backward, heads=topology.heads,
                                    intra_node_size=fixed["intra_node_size"])
        except TopologyError:  # e.g. a node that cannot hold whole Ulysses groups
            ring = None
        if ring is None or ring.intra_node_size != topology.intra_node_size:
            reasons.append(f"burst.intra_node_size is {b.intra_node_size}")
    if "backward" in fixed and topology.backward != fixed["backward"]:
        reasons.append(f"burst.backward is {b.backward}")
    return "; ".join(reasons) or "not admitted by the config"


def _why_no_ulysses(u: int, heads: HeadShape) -> str:
    """Why no topology splits heads ``u`` ways: the heads do not split (``timing.candidates``
    takes every split they allow, across nodes too)."""
    try:
        check_heads(heads, u)
    except ValueError as e:
        return str(e)
    return "not a candidate of the time model"


def topology_rows(cfg: Config) -> list[TopologyRow]:
    """Every topology of the run's CP group: considered ones fastest first, then the excluded."""
    p = cfg.parallel
    chosen = topology_of(cfg)
    heads, max_intra_node_size = chosen.heads, max_intra_node_size_of(cfg)
    prof = load_profile(cfg.cluster.profile_name)
    tokens = tokens_per_rank(cfg)
    fixed = config_fixes(cfg)
    admitted = set(candidates(p.context, heads, max_intra_node_size=max_intra_node_size,
                              **fixed))
    admitted.add(chosen)  # fixed values `candidates` would drop still run as configured
    every = candidates(p.context, heads, max_intra_node_size=max_intra_node_size)
    rows = []
    for topology in dict.fromkeys([chosen, *admitted, *every]):
        pred = predict(topology, prof, tokens=tokens, causal=True,
                       max_intra_node_size=max_intra_node_size)
        excluded = None if topology in admitted else _why_excluded(topology, cfg, fixed)
        rows.append(TopologyRow(topology.ulysses, pred, excluded, topology == chosen))
    splits = {topology.ulysses for topology in [*admitted, *every]}
    rows += [TopologyRow(u, None, _why_no_ulysses(u, heads))
             for u in range(2, p.context + 1) if p.context % u == 0 and u not in splits]
    return sorted(rows, key=lambda r: (r.excluded is not None, r.prediction is None,
                                       r.prediction.total_s if r.prediction else 0.0,
                                       not r.chosen))


def tie_note(rows: list[TopologyRow]) -> str | None:
    """A line saying so when a considered topology predicts the chosen one's time."""
    chosen = next((r for r in rows if r.chosen), None)
    if chosen is None:
        return None
    ties = [r for r in rows if r.excluded is None and not r.chosen
            and round(r.prediction.total_s, 6) == round(chosen.prediction.total_s, 6)]
    if not ties:
        return None
    return (f"{len(ties)} considered topology(ies) predict the chosen one's time: the choice "
            f"between equals takes fewer Ulysses ranks, then fewer bytes, then the flat ring")
