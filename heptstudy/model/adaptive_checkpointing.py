"""Occupancy-adaptive checkpointing (``auto``): checkpointing changes no result, so each step
runs the cheapest plan whose predicted peak (a memory model per plan, fitted on fake tensors at
the start of a run, from the batch's shape) fits the budget. The models predict *allocated*
memory; the budget's margin must cover the caching allocator's pool and workspaces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from heptstudy.config import Config, count_plan
from heptstudy.data.layout import BatchGeometry, geometry_of
from heptstudy.errors import HeptstudyError
from heptstudy.model.checkpoint_plan import OFF, CheckpointPlan, plan_named
from heptstudy.model.cost_table import CostTableMismatch
from heptstudy.model.plan_front import front_order

#: ``auto``'s order after ``off`` for a model no cost table holds for: each further layer saves
#: and costs the same (experiments/checkpointing_limit_cpu_b4/layer_order.json).
DEFAULT_PLAN_ORDER = ("layers1", "layers2", "layers3", "layers4", "layers5", "full")


#: How a run's description of its ``auto`` predictor begins.
AUTO_NOTE = "adaptive checkpointing"


def plan_order(config: Config, platform=None) -> tuple[list[str], str]:
    """The plans ``auto`` tries after off and where the order comes from: configured, the
    platform's, else the front of the model's cost table (a sound table measured for another
    model: :data:`DEFAULT_PLAN_ORDER`, and the source says why; a missing or damaged one:
    :class:`heptstudy.model.cost_table.CostTableError`)."""
    heptv2 = config.model.heptv2
    if heptv2.auto_plan_order is not None:
        return list(heptv2.auto_plan_order), "model.heptv2.auto_plan_order"
    if platform is not None and getattr(platform, "auto_plan_order", None):
        return list(platform.auto_plan_order), f"measured on platform {platform.name}"
    try:
        order = front_order(config)
    except CostTableMismatch as err:  # a damaged or missing table is refused, not passed over
        why = str(err).split(";")[0]
        return list(DEFAULT_PLAN_ORDER), f"the default order, without a cost table: {why}"
    return order, f"least recomputation first on the front of the cost table {heptv2.op_costs}"


def candidate_plans(config: Config, platform=None) -> list[CheckpointPlan]:
    """``off``, then :func:`plan_order`, solver plans solved on ``config``'s cost table; a
    smaller backbone than the platform's measured one skips the count plans it cannot run and
    ``everyK`` where it equals ``full``."""
    n = config.model.heptv2.num_convs
    plans = [OFF]
    for name in plan_order(config, platform)[0]:
        count = count_plan(name)
        if (count is not None and count[1] >= n) or (name.startswith("every") and n < 2):
            continue
        plans.append(plan_named(name, n, config=config))
    return plans


def plan_config(config: Config, plan: CheckpointPlan) -> Config:
    """``config`` running ``plan``; a count plan keeps ``auto`` and runs under
    the plan passed to the model, as an ``auto`` run's steps do."""
    fixed = config.model_copy(deep=True)
    fixed.model.heptv2.activation_checkpointing = "auto" if plan.count else plan.name
    return fixed


class NoPlanFits(HeptstudyError):
    """No checkpointing plan keeps a batch's predicted peak within the budget."""


@dataclass(frozen=True)
class PlanChoice:
    plan: CheckpointPlan
    predicted_peak_mib: float
    budget_mib: float
    predictions_mib: dict[str, float]

    def fields(self) -> dict[str, Any]:
        return {"checkpoint_plan": self.plan.name, "predicted_peak_mib": self.predicted_peak_mib}


@dataclass
class PlanPredictor:
    plans: list[CheckpointPlan]
    models: dict[str, Any]  # plan name -> heptstudy.estimate.memory_model.MemoryModel
    budget_mib: float
    budget_source: str
    calibration_s: float = 0.0
    order_source: str = ""

    def predictions(self, geometry: BatchGeometry) -> dict[str, float]:
        """Every plan's predicted peak allocated MiB for a batch of ``geometry``."""
        return {
            p.name: float(
                self.models[p.name].predict_allocated_mib(geometry.events, geometry.length)
            )
            for p in self.plans
        }

    def choose(self, geometry: BatchGeometry, what: Callable[[], str] | None = None) -> PlanChoice:
        """The cheapest plan that fits, else :class:`NoPlanFits` (``what`` names the batch)."""
        predictions = self.predictions(geometry)
        for plan in self.plans:
            if predictions[plan.name] <= self.budget_mib:
                return PlanChoice(plan, predictions[plan.name], self.budget_mib, predictions)
        listed = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in predictions.items())
        raise NoPlanFits(
            f"no checkpointing plan fits {what() if what else 'the batch'} ({geometry.words()}) "
            f"in the memory budget of {self.budget_mib:,.0f} MiB ({self.budget_source}): "
            f"predicted peaks {listed}. Nothing of this step was run; lower the per-device batch "
            "or raise model.heptv2.memory_budget_gib if the device has the memory"
        )

    def choose_for(self, batch: dict[str, torch.Tensor]) -> PlanChoice:
        """The plan for ``batch``, from its geometry (on the host, before it is moved)."""
        events = batch.get("event_index")
        # the events are named only in the error: reading them from a device costs a sync
        what = None if events is None else lambda: f"the batch of events {events.tolist()}"
        return self.choose(geometry_of(batch), what)

    def describe(self) -> str:
        return (
            f"{AUTO_NOTE}: budget {self.budget_mib:,.0f} MiB ({self.budget_source}); "
            f"plans {', '.join(p.name for p in self.plans)} (cheapest first"
            f"{': ' + self.order_source if self.order_source else ''}), each with a memory "
            f"model estimated on fake tensors in {self.calibration_s:.1f} s"
        )
