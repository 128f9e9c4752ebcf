"""Validation: loss components, class-correct matching efficiency and momentum resolution on
fixed test-split events, plus the predictions behind them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from heptstudy.config import HIT_VARIANT, Config
from heptstudy.data.batching import to_device
from heptstudy.train.losses import (
    compute_losses,
    match,
    momentum_to_physical,
    targets_from_batch,
)


@torch.no_grad()
def validate(model, batches, config: Config, device: torch.device, autocast_dtype=None):
    """Returns (metrics, predictions). Metrics are means over the batches; predictions are
    per-event arrays (numpy) for the caller to store."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    correct = total = 0
    rel_pt: list[np.ndarray] = []
    predictions: dict[str, list[np.ndarray]] = defaultdict(list)
    for batch in batches:
        batch = to_device(batch, device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            outputs = model(batch)
        losses = compute_losses(config.model.variant, outputs, batch, config.train.loss)
        for k, v in losses.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        if config.model.variant == HIT_VARIANT:
            c, t, r = _hit_quality(outputs, batch, config, predictions)
        else:
            c, t, r = _element_quality(outputs, batch, predictions)
        correct, total = correct + c, total + t
        rel_pt.append(r)
    model.train(was_training)
    n = max(len(batches), 1)
    metrics: dict[str, Any] = {f"loss_{k}": v / n for k, v in sums.items()}
    metrics["target_particles"] = total
    metrics["matched_right_class_fraction"] = correct / total if total else None
    res = np.concatenate(rel_pt) if rel_pt else np.zeros(0)
    # half the 16-84% inter-quantile range of (pred - true) / true: few wild predictions move it
    width = float(np.diff(np.quantile(res, [0.16, 0.84]))[0]) if res.size > 1 else None
    metrics["pt_resolution"] = width / 2.0 if width is not None else None
    metrics["pt_response_median"] = float(np.median(res)) + 1.0 if res.size else None
    return metrics, {k: np.concatenate(v) for k, v in predictions.items()}


def _hit_quality(outputs, batch, config, predictions):
    targets = targets_from_batch(batch)
    pairs = match(outputs, batch, targets, config.train.loss)
    pred_cls = outputs["class_logits"].argmax(-1)
    pred_mom = momentum_to_physical(outputs["momentum"])
    correct = total = 0
    rel = []
    for b, (t, (qi, ti)) in enumerate(zip(targets, pairs, strict=True)):
        total += t.num_particles
        ok = pred_cls[b, qi] == t.cls[ti]
        correct += int(ok.sum())
        true_pt = momentum_to_physical(t.momentum[ti])[:, 0]
        rel.append(((pred_mom[b, qi, 0] - true_pt) / true_pt)[ok].cpu().numpy())
        predictions["event_index"].append(np.full(len(qi), int(batch["event_index"][b])))
        predictions["query"].append(qi.cpu().numpy())
        predictions["target_particle_number"].append(t.particle_number[ti].cpu().numpy())
        predictions["true_class"].append(t.cls[ti].cpu().numpy())
        predictions["pred_class"].append(pred_cls[b, qi].cpu().numpy())
        predictions["true_momentum"].append(momentum_to_physical(t.momentum[ti]).cpu().numpy())
        predictions["pred_momentum"].append(pred_mom[b, qi].cpu().numpy())
    return correct, total, np.concatenate(rel) if rel else np.zeros(0)


def _element_quality(outputs, batch, predictions):
    y, mask = batch["ytarget"], batch["mask"]
    true_cls = y[..., 0].round().long()
    has = mask & (true_cls > 0)
    pred_cls = outputs["class_logits"].argmax(-1)
    pred_mom = momentum_to_physical(outputs["momentum"])
    ok = has & (pred_cls == true_cls)
    true_pt = y[..., 2]
    rel = ((pred_mom[..., 0] - true_pt) / true_pt.clamp(min=1e-6))[ok].cpu().numpy()
    b_idx, s_idx = torch.nonzero(mask, as_tuple=True)
    predictions["event_index"].append(batch["event_index"][b_idx].cpu().numpy())
    predictions["element"].append(s_idx.cpu().numpy())
    predictions["true_class"].append(true_cls[mask].cpu().numpy())
    predictions["pred_class"].append(pred_cls[mask].cpu().numpy())
    predictions["pred_momentum"].append(pred_mom[mask].cpu().numpy())
    return int(ok.sum()), int(has.sum()), rel
