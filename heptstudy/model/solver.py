"""What a checkpointed layer keeps, chosen for a memory budget: an integer program over the
measured cost table (:mod:`heptstudy.model.cost_table`), as Checkmate does, but over op groups
(:mod:`heptstudy.model.op_groups`) rather than single ops. Pure: no files, no torch.

The model. A keep-set is chosen per layer kind and holds for every layer of that kind. Keeping
a group of a kind costs its bytes in every such layer and spares backward its seconds in every
such layer; the budget is a fraction of the bytes all groups of all layers would keep (the
uncheckpointed activations as the groups see them).

Why the seconds add up: eager recomputation reruns every op it does not keep, needed or not
(keeping ``attention`` without ``order`` still hashes and sorts again, H7), so keeping a group
spares exactly its own ops' time and nothing upstream of it. The seconds a group counts as saved
are therefore only its own ops' seconds, and the ops no group holds (the table's ``rest``) are
always recomputed. What the sum does not see: a recomputation holding fewer tensors at once (its
peak); the SwiGLU's hidden products, which the backward of every ``keepNN`` plan recomputes by
slice, ``mlp`` kept or not (the plans run lean); and the time backward itself takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from heptstudy.errors import HeptstudyError


@dataclass(frozen=True)
class GroupCost:
    """One op group of one layer kind, per slot of the batch measured."""

    bytes_per_slot: float  # what keeping it holds from a layer's forward to its backward
    seconds_per_slot: float  # what recomputing its ops costs backward


@dataclass(frozen=True)
class CostModel:
    """The table as the solver reads it: ``groups[kind][name]``, the seconds of ``rest`` (ops of
    no group) per kind, and the number of layers of each kind."""

    groups: Mapping[str, Mapping[str, GroupCost]]
    rest_seconds_per_slot: Mapping[str, float]
    layers: Mapping[str, int]

    def items(self) -> list[tuple[str, str, GroupCost]]:
        return [(k, n, c) for k, groups in self.groups.items() for n, c in groups.items()]

    @property
    def total_bytes_per_slot(self) -> float:
        return sum(self.layers[k] * c.bytes_per_slot for k, _, c in self.items())

    def recompute_seconds_per_slot(self, keep: Mapping[str, frozenset[str]]) -> float:
        """Recomputation of every layer under ``keep``: the rest and every group not kept."""
        rest = sum(self.layers[k] * s for k, s in self.rest_seconds_per_slot.items())
        return rest + sum(
            self.layers[k] * c.seconds_per_slot
            for k, n, c in self.items()
            if n not in keep.get(k, frozenset())
        )

    def kept_bytes_per_slot(self, keep: Mapping[str, frozenset[str]]) -> float:
        return sum(
            self.layers[k] * c.bytes_per_slot
            for k, n, c in self.items()
            if n in keep.get(k, frozenset())
        )


@dataclass(frozen=True)
class KeepChoice:
    """The solver's answer for one budget: a keep-set per layer kind and what it costs."""

    fraction: float  # the budget, of the uncheckpointed activation bytes
    keep: Mapping[str, frozenset[str]]
    kept_bytes_per_slot: float
    total_bytes_per_slot: float
    recompute_seconds_per_slot: float  # the rest included
    nothing_kept_seconds_per_slot: float  # the same, keeping nothing (every group recomputed)

    @property
    def kept_fraction(self) -> float:
        total = self.total_bytes_per_slot
        return self.kept_bytes_per_slot / total if total else 0.0

    def words(self) -> str:
        """``backbone: attention, order; decoder: nothing``."""
        return "; ".join(
            f"{kind}: {', '.join(sorted(names)) or 'nothing'}" for kind, names in self.keep.items()
        )


#: Relative slack on the budget and on the best time: the program runs in floating point.
_SLACK = 1e-9


def choose_keep(model: CostModel, fraction: float) -> KeepChoice:
    """The keep-sets whose bytes stay within ``fraction`` of the uncheckpointed activation bytes
    and whose recomputation takes least time; of equally fast ones, the fewest bytes. Keeping
    nothing always fits, so every fraction in [0, 1] has an answer."""
    if not 0.0 <= fraction <= 1.0:
        raise HeptstudyError(
            f"a keep budget is a fraction of the uncheckpointed activation memory from 0 to 1, "
            f"not {fraction!r}"
        )
    items = model.items()
    weights = np.array([model.layers[k] for k, _, _ in items], dtype=float)
    size = weights * [c.bytes_per_slot for _, _, c in items]
    saved = weights * [c.seconds_per_slot for _, _, c in items]
    total = float(size.sum())
    chosen = np.zeros(len(items), dtype=bool)
    if total > 0 and len(items):
        # scaled to order one, so the solver's tolerances mean the same whatever the units
        share, gain = size / total, saved / max(float(saved.sum()), np.finfo(float).tiny)
        fits = LinearConstraint(share[None, :], -np.inf, fraction + _SLACK)
        fastest = _solve(-gain, [fits])
        best = float(gain @ fastest)
        as_fast = LinearConstraint(gain[None, :], best - _SLACK, np.inf)
        chosen = _solve(share, [fits, as_fast]).astype(bool)
    elif len(items):
        chosen = saved > 0  # nothing takes memory: keep whatever spares time
    keep = {kind: frozenset() for kind in model.groups}
    for (kind, name, _), kept in zip(items, chosen, strict=True):
        if kept:
            keep[kind] = keep[kind] | {name}
    return _choice(model, fraction, keep)


def _solve(objective: np.ndarray, constraints: list[LinearConstraint]) -> np.ndarray:
    n = objective.size
    result = milp(objective, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, 1))
    if result.x is None:  # cannot happen: keeping nothing is always feasible
        raise HeptstudyError(f"the keep-set program found no answer: {result.message}")
    return np.round(result.x)


def _choice(model: CostModel, fraction: float, keep: dict[str, frozenset[str]]) -> KeepChoice:
    nothing = {kind: frozenset() for kind in model.groups}
    return KeepChoice(
        fraction=fraction,
        keep=keep,
        kept_bytes_per_slot=model.kept_bytes_per_slot(keep),
        total_bytes_per_slot=model.total_bytes_per_slot,
        recompute_seconds_per_slot=model.recompute_seconds_per_slot(keep),
        nothing_kept_seconds_per_slot=model.recompute_seconds_per_slot(nothing),
    )


def front(model: CostModel, percents: Iterable[int] = range(0, 101, 10)) -> list[KeepChoice]:
    """:func:`choose_keep` at each budget of ``percents`` (percent of the uncheckpointed
    activation memory), in order."""
    return [choose_keep(model, p / 100) for p in percents]
