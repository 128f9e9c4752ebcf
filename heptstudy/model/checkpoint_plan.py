"""Checkpointing plans: one value per plan, applied once to the built model.

A :class:`CheckpointPlan` names which backbone layers and which decoder layers run under
``torch.utils.checkpoint`` (non-reentrant, RNG state preserved so dropout replays exactly) and
with which policy (``full``: keep only the layer's inputs; ``selective``: also keep the dense
projections' products). :func:`apply_plan` wraps those modules of a built model once, as
torchtitan's ``apply_ac`` does, with PyTorch's ``checkpoint_wrapper`` (the state dict keeps the
unwrapped names). The model's ``forward`` decides nothing: it calls its layers.

Checkpointing only applies when the module is training with gradients enabled; in evaluation
and under ``no_grad`` a wrapped layer runs directly. A plan changes what is kept for backward,
never a result.

``auto`` is a plan too (:data:`AUTO`): every backbone and decoder layer is wrapped, and each
step runs under the plan chosen for its batch (:func:`running`), one of the prepared plans of
:mod:`heptstudy.model.adaptive_checkpointing`. Neither the model nor its configuration changes.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
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

from heptstudy.config import CHECKPOINTING_VALUES, checkpointing_settings, parse_checkpointing
from heptstudy.errors import HeptstudyError
from heptstudy.model.activation_checkpointing import lean_recompute, policy_context

#: Where a checkpointable layer sits: ("backbone", i) or ("decoder", j).
Slot = tuple[str, int]


@dataclass(frozen=True)
class CheckpointPlan:
    """One way of checkpointing the model.

    Fixed plans checkpoint every ``every``-th layer (0, k, 2k, ...) of the backbone and of the
    decoder. Count plans (``count`` set, for ``auto``) checkpoint the first ``count`` layers of
    ``order`` (the backbone's layers first to last, or last to first).
    """

    name: str  # off, full, selective, every2, every3, auto, layers3, ...
    label: str  # for figures and tables
    report_part: str  # the report name's part: baseline, checkpointed, checkpointed_every2, ...
    policy: str = "full"  # full | selective
    every: int = 0  # fixed plans: every k-th layer; 0: none
    count: int | None = None
    order: tuple[Slot, ...] = ()

    @property
    def checkpointing(self) -> bool | str:
        """The ``model.heptv2.activation_checkpointing`` value of this plan."""
        if self is AUTO or self.name == "auto":
            return "auto"
        return self.every > 0 or bool(self.count)

    def settings(self) -> dict[str, Any]:
        """The ``model.heptv2`` keys of a configuration that runs this fixed plan."""
        if self.count is not None:
            raise HeptstudyError(
                f"checkpoint plan {self.name!r} is one of auto's prepared plans; it has no "
                "configuration keys of its own (set activation_checkpointing=auto)"
            )
        if self.name in CHECKPOINTING_VALUES:  # the configuration's own spelling of the value
            return checkpointing_settings(self.name)
        return {
            "activation_checkpointing": self.checkpointing,
            "activation_checkpointing_policy": self.policy,
            "checkpoint_every": max(self.every, 1),
        }

    def checkpoints(self, slot: Slot) -> bool:
        """Whether this plan runs the layer at ``slot`` under checkpoint."""
        if self.count is not None:
            return slot in self.order[: self.count]
        return self.every > 0 and slot[1] % self.every == 0


OFF = CheckpointPlan("off", "off", "baseline")
FULL = CheckpointPlan("full", "full", "checkpointed", every=1)
SELECTIVE = CheckpointPlan("selective", "selective", "checkpointed_selective", "selective", 1)
EVERY_2 = CheckpointPlan("every2", "every 2", "checkpointed_every2", every=2)
EVERY_3 = CheckpointPlan("every3", "every 3", "checkpointed_every3", every=3)
AUTO = CheckpointPlan("auto", "auto", "auto")

#: The plan of each checkpointing value a configuration, a request or a matrix row names
#: (:data:`heptstudy.config.CHECKPOINTING_VALUES`; ``true``/``false`` are ``full``/``off``).
NAMED = {p.name: p for p in (OFF, FULL, SELECTIVE, EVERY_2, EVERY_3, AUTO)}
if tuple(NAMED) != CHECKPOINTING_VALUES:
    raise RuntimeError(f"checkpoint plans {tuple(NAMED)} != values {CHECKPOINTING_VALUES}")


def plan_named(value: Any) -> CheckpointPlan:
    """The plan of a checkpointing value: a plan name (any case), or true/false."""
    if isinstance(value, CheckpointPlan):
        return value
    if value is None:
        return OFF
    try:
        return NAMED[parse_checkpointing(value)]
    except ValueError as err:
        raise HeptstudyError(
            f"checkpointing={value!r} is not a checkpointing plan: {err}"
        ) from None


def plan_of(heptv2) -> CheckpointPlan:
    """The plan a ``model.heptv2`` configuration asks for."""
    return plan_for(
        heptv2.activation_checkpointing,
        heptv2.activation_checkpointing_policy,
        heptv2.checkpoint_every,
    )


def plan_for(checkpointing, policy: str | None = "full", every: int | None = 1) -> CheckpointPlan:
    """The plan of a configuration's or a report's three checkpointing fields (``auto``,
    true/false; the policy; every k-th layer): the one value whose name, label and report-name
    part every table, figure and key uses. Reports from before the policies count as ``full``."""
    if checkpointing == "auto":
        return AUTO
    if not checkpointing:
        return OFF
    policy, every = policy or "full", int(every or 1)
    for plan in (FULL, SELECTIVE, EVERY_2, EVERY_3):
        if plan.every == every and plan.policy == policy:
            return plan
    name = f"{policy}_every{every}" if policy != "full" else f"every{every}"
    label = f"{policy} every {every}" if policy != "full" else f"every {every}"
    return CheckpointPlan(name, label, f"checkpointed_{name}", policy, every)


# -- applying a plan ------------------------------------------------------------------------

_RUNNING: contextvars.ContextVar[CheckpointPlan | None] = contextvars.ContextVar(
    "heptstudy_checkpoint_plan", default=None
)


@contextmanager
def running(plan: CheckpointPlan | None) -> Iterator[None]:
    """Run the block (forward and backward) under ``plan``, one of ``auto``'s prepared plans;
    None: as the model was built (a fixed plan)."""
    if plan is None:
        yield
        return
    token = _RUNNING.set(plan)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def _run(module: nn.Module, *args, slot: Slot, plan: CheckpointPlan):
    if not (module.training and torch.is_grad_enabled()):
        return module(*args)  # nothing is kept for a backward: no plan to choose
    if plan is AUTO:
        chosen = _RUNNING.get()
        if chosen is None:
            raise HeptstudyError(
                "model.heptv2.activation_checkpointing=auto: this training step runs without a "
                "chosen plan; run it under heptstudy.model.checkpoint_plan.running (the trainer "
                "and heptstudy bench do) or set true/false"
            )
        plan = chosen
    if not plan.checkpoints(slot):
        return module(*args)
    return torch_checkpoint.checkpoint(
        _lean(module) if plan.policy == "full" else module,
        *args,
        use_reentrant=False,
        preserve_rng_state=True,
        context_fn=policy_context(plan.policy, module),
    )


def _lean(module: nn.Module):
    def call(*args):
        with lean_recompute():
            return module(*args)

    return call


def checkpoint_slots(model: nn.Module) -> dict[Slot, tuple[nn.ModuleList, int]]:
    """The checkpointable layers of ``model``: its backbone's and its decoder's."""
    slots = {}
    for group in ("backbone", "decoder"):
        layers = getattr(model, group, None)
        if isinstance(layers, nn.ModuleList):
            slots.update({(group, i): (layers, i) for i in range(len(layers))})
    return slots


def unwrapped_name(name: str) -> str:
    """A parameter's or module's name as in the unwrapped model (and in the state dict)."""
    return name.replace(_CHECKPOINT_PREFIX, "")


def apply_plan(model: nn.Module, plan: CheckpointPlan) -> nn.Module:
    """Wrap the layers ``plan`` checkpoints (every layer for ``auto``), once, in place."""
    if getattr(model, "checkpoint_plan", None) is not None:
        raise HeptstudyError(
            f"a checkpoint plan ({model.checkpoint_plan.name}) is already applied to this "
            "model; build a new model for another plan"
        )
    for slot, (layers, i) in checkpoint_slots(model).items():
        if plan is AUTO or plan.checkpoints(slot):
            layers[i] = checkpoint_wrapper(
                layers[i], checkpoint_fn=partial(_run, slot=slot, plan=plan)
            )
    model.checkpoint_plan = plan
    return model


__all__ = [
    "AUTO",
    "EVERY_2",
    "EVERY_3",
    "FULL",
    "NAMED",
    "OFF",
    "SELECTIVE",
    "CheckpointPlan",
    "apply_plan",
    "checkpoint_slots",
    "plan_for",
    "plan_named",
    "plan_of",
    "running",
    "unwrapped_name",
]
