"""The measured training step: forward, loss, backward, optimizer update, in one function that
the bench (timed and tracked passes), the fake-device estimate of :mod:`heptstudy.fitting`, the
parity passes and the memory timeline of ``explore.ipynb`` all run, so that they measure the same
step.

Phases, as in :data:`heptstudy.meters.timing.STEP_PHASES`:

* ``backbone_forward``: input encoding, hashing and the backbone layers (for
  ``track_cluster_mlpf`` its self-attention layers);
* ``decoder_and_heads``: from the first module after the backbone to the model's outputs;
* ``loss``: targets, Hungarian matching (on the host), auxiliary and grouping losses;
* ``backward``;
* ``optimizer``: LAMB, the learning-rate scheduler and clearing the gradients.

A memory meter, when given, measures forward, loss and backward (it stops before the update)
and gets a mark at the start of every phase in its timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from heptstudy.config import Config
from heptstudy.model.adaptive_checkpointing import Plan, applied_plan
from heptstudy.train.losses import compute_losses


class MemoryMeter(Protocol):
    """What the step asks of a memory meter (:mod:`heptstudy.meters.memory` holds them; the
    step sits below the meters, so it names only this)."""

    def start_step(self, baseline_tensors=(), *, model=None, optimizer=None) -> None: ...

    def mark(self, label: str) -> None: ...

    def stop_step(self) -> Any: ...


class PhaseClock:
    """Knows which phase of a step is running (``mark`` at each phase start, ``stop`` at the
    end); this base class times nothing (the timing clocks of :mod:`heptstudy.meters.timing`
    derive from it). :meth:`seconds` gives the time of each phase."""

    definition: str | None = None

    def __init__(self) -> None:
        self.phase: str | None = None

    def mark(self, phase: str) -> None:
        self.phase = phase

    def stop(self) -> None:
        self.phase = None

    def seconds(self) -> dict[str, float] | None:
        return None


@dataclass
class StepResult:
    losses: dict[str, torch.Tensor]  # detached; reading them synchronises the device
    memory: Any = None  # the meter's StepMemory, when a meter was given
    outputs: dict[str, torch.Tensor] | None = None  # detached; only when asked for


def decoder_entry(model: nn.Module) -> nn.Module:
    """The first module run after the backbone: where ``decoder_and_heads`` starts."""
    from heptstudy.model.hit_model import HitModel
    from heptstudy.model.track_cluster import TrackClusterModel

    inner = getattr(model, "module", model)  # DistributedDataParallel keeps the model here
    if isinstance(inner, HitModel):
        return inner.backbone_norm
    if isinstance(inner, TrackClusterModel):
        return inner.norm
    raise TypeError(
        f"no backbone/decoder boundary is known for {type(inner).__name__}; "
        "add it to heptstudy.train.step.decoder_entry"
    )


class _Marks:
    """Tells the clock and the meter's timeline where each phase starts."""

    def __init__(self, clock: PhaseClock, meter: MemoryMeter | None):
        self.clock, self.meter = clock, meter

    def __call__(self, phase: str) -> None:
        self.clock.mark(phase)
        if self.meter is not None and phase != "optimizer":  # the meter stops before it
            self.meter.mark(phase)

    def once(self, phase: str) -> None:
        if self.clock.phase != phase:
            self(phase)


def run_step(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    scheduler,
    config: Config,
    dtype: torch.dtype | None,
    *,
    meter: MemoryMeter | None = None,
    clock: PhaseClock | None = None,
    keep_outputs: bool = False,
    plan: Plan | None = None,
) -> StepResult:
    """One training step of ``model`` on ``batch`` (already on the device). ``optimizer`` None:
    no update (the parity passes compare gradients). ``dtype``: the autocast dtype, None for
    float32. ``clock`` times the phases; ``meter`` measures the peak memory up to the end of
    backward. ``plan``: the checkpointing plan chosen for this batch under
    ``activation_checkpointing=auto`` (forward and backward run under it)."""
    with applied_plan(model, plan):
        return _run_step(
            model, batch, optimizer, scheduler, config, dtype, meter, clock, keep_outputs
        )


def _run_step(model, batch, optimizer, scheduler, config, dtype, meter, clock, keep_outputs):
    clock = clock if clock is not None else PhaseClock()
    marks = _Marks(clock, meter)
    if meter is not None:
        meter.start_step(batch.values(), model=model, optimizer=optimizer)
    marks("backbone_forward")
    hook = decoder_entry(model).register_forward_pre_hook(
        lambda *_: marks.once("decoder_and_heads")
    )
    try:
        with torch.autocast(batch["X"].device.type, dtype=dtype, enabled=dtype is not None):
            outputs = model(batch)
    finally:
        hook.remove()
    marks("loss")
    losses = compute_losses(config.model.variant, outputs, batch, config.train.loss)
    kept = {k: v.detach() for k, v in outputs.items()} if keep_outputs else None
    del outputs  # what backward needs of them is saved; the rest is freed before it
    marks("backward")
    losses["total"].backward()
    memory = meter.stop_step() if meter is not None else None
    if optimizer is not None:
        marks("optimizer")
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    clock.stop()
    return StepResult({k: v.detach() for k, v in losses.items()}, memory, kept)


def prime_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Create the optimizer's state as a first step would (one update on zero gradients), for
    an estimate of a counted step without running a whole warm-up step first."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)


__all__ = [
    "MemoryMeter",
    "PhaseClock",
    "StepResult",
    "decoder_entry",
    "prime_optimizer",
    "run_step",
]
