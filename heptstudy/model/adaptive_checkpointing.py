"""Occupancy-adaptive checkpointing (``model.heptv2.activation_checkpointing: auto``).

Checkpointing changes no result, only memory and time, so it can be decided per batch: before a
step, a memory model per candidate plan predicts the step's peak from the batch's shape (events
``B``, longest padded event ``L``) and the step runs the cheapest plan that fits the budget.
When none fits, :class:`NoPlanFits` says so before the step allocates anything.

The memory models are estimated at the start of a run on fake tensors
(:func:`heptstudy.estimate.plans.calibrate`) and predict peak *allocated* tensor memory; on a
GPU the caching allocator's pool and kernel workspaces come on top, which the budget's safety
margin must cover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from heptstudy.config import Config, count_plan
from heptstudy.errors import HeptstudyError
from heptstudy.model.checkpoint_plan import OFF, CheckpointPlan, plan_named
from heptstudy.model.checkpoint_plan import applied_plan as applied_plan

#: ``auto``'s plans are values of :mod:`heptstudy.model.checkpoint_plan`.
Plan = CheckpointPlan


#: The plans ``auto`` tries after ``off`` when neither the configuration nor the platform
#: names an order: the first K backbone layers for growing K, then ``full``. Measured on the CPU
#: reference's batch-4 peak batch (experiments/checkpointing_limit_cpu_b4/layer_order.json):
#: each further layer saves the same 450.8 MiB, and the layers being alike, costs the same
#: recomputation, so the plans' cost grows with K.
DEFAULT_PLAN_ORDER = ("layers1", "layers2", "layers3", "layers4", "layers5", "full")


def order_by_cost(measured: dict[str, tuple[float, float]]) -> list[str]:
    """The order ``auto`` should try plans in, from their measured ``(cost, peak)`` (cost: the
    step-time overhead against off, or seconds per padded hit; peak: MiB at the same batch):
    cheapest first, each plan kept only if its peak lies below that of every cheaper plan. A
    plan that costs more and saves no more (``selective`` on the CPU reference) leaves the
    order. ``off`` is always tried first and is not listed."""
    order, lowest = [], float("inf")
    for name, (_cost, peak) in sorted(
        ((n, v) for n, v in measured.items() if n != "off"), key=lambda kv: (kv[1][0], kv[1][1])
    ):
        if peak < lowest:
            order.append(name)
            lowest = peak
    return order


def plan_order(heptv2, platform=None) -> tuple[list[str], str]:
    """The order of the plans after ``off`` and where it comes from."""
    if heptv2.auto_plan_order is not None:
        return list(heptv2.auto_plan_order), "model.heptv2.auto_plan_order"
    if platform is not None and getattr(platform, "auto_plan_order", None):
        return list(platform.auto_plan_order), f"measured on platform {platform.name}"
    return list(DEFAULT_PLAN_ORDER), "the default order"


def candidate_plans(heptv2, platform=None) -> list[CheckpointPlan]:
    """The plans tried, cheapest first: ``off``, then :func:`plan_order`. A platform's order
    was measured on its full-size model: of it, a smaller backbone tries the count plans below
    its number of layers, and ``every2`` and ``every3`` only where they differ from ``full``
    (the configuration's own order is checked against its backbone when it is validated)."""
    n = heptv2.num_convs
    plans = [OFF]
    for name in plan_order(heptv2, platform)[0]:
        count = count_plan(name)
        if (count is not None and count[1] >= n) or (name.startswith("every") and n < 2):
            continue
        plans.append(plan_named(name, n))
    return plans


def plan_config(config: Config, plan: CheckpointPlan) -> Config:
    """``config`` running ``plan``: its name as ``model.heptv2.activation_checkpointing``; a
    count plan keeps ``auto`` (every layer wrapped) and runs under :func:`applied_plan`, as the
    steps of an ``auto`` run do."""
    fixed = config.model_copy(deep=True)
    fixed.model.heptv2.activation_checkpointing = "auto" if plan.count else plan.name
    return fixed


class NoPlanFits(HeptstudyError):
    """No checkpointing plan keeps a batch's predicted peak within the budget."""


@dataclass(frozen=True)
class PlanChoice:
    """The plan a step runs and why: its predicted peak against the budget."""

    plan: Plan
    predicted_peak_mib: float
    budget_mib: float
    predictions_mib: dict[str, float]

    def fields(self) -> dict[str, Any]:
        """What a training metric line or bench step record carries."""
        return {"checkpoint_plan": self.plan.name, "predicted_peak_mib": self.predicted_peak_mib}


@dataclass
class PlanPredictor:
    """Memory models of the candidate plans and the budget they are held to."""

    plans: list[Plan]
    models: dict[str, Any]  # plan name -> heptstudy.estimate.memory_model.MemoryModel
    budget_mib: float
    budget_source: str
    calibration_s: float = 0.0
    order_source: str = ""

    def choose(
        self, batch_size: int, longest_padded: int, what: Callable[[], str] | None = None
    ) -> PlanChoice:
        """The cheapest plan whose predicted peak fits; :class:`NoPlanFits` when none does
        (``what`` names the batch in its message, called only then)."""
        predictions = {
            p.name: float(self.models[p.name].predict_allocated_mib(batch_size, longest_padded))
            for p in self.plans
        }
        for plan in self.plans:
            if predictions[plan.name] <= self.budget_mib:
                return PlanChoice(plan, predictions[plan.name], self.budget_mib, predictions)
        listed = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in predictions.items())
        raise NoPlanFits(
            f"no checkpointing plan fits {what() if what else 'the batch'} ({batch_size} events, longest "
            f"padded event {longest_padded} hits) in the memory budget of "
            f"{self.budget_mib:,.0f} MiB ({self.budget_source}): predicted peaks {listed}. "
            "Nothing of this step was run; lower the per-device batch or raise "
            "model.heptv2.memory_budget_gib if the device has the memory"
        )

    def choose_for(self, batch: dict[str, torch.Tensor]) -> PlanChoice:
        """The plan for ``batch`` (its shape only: on the host, before it is moved)."""
        b, length = (int(n) for n in batch["X"].shape[:2])
        events = batch.get("event_index")
        # the events are named only in the error: reading them from a device costs a sync
        what = None if events is None else lambda: f"the batch of events {events.tolist()}"
        return self.choose(b, length, what)

    def describe(self) -> str:
        return (
            f"adaptive checkpointing: budget {self.budget_mib:,.0f} MiB ({self.budget_source}); "
            f"plans {', '.join(p.name for p in self.plans)} (cheapest first"
            f"{': ' + self.order_source if self.order_source else ''}), each with a memory "
            f"model estimated on fake tensors in {self.calibration_s:.1f} s"
        )
