"""Checkpointing plans, applied once to the built model with ``checkpoint_wrapper`` (as
torchtitan's ``apply_ac``; the state dict keeps the unwrapped names). RNG state is preserved so
dropout replays exactly. ``auto`` wraps every layer; each step runs under its chosen plan."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    checkpoint_wrapper,
)

from heptstudy.config import Config, count_plan, keep_percent, parse_plan_name
from heptstudy.errors import HeptstudyError
from heptstudy.model.activation_checkpointing import lean_recompute, policy_context
from heptstudy.model.cost_table import read_cost_table, solved_keep
from heptstudy.model.op_groups import check_keep
from heptstudy.model.solver import KeepChoice, choose_keep

Slot = tuple[str, int]


@dataclass(frozen=True)
class CheckpointPlan:
    """Fixed plans checkpoint every ``every``-th layer of backbone and decoder; count plans the
    first ``count`` layers of ``order``."""

    name: str  # off, full, selective, every2, every3, auto, layers3, ...
    label: str  # for figures and tables
    policy: str = "full"  # full | selective | ops
    every: int = 0  # fixed plans: every k-th layer; 0: none
    count: int | None = None
    order: tuple[Slot, ...] = ()
    #: ``ops`` plans: the op groups a checkpointed layer keeps (heptstudy.model.op_groups)
    keep: frozenset[str] = frozenset()
    #: solver plans (``keepNN``): a keep-set per layer kind, in place of ``keep`` (both kinds
    #: have a ``dropout`` group); empty until solved on a configuration's cost table
    kind_keep: tuple[tuple[str, frozenset[str]], ...] = ()

    def keep_for(self, kind: str) -> frozenset[str]:
        return dict(self.kind_keep).get(kind, self.keep)

    @property
    def solver_plan(self) -> bool:
        return keep_percent(self.name) is not None and self.policy == "ops"

    @property
    def lean(self) -> bool:
        """Run the layers lean (SwiGLU keeps only its input, its backward recomputes the hidden
        products by slice): full and every ops plan; selective keeps those products."""
        return self.policy in ("full", "ops")

    def checkpoints(self, slot: Slot) -> bool:
        if self.count is not None:
            return slot in self.order[: self.count]
        return self.every > 0 and slot[1] % self.every == 0


def report_part(name: str) -> str:
    """The part of a report's name that names the plan ``name``."""
    return {"off": "baseline", "full": "checkpointed", "auto": "auto"}.get(
        name, f"checkpointed_{name}"
    )


OFF = CheckpointPlan("off", "off")
FULL = CheckpointPlan("full", "full", every=1)
SELECTIVE = CheckpointPlan("selective", "selective", "selective", 1)
EVERY_2 = CheckpointPlan("every2", "every 2", every=2)
EVERY_3 = CheckpointPlan("every3", "every 3", every=3)
AUTO = CheckpointPlan("auto", "auto")

NAMED = {p.name: p for p in (OFF, FULL, SELECTIVE, EVERY_2, EVERY_3, AUTO)}


def ops_plan(keep, name: str = "ops") -> CheckpointPlan:
    """Every layer checkpointed, keeping the op groups ``keep`` (not a configuration value yet:
    a model built with ``auto`` runs it as a step's plan)."""
    keep = check_keep(keep)
    label = f"keeps {', '.join(sorted(keep))}" if keep else "keeps nothing"
    return CheckpointPlan(name, label, "ops", every=1, keep=keep)


def solver_plan(name: str, config: Config | None = None) -> CheckpointPlan:
    """``keepNN``: every backbone and decoder layer checkpointed, keeping per layer kind the op
    groups the solver chose for NN % of the uncheckpointed activation memory on ``config``'s
    cost table (model.heptv2.op_costs). Without ``config``: named and labelled only (a report's
    plan), refused by :func:`apply_plan`."""
    percent = keep_percent(name)
    if config is None:
        return CheckpointPlan(name, f"keep {percent}%", "ops", every=1)
    return _solved(name, solved_keep(config, name))


def solver_plans(
    config: Config, percents=range(0, 101, 10)
) -> list[tuple[CheckpointPlan, KeepChoice]]:
    """The solver plans ``keepNN`` for each NN of ``percents`` (whole numbers 0..100), each with
    its :class:`heptstudy.model.solver.KeepChoice` (kept bytes and recompute seconds per slot of
    the batch, estimated from the cost table), the table read once. Neighbouring budgets may
    choose the same keep-sets."""
    names = [plan_named(f"keep{p}").name for p in percents]  # refuses what is no keepNN
    costs = read_cost_table(config)[1]
    return [
        (_solved(n, choice := choose_keep(costs, keep_percent(n) / 100)), choice) for n in names
    ]


def _solved(name: str, choice: KeepChoice) -> CheckpointPlan:
    keep = {kind: check_keep(names) for kind, names in choice.keep.items()}
    return CheckpointPlan(
        name,
        f"keep {keep_percent(name)}% ({choice.words()})",
        "ops",
        every=1,
        keep=frozenset().union(*keep.values()),
        kind_keep=tuple(sorted(keep.items())),
    )


def plan_named(
    value: Any, num_layers: int | None = None, *, keep=None, config: Config | None = None
) -> CheckpointPlan:
    """The plan of a checkpointing value (a name or true/false); count plans need ``num_layers``;
    solver plans (``keepNN``) the whole ``config`` to be solved (:func:`solver_plan`); ``keep``
    (internal): an ``ops`` plan named ``value`` keeping those op groups."""
    if keep is not None:
        return ops_plan(keep, str(value))
    try:
        name = parse_plan_name(value)
    except ValueError as err:
        raise HeptstudyError(
            f"checkpointing={value!r} is not a checkpointing plan: {err}"
        ) from None
    if name in NAMED:
        return NAMED[name]
    if keep_percent(name) is not None:
        return solver_plan(name, config)
    last, count = count_plan(name)
    if num_layers is None or not 1 <= count < num_layers:
        raise HeptstudyError(
            f"checkpoint plan {name}: the backbone has {num_layers} layers; count plans take 1 "
            f"to {(num_layers or 1) - 1} (all of them is full)"
        )
    order = tuple(("backbone", i) for i in range(num_layers))
    return CheckpointPlan(
        name,
        f"{'last ' if last else ''}{count} of {num_layers} layers",
        count=count,
        order=order[::-1] if last else order,
    )


def plan_of(config) -> CheckpointPlan:
    """The configured plan: of a whole :class:`Config` (solver plans solved on its cost table),
    or of its ``model.heptv2`` section (solver plans named only)."""
    if isinstance(config, Config):
        heptv2 = config.model.heptv2
        return plan_named(heptv2.activation_checkpointing, heptv2.num_convs, config=config)
    return plan_named(config.activation_checkpointing, config.num_convs)


def running_plan(model: nn.Module, plan: CheckpointPlan | None) -> dict[str, CheckpointPlan]:
    """The keyword a model's layers take for one step's ``plan`` (None: as built). Only a model
    built with ``auto`` runs another plan per step."""
    if plan is None:
        return {}
    if getattr(model, "checkpoint_plan", None) is not AUTO:
        raise HeptstudyError(
            f"{type(model).__name__} was not built with activation_checkpointing=auto; a plan "
            "per step needs a model whose layers auto wrapped"
        )
    _refuse_unsolved(plan)
    return {"running_plan": plan}


def _run(
    module: nn.Module,
    *args,
    slot: Slot,
    plan: CheckpointPlan,
    running_plan: CheckpointPlan | None = None,
):
    if not (module.training and torch.is_grad_enabled()):
        return module(*args)  # nothing is kept for a backward: no plan to choose
    if plan is AUTO:
        if running_plan is None:
            raise HeptstudyError(
                "model.heptv2.activation_checkpointing=auto: this training step runs without a "
                "chosen plan; pass the step's plan to the model (run_step(plan=...) does, as the "
                "trainer and heptstudy bench call it) or set true/false"
            )
        plan = running_plan
    if not plan.checkpoints(slot):
        return module(*args)
    return torch_checkpoint.checkpoint(
        partial(_lean, module) if plan.lean else module,
        *args,
        use_reentrant=False,
        preserve_rng_state=True,
        context_fn=policy_context(plan.policy, module, slot[0], plan.keep_for(slot[0])),
    )


def _lean(module: nn.Module, *args):
    with lean_recompute():
        return module(*args)


def checkpoint_slots(model: nn.Module) -> dict[Slot, tuple[nn.ModuleList, int]]:
    slots = {}
    for group in ("backbone", "decoder"):
        layers = getattr(model, group, None)
        if isinstance(layers, nn.ModuleList):
            slots.update({(group, i): (layers, i) for i in range(len(layers))})
    return slots


def unwrapped_name(name: str) -> str:
    """A name as in the unwrapped model (and the state dict)."""
    return name.replace(_CHECKPOINT_PREFIX, "")


def apply_plan(model: nn.Module, plan: CheckpointPlan) -> nn.Module:
    """Wrap the layers ``plan`` checkpoints (all for ``auto``), once, in place."""
    if getattr(model, "checkpoint_plan", None) is not None:
        raise HeptstudyError(
            f"a checkpoint plan ({model.checkpoint_plan.name}) is already applied to this "
            "model; build a new model for another plan"
        )
    _refuse_unsolved(plan)
    slots = checkpoint_slots(model)
    _refuse_checkpointing_nothing(model, plan, slots)
    _refuse_a_simpler_plan_in_disguise(plan, slots)
    for slot, (layers, i) in slots.items():
        if plan is AUTO or plan.checkpoints(slot):
            layers[i] = checkpoint_wrapper(
                layers[i], checkpoint_fn=partial(_run, slot=slot, plan=plan)
            )
    model.checkpoint_plan = plan
    return model


def _refuse_unsolved(plan: CheckpointPlan) -> None:
    if plan.solver_plan and not plan.kind_keep:
        raise HeptstudyError(
            f"checkpoint plan {plan.name} was named but not solved: build it with "
            "plan_of(config) or plan_named(name, config=config), which read the configuration's "
            "cost table (model.heptv2.op_costs)"
        )


def _refuse_checkpointing_nothing(model: nn.Module, plan: CheckpointPlan, slots) -> None:
    """A plan other than off that wraps none of ``model``'s layers would be reported while
    nothing is checkpointed."""
    if plan is OFF or any(plan is AUTO or plan.checkpoints(slot) for slot in slots):
        return
    held = ", ".join(f"{group} {i}" for group, i in slots) or "none"
    raise HeptstudyError(
        f"checkpoint plan {plan.name} checkpoints none of the layers of this "
        f"{type(model).__name__} (backbone and decoder layers it holds: {held}); apply off to "
        "it, or build a model whose backbone has the layers the plan names"
    )


def _refuse_a_simpler_plan_in_disguise(plan: CheckpointPlan, slots) -> None:
    """``everyK`` on a model with no backbone or decoder longer than ``J`` layers wraps what
    ``everyJ`` (J < K) does: a report would name a plan that did not run. Selective is a policy
    of its own, count plans already stop short of full (:func:`plan_named`)."""
    if plan.count is not None or plan.policy != "full" or plan.every <= 1:
        return
    wrapped = {slot for slot in slots if plan.checkpoints(slot)}
    for simpler in (FULL, EVERY_2):
        if simpler.every < plan.every and wrapped == {s for s in slots if simpler.checkpoints(s)}:
            raise HeptstudyError(
                f"checkpoint plan {plan.name} checkpoints the same layers as {simpler.name} on "
                f"this model ({_layer_counts(slots)}), so it would run {simpler.name} under "
                f"another name; set model.heptv2.activation_checkpointing={simpler.name}, or "
                f"give the backbone (model.heptv2.num_convs) or the decoder "
                f"(model.decoder.num_layers) more than {simpler.every} layers"
            )


def _layer_counts(slots) -> str:
    counts: dict[str, int] = {}
    for group, _ in slots:
        counts[group] = counts.get(group, 0) + 1
    return ", ".join(f"{group}: {n} layer{'s' * (n != 1)}" for group, n in counts.items())
