"""The plans ``auto`` chooses among when none are configured: the front of the op-group cost
table (:mod:`heptstudy.model.cost_table`). Every count plan, full and the solver plans at
:data:`AUTO_KEEP_PERCENTS` are priced on the table, in recomputation seconds and kept bytes per
slot of the batch; a plan is on the front when it keeps fewer bytes than every plan estimated
to be faster, off (nothing recomputed, everything kept) first among them. Least estimated
recomputation first, ``auto`` runs the first plan whose predicted peak fits."""

from __future__ import annotations

from collections.abc import Iterable

from heptstudy.config import Config
from heptstudy.model.cost_table import read_cost_table
from heptstudy.model.solver import CostModel, choose_keep

#: The solver plans ``auto`` prices (percent of the uncheckpointed activation memory kept): a
#: ladder fine where the table's front bends (few bytes, most of the time) and coarse above,
#: few enough that calibrating every plan on the front stays within a fit's two minutes.
AUTO_KEEP_PERCENTS = (5, 10, 20, 30, 50, 70)


def priced_plans(
    costs: CostModel, percents: Iterable[int] = AUTO_KEEP_PERCENTS
) -> dict[str, tuple[float, float]]:
    """``name -> (recompute seconds, kept bytes)`` per slot, estimated from the table, for off,
    full, the count plans ``layersK`` and the solver plans ``keepNN`` of ``percents``."""
    nothing = {kind: frozenset() for kind in costs.groups}
    layers = costs.layers["backbone"]
    whole = CostModel(
        {"backbone": costs.groups["backbone"]},
        {"backbone": costs.rest_seconds_per_slot["backbone"]},
        {"backbone": 1},
    )
    one_s, one_b = whole.recompute_seconds_per_slot(nothing), whole.total_bytes_per_slot
    total = costs.total_bytes_per_slot
    priced = {
        "off": (0.0, total),
        "full": (costs.recompute_seconds_per_slot(nothing), 0.0),
        **{f"layers{k}": (k * one_s, total - k * one_b) for k in range(1, layers)},
    }
    for percent in percents:
        choice = choose_keep(costs, percent / 100)
        priced[f"keep{percent}"] = (choice.recompute_seconds_per_slot, choice.kept_bytes_per_slot)
    return priced


def order_by_cost(priced: dict[str, tuple[float, float]]) -> list[str]:
    """``auto``'s order from ``(cost, peak)`` per plan, measured or estimated: cheapest first
    (ties by the lower peak, then the name), a plan kept only if its peak lies below that of
    every cheaper plan, ``off``'s included when given. ``off`` (always first) is not listed."""
    order, lowest = [], float("inf")
    for name, (_cost, peak) in sorted(priced.items(), key=lambda kv: (*kv[1], kv[0])):
        if peak < lowest:
            order += [] if name == "off" else [name]
            lowest = peak
    return order


def front_order(config: Config) -> list[str]:
    """The plans of the front of ``config``'s cost table (model.heptv2.op_costs), least
    estimated recomputation first; :class:`heptstudy.model.cost_table.CostTableError` where the
    table does not hold for ``config``."""
    return order_by_cost(priced_plans(read_cost_table(config)[1]))
