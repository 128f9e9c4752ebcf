"""The training step that the trainer and every measurement run, so they measure what trains."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from heptstudy.config import Config
from heptstudy.data.batching import to_device
from heptstudy.model import build_model
from heptstudy.model.checkpoint_plan import CheckpointPlan, running_plan
from heptstudy.train.losses import compute_losses
from heptstudy.train.optim import build_optimizer, build_scheduler

Batch = Mapping[str, torch.Tensor]


class PhaseClock:
    """Knows which phase of a step is running; times nothing."""

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


def fresh_state(config: Config, device: torch.device):
    """Model, LAMB and schedule from ``train.seed``, reseeded: dropout alike in every pass."""
    torch.manual_seed(config.train.seed)
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, config.train)
    scheduler = build_scheduler(optimizer, config.train)
    torch.manual_seed(config.train.seed)
    return model, optimizer, scheduler


def run_step(
    model: nn.Module,
    batch: Batch | Sequence[Batch],
    optimizer: torch.optim.Optimizer | None,
    scheduler,
    config: Config,
    dtype: torch.dtype | None,
    *,
    meter=None,
    clock: PhaseClock | None = None,
    keep_outputs: bool = False,
    plan: CheckpointPlan | None | list[CheckpointPlan | None] = None,
    device: torch.device | None = None,
) -> StepResult:
    """One training step on ``batch`` or a list of micro-batches (losses weighted 1/n). ``device``
    None: already there; ``optimizer`` None: no update; ``plan``: per micro-batch under auto;
    ``meter``: a :class:`heptstudy.meters.memory.MemoryMeter` (imported there, above the step)."""
    batches = [batch] if isinstance(batch, Mapping) else list(batch)
    plans = plan if isinstance(plan, list) else [plan] * len(batches)
    clock = clock if clock is not None else PhaseClock()

    def mark(phase: str) -> None:
        clock.mark(phase)
        if meter is not None and phase != "optimizer":  # the meter stops before it
            meter.mark(phase)

    def decoder_starts(*_) -> None:
        if clock.phase != "decoder_and_heads":
            mark("decoder_and_heads")

    per_batch, kept = [], None
    for i, (micro, micro_plan) in enumerate(zip(batches, plans, strict=True)):
        if device is not None:
            micro = to_device(micro, device, non_blocking=True)
        if meter is not None and i == 0:
            meter.start_step(micro.values(), model=model, optimizer=optimizer)
        mark("backbone_forward")
        inner = getattr(model, "module", model)  # DistributedDataParallel keeps it here
        hook = inner.decoder_entry().register_forward_pre_hook(decoder_starts)
        try:
            with torch.autocast(micro["X"].device.type, dtype=dtype, enabled=dtype is not None):
                outputs = model(micro, **running_plan(inner, micro_plan))
        finally:
            hook.remove()
        mark("loss")
        losses = compute_losses(config.model.variant, outputs, micro, config.train.loss)
        kept = {k: v.detach() for k, v in outputs.items()} if keep_outputs else None
        del outputs  # what backward needs of them is saved; the rest is freed before it
        mark("backward")
        total = losses["total"]
        (total if len(batches) == 1 else total / len(batches)).backward()
        per_batch.append(losses)
    memory = meter.stop_step() if meter is not None else None
    if optimizer is not None:
        mark("optimizer")
        _update(optimizer, scheduler)
    clock.stop()
    # detached after the meter stopped: the tracked step has not one op more than its losses
    losses = {k: v.detach() for k, v in per_batch[0].items()}
    if len(per_batch) > 1:
        losses = {k: torch.stack([b[k].detach() for b in per_batch]).mean() for k in losses}
    return StepResult(losses, memory, kept)


def prime_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Create the optimizer's state as a first step would (one update on zero gradients)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    _update(optimizer, scheduler)


def _update(optimizer: torch.optim.Optimizer, scheduler) -> None:
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
