"""Checkpointing parity: does switching activation checkpointing on change anything it must not?

Three passes without optimizer updates on the same batch, the same initial weights and the same
dropout seed: baseline, a repeat of the baseline, and checkpointed. The repeat shows how much a
pass differs from itself on this device (non-deterministic kernels); checkpointed-vs-baseline is
read against it. A few optimizer steps in both modes give the loss trajectories.
"""

from __future__ import annotations

import torch

from heptstudy.config import Config
from heptstudy.measure.report import ComparisonSet, GradientComparison, Parity, TensorComparison
from heptstudy.model import build_model
from heptstudy.model.checkpoint_plan import unwrapped_name
from heptstudy.train.optim import build_optimizer, build_scheduler
from heptstudy.train.step import run_step

#: Dropout seed of every parity pass.
PASS_SEED = 4242


def with_checkpointing(config: Config, on: bool) -> Config:
    data = config.to_dict()
    data["model"]["heptv2"]["activation_checkpointing"] = "full" if on else "off"
    return Config.model_validate(data)


def build_seeded(config: Config, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(config.train.seed)
    return build_model(config).to(device)


def _pass(model, batch, config, dtype) -> tuple[dict, dict, dict]:
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(PASS_SEED)
    result = run_step(model, batch, None, None, config, dtype, keep_outputs=True)
    grads = {
        unwrapped_name(n): p.grad.detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    outputs = {k: v.clone() for k, v in result.outputs.items()}
    return outputs, {k: v.clone() for k, v in result.losses.items()}, grads


def _compare_tensors(a: dict, b: dict) -> list[TensorComparison]:
    return [
        TensorComparison(
            name=name,
            shape=list(a[name].shape),
            equal=bool(torch.equal(a[name], b[name])),
            max_abs_diff=float((a[name].float() - b[name].float()).abs().max())
            if a[name].numel()
            else 0.0,
        )
        for name in a
    ]


def _compare_grads(a: dict, b: dict) -> list[GradientComparison]:
    rows = []
    for name in b:
        x, y = a[name].double(), b[name].double()
        ref, diff = float(y.norm()), float((x - y).norm())
        rows.append(
            GradientComparison(
                name=name,
                equal=bool(torch.equal(a[name], b[name])),
                rel_l2=diff / ref if ref > 0 else (0.0 if diff == 0 else float("inf")),
                max_abs_diff=float((x - y).abs().max()),
            )
        )
    return rows


def _overall_rel_l2(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).norm() ** 2) for n in b)
    den = sum(float(b[n].double().norm() ** 2) for n in b)
    return (num / den) ** 0.5 if den > 0 else 0.0


def _comparison(outputs, losses, grads, reference) -> ComparisonSet:
    """One pass (``outputs, losses, grads``) against the baseline pass ``reference``."""
    out = _compare_tensors(outputs, reference[0])
    loss_components = _compare_tensors(losses, reference[1])
    total = next(c for c in loss_components if c.name == "total")
    gradients = _compare_grads(grads, reference[2])
    return ComparisonSet(
        outputs=out,
        loss=total.model_copy(update={"name": "loss_total"}),
        gradients=gradients,
        num_outputs=len(out),
        num_gradients=len(gradients),
        overall_rel_l2=_overall_rel_l2(grads, reference[2]),
        loss_components=loss_components,
    )


def run_parity(
    config: Config, batch: dict, device: torch.device, dtype=None, trajectory_steps: int = 3
) -> Parity:
    base_cfg, ckpt_cfg = with_checkpointing(config, False), with_checkpointing(config, True)
    baseline = build_seeded(base_cfg, device)
    checkpointed = build_seeded(ckpt_cfg, device)
    for (n, p), (_, q) in zip(
        baseline.state_dict().items(), checkpointed.state_dict().items(), strict=True
    ):
        if not torch.equal(p, q):
            raise RuntimeError(f"parity: initial weights differ at {n}; seeding is broken")

    reference = _pass(baseline, batch, base_cfg, dtype)
    repeat = _pass(baseline, batch, base_cfg, dtype)
    ckpt = _pass(checkpointed, batch, ckpt_cfg, dtype)
    if set(reference[2]) != set(ckpt[2]):
        raise RuntimeError("parity: checkpointing changed which parameters receive gradients")
    return Parity(
        checkpointed_vs_baseline=_comparison(*ckpt, reference),
        repeat_vs_baseline=_comparison(*repeat, reference),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        loss_trajectories={
            "baseline": _trajectory(base_cfg, batch, device, dtype, trajectory_steps),
            "checkpointed": _trajectory(ckpt_cfg, batch, device, dtype, trajectory_steps),
        },
    )


def _trajectory(config, batch, device, dtype, steps: int) -> list[float]:
    model = build_seeded(config, device)
    optimizer = build_optimizer(model, config.train)
    scheduler = build_scheduler(optimizer, config.train)
    model.train()
    torch.manual_seed(PASS_SEED)
    return [
        float(run_step(model, batch, optimizer, scheduler, config, dtype).losses["total"])
        for _ in range(steps)
    ]
