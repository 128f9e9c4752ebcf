"""The least recomputation any layer-by-layer keep choice reaches on a cost table: a bound on what
the solver plans could gain by choosing per layer rather than per layer kind.

    .venv/bin/python scripts/keep_bound.py [--table FILE.json] [--percents 5 10 30 50]

``keepNN`` keeps one keep-set per layer kind, the same in every layer of it
(:mod:`heptstudy.model.solver`). Here each layer may differ, and may even stay uncheckpointed (it
then keeps all its groups and recomputes nothing, its ops of no group included). Layers of a kind
are alike, so an integer program over *how many* layers of each kind keep each group, and how
many stay uncheckpointed, is the exact optimum of every per-layer choice within the same budget
(NN % of the bytes all groups of all layers keep). An uncheckpointed layer also keeps the outputs
of its ops of no group, which the table does not count: the bound is, if anything, too
optimistic. Printed as a share of ``full``'s recomputation, next to the solver's ``keepNN``.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from heptstudy.config import load_config
from heptstudy.config.model import DEFAULT_OP_COSTS
from heptstudy.model.cost_table import read_cost_table
from heptstudy.model.solver import CostModel, choose_keep


def least_recompute(costs: CostModel, fraction: float) -> float:
    """Seconds per slot: the least recomputation of any per-layer choice within ``fraction``."""
    kinds = list(costs.groups)
    groups = [(k, c) for k in kinds for c in costs.groups[k].values()]
    # variables: per group, the checkpointed layers keeping it; then per kind, the layers left out
    n_groups = len(groups)
    upper = [costs.layers[k] for k, _ in groups] + [costs.layers[k] for k in kinds]
    kind_bytes = [sum(c.bytes_per_slot for c in costs.groups[k].values()) for k in kinds]
    kind_seconds = [
        costs.rest_seconds_per_slot[k] + sum(c.seconds_per_slot for c in costs.groups[k].values())
        for k in kinds
    ]
    # recompute = full - (kept groups' seconds) - (left-out layers' whole seconds)
    spared = np.array([c.seconds_per_slot for _, c in groups] + kind_seconds)
    size = np.array([c.bytes_per_slot for _, c in groups] + kind_bytes)
    total = costs.total_bytes_per_slot
    fits = LinearConstraint(size[None, :] / total, -np.inf, fraction + 1e-9)
    # a group is kept only in a checkpointed layer: kept + left out <= the kind's layers
    rows = np.zeros((n_groups, n_groups + len(kinds)))
    for i, (kind, _) in enumerate(groups):
        rows[i, i] = 1.0
        rows[i, n_groups + kinds.index(kind)] = 1.0
    within = LinearConstraint(rows, -np.inf, [costs.layers[k] for k, _ in groups])
    # scaled to order one, as the solver's: in seconds per slot the solver's gap tolerance would
    # take a layout a few per cent from the best
    result = milp(
        -spared / spared.sum(),
        constraints=[fits, within],
        integrality=np.ones(spared.size),
        bounds=Bounds(0, upper),
    )
    full = costs.recompute_seconds_per_slot({k: frozenset() for k in kinds})
    return full - float(spared @ np.round(result.x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", default=DEFAULT_OP_COSTS, help="cost table JSON")
    parser.add_argument("--percents", type=int, nargs="+", default=[5, 10, 30, 50])
    args = parser.parse_args()
    config = load_config(None, [f"model.heptv2.op_costs={args.table}"])
    costs = read_cost_table(config)[1]
    full = costs.recompute_seconds_per_slot({k: frozenset() for k in costs.groups})
    print(f"{args.table}: recomputation as a share of full's")
    print(f"{'budget':>7} {'keepNN (per kind)':>18} {'any per-layer choice':>21}")
    for percent in args.percents:
        solver = choose_keep(costs, percent / 100).recompute_seconds_per_slot / full
        bound = least_recompute(costs, percent / 100) / full
        print(f"{percent:>6}% {solver:>18.1%} {bound:>21.1%}")


if __name__ == "__main__":
    main()
