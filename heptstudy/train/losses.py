"""Losses: Hungarian set matching with auxiliary and grouping losses (hit model), element-wise
losses (track/cluster model). Float32, autocast off. Every component is a mean over events of a
per-event value, so under DDP the loss equals one process's on the global batch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from heptstudy import stand_ins
from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, LossConfig
from heptstudy.data.layout import layout_of
from heptstudy.data.schema import CLASS_PDG_IDS, TARGET_COLUMNS
from heptstudy.errors import ConfigError, DataError
from heptstudy.model.hit_model import event_group_logits, event_hits

NUM_CLASSES = len(CLASS_PDG_IDS)
COL_CLASS = TARGET_COLUMNS.index("PDG")  # holds the class index
COL_PARTICLE = TARGET_COLUMNS.index("particle_number")
#: pt, eta, sin phi, cos phi, energy: next to each other in the schema (tests/test_losses.py)
MOMENTUM_COLUMNS = slice(TARGET_COLUMNS.index("pt"), TARGET_COLUMNS.index("energy") + 1)
LOG_FLOOR = 1e-3
FOCAL_ALPHA, FOCAL_GAMMA = 0.25, 2.0
DICE_SMOOTH = 1.0
#: Cost of non-finite entries: the matching still runs, the loss shows the problem.
_BAD_COST = 1e6

Tensor = torch.Tensor


def momentum_targets(values: Tensor) -> Tensor:
    """``(pt, eta, sin phi, cos phi, E)`` -> ``(log pt, ..., log E)``: every column O(1)."""
    v = values.float()
    return torch.stack(
        (
            torch.log(v[..., 0].clamp(min=LOG_FLOOR)),
            v[..., 1],
            v[..., 2],
            v[..., 3],
            torch.log(v[..., 4].clamp(min=LOG_FLOOR)),
        ),
        dim=-1,
    )


def momentum_to_physical(values: Tensor) -> Tensor:
    """Inverse of :func:`momentum_targets`."""
    v = values.float()
    return torch.stack((v[..., 0].exp(), v[..., 1], v[..., 2], v[..., 3], v[..., 4].exp()), -1)


@dataclass
class EventTargets:
    """Target particles of one event (``membership`` [P, hits])."""

    cls: Tensor
    momentum: Tensor
    membership: Tensor
    particle_number: Tensor

    @property
    def num_particles(self) -> int:
        return int(self.cls.shape[0])


def _check_classes(cls: np.ndarray, what: str) -> None:
    bad = (cls < 0) | (cls >= NUM_CLASSES)
    if bad.any():
        raise DataError(
            f"{what}: class index {int(cls[bad][0])} in ytarget column 0 is outside 0..{NUM_CLASSES - 1} "
            f"(classes {CLASS_PDG_IDS}); regenerate or rebuild the data set"
        )


def targets_from_batch(batch: Mapping[str, Tensor]) -> list[EventTargets]:
    """Group the valid hits of each event by ``particle_number`` into target particles; class
    and momentum from the particle's representative hit (the first valid one with class > 0)."""
    y, mask = batch["ytarget"], batch["mask"].bool()
    device = y.device
    host = y[..., [COL_CLASS, COL_PARTICLE]].detach().float().cpu().numpy()
    valid_h = mask.cpu().numpy()
    cls_h = np.rint(host[..., 0]).astype(np.int64)
    pid_h = np.rint(host[..., 1]).astype(np.int64)
    _check_classes(cls_h[valid_h], "targets_from_batch")
    pid = torch.as_tensor(pid_h, device=device)

    out = []
    for span in layout_of(batch).spans:
        hits = slice(span.start, span.start + span.hits)  # real hits lead each event's slots
        cls_e, pid_e = cls_h[span.row, hits], pid_h[span.row, hits]
        rep_hits = np.flatnonzero((cls_e > 0) & (pid_e > 0))
        ids, first = np.unique(pid_e[rep_hits], return_index=True)
        rep = torch.as_tensor(rep_hits[first] + span.start, device=device, dtype=torch.long)
        ids_t = torch.as_tensor(ids, device=device, dtype=torch.long)
        out.append(
            EventTargets(
                cls=torch.as_tensor(cls_e[rep_hits[first]], device=device, dtype=torch.long),
                momentum=momentum_targets(y[span.row, rep][:, MOMENTUM_COLUMNS]),
                membership=pid[span.row, hits][None, :] == ids_t[:, None],
                particle_number=ids_t,
            )
        )
    return out


def _no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


def cost_matrix(
    class_logits: Tensor,
    momentum: Tensor,
    group_logits: Tensor,
    target: EventTargets,
    loss_cfg: LossConfig,
) -> Tensor:
    """Matching cost [Q, P] of one event (``group_logits`` [Q, hits]); a perfect prediction
    costs 0."""
    with torch.no_grad(), _no_autocast(class_logits.device):
        prob = class_logits.float().softmax(-1)[:, target.cls]  # [Q, P]
        c_cls = 1.0 - prob
        c_mom = torch.cdist(momentum.float(), target.momentum, p=1) / momentum.shape[-1]
        x = group_logits.float()  # [Q, hits]
        t = target.membership.float()  # [P, hits]
        n = max(x.shape[1], 1)
        c_bce = (F.softplus(-x) @ t.T + F.softplus(x) @ (1.0 - t).T) / n
        p = x.sigmoid()
        c_dice = 1.0 - (2.0 * (p @ t.T) + DICE_SMOOTH) / (
            p.sum(-1)[:, None] + t.sum(-1)[None, :] + DICE_SMOOTH
        )
        cost = (
            loss_cfg.cost_class * c_cls
            + loss_cfg.cost_momentum * c_mom
            + loss_cfg.cost_mask * c_bce
            + loss_cfg.cost_dice * c_dice
        )
        return torch.nan_to_num(cost, nan=_BAD_COST, posinf=_BAD_COST, neginf=_BAD_COST)


def match_event(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if c.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows, cols = linear_sum_assignment(c.astype(np.float32, copy=False))
    return rows.astype(np.int64), cols.astype(np.int64)


def match(
    outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    targets: list[EventTargets],
    loss_cfg: LossConfig,
    prefix: str = "",
) -> list[tuple[Tensor, Tensor]]:
    """(query idx, target idx) per event for one decoder layer; costs reach the host in one copy."""
    cl, mo, ge = (outputs[prefix + k] for k in ("class_logits", "momentum", "group_embed"))
    spans = layout_of(batch).spans
    with torch.no_grad():
        costs = [
            cost_matrix(
                cl[e],
                mo[e],
                event_group_logits(ge, outputs["hit_embed"], spans[e], e),
                t,
                loss_cfg,
            )
            for e, t in enumerate(targets)
        ]
    flat = torch.cat([c.reshape(-1) for c in costs]).cpu().numpy() if costs else np.zeros(0)
    out, start = [], 0
    for c in costs:
        n = c.numel()
        rows, cols = match_event(flat[start : start + n].reshape(c.shape))
        start += n
        out.append(
            (torch.as_tensor(rows, device=cl.device), torch.as_tensor(cols, device=cl.device))
        )
    return out


def weighted_cross_entropy(
    logits: Tensor, target: Tensor, loss_cfg: LossConfig, valid: Tensor | None = None
) -> Tensor:
    """Class-weighted mean cross-entropy per event, then mean over events."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none").view(
        target.shape
    )
    w = torch.ones(NUM_CLASSES, device=logits.device)
    w[0] = loss_cfg.no_particle_weight
    w = w[target]
    if valid is not None:
        w = w * valid.float()
    return ((w * ce).sum(-1) / w.sum(-1).clamp(min=1e-12)).mean()


def event_mean(values: Tensor, event: Tensor, num_events: int) -> Tensor:
    """Mean over events of the per-event mean of ``values`` (``event``: each value's event)."""
    sums = torch.zeros(num_events, device=values.device).index_add(0, event, values.float())
    counts = torch.zeros(num_events, device=values.device).index_add(
        0, event, torch.ones_like(values.float())
    )
    return (sums / counts.clamp(min=1.0)).sum() / num_events


def group_mask_loss(logits: Tensor, target: Tensor, kind: str = "bce") -> Tensor:
    """Per-row mean over an event's hits of BCE or focal loss (both reported as ``group_bce``)."""
    x, t = logits.float(), target.float()
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    if kind == "focal":
        p = x.sigmoid()
        p_t = p * t + (1.0 - p) * (1.0 - t)
        alpha_t = FOCAL_ALPHA * t + (1.0 - FOCAL_ALPHA) * (1.0 - t)
        ce = alpha_t * ce * (1.0 - p_t) ** FOCAL_GAMMA
    elif kind != "bce":
        raise ConfigError(f"train.loss.group_loss={kind!r} is not known; use 'bce' or 'focal'")
    return ce.sum(-1) / max(ce.shape[-1], 1)


def group_dice_loss(logits: Tensor, target: Tensor) -> Tensor:
    p = logits.float().sigmoid()
    t = target.float()
    return 1.0 - (2.0 * (p * t).sum(-1) + DICE_SMOOTH) / (p.sum(-1) + t.sum(-1) + DICE_SMOOTH)


GROUP_SLICE_ELEMENTS = 1 << 22


def matched_group_losses(
    group_embed: Tensor,
    hit_embed: Tensor,
    spans,
    pair_query: Tensor,
    pair_target: Tensor,
    memberships: list[Tensor],
    pairs_per_event: list[int],
    kind: str = "bce",
) -> tuple[Tensor, Tensor]:
    """Mask and Dice losses [M] of the matched pairs (``pair_query``, ``pair_target``: each
    event's pairs in turn, targets numbered per event) over their event's hits. The logits are
    made from the heads' factors a slice of one event's pairs at a time and remade in backward:
    neither a pair-by-hit nor a query-by-hit tensor is kept."""
    return _FactoredGroupLosses.apply(
        group_embed,
        hit_embed,
        pair_query,
        pair_target,
        kind,
        tuple(spans),
        tuple(pairs_per_event),
        tuple(memberships),
    )


def _event_pair_slices(spans, pairs_per_event):
    """(event, its span, slice of the pair list): one event's pairs at a time."""
    start = 0
    for e, (span, n) in enumerate(zip(spans, pairs_per_event, strict=True)):
        step = max(1, GROUP_SLICE_ELEMENTS // max(span.hits, 1))
        for i in range(0, n, step):
            yield e, span, slice(start + i, start + min(i + step, n))
        start += n


def _slice_losses(x: Tensor, t: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    return group_mask_loss(x, t, kind), group_dice_loss(x, t)


class _FactoredGroupLosses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group_embed, hit_embed, pair_query, pair_target, kind, spans, counts, members):
        M = pair_query.shape[0]
        bce = torch.empty(M, dtype=torch.float32, device=hit_embed.device)
        dice = torch.empty_like(bce)
        for e, span, sl in _event_pair_slices(spans, counts):
            queries = group_embed[e].index_select(0, pair_query[sl])
            x = torch.mm(queries, event_hits(hit_embed, span).t())
            t = members[e].index_select(0, pair_target[sl])
            bce[sl], dice[sl] = _slice_losses(x, t, kind)
        ctx.kind, ctx.spans, ctx.counts, ctx.members = kind, spans, counts, members
        ctx.save_for_backward(group_embed, hit_embed, pair_query, pair_target)
        return bce, dice

    @staticmethod
    def backward(ctx, d_bce, d_dice):
        group_embed, hit_embed, pair_query, pair_target = ctx.saved_tensors
        d_query = torch.zeros_like(group_embed)
        d_hit = torch.zeros_like(hit_embed)
        for e, span, sl in _event_pair_slices(ctx.spans, ctx.counts):
            hits = event_hits(hit_embed, span)
            queries = group_embed[e].index_select(0, pair_query[sl])
            with torch.enable_grad():
                x = torch.mm(queries, hits.t()).requires_grad_()
                t = ctx.members[e].index_select(0, pair_target[sl])
                outs = _slice_losses(x, t, ctx.kind)
            used = [(o, d[sl]) for o, d in zip(outs, (d_bce, d_dice), strict=True) if d is not None]
            if not used:
                continue
            (d_x,) = torch.autograd.grad([o for o, _ in used], x, [d for _, d in used])
            d_x = d_x.to(hit_embed.dtype)
            d_query[e].index_add_(0, pair_query[sl], torch.mm(d_x, hits))
            event_hits(d_hit, span).addmm_(d_x.t(), queries)
        return d_query, d_hit, None, None, None, None, None, None


def _layer_losses(
    outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    targets: list[EventTargets],
    matches: list[tuple[Tensor, Tensor]],
    loss_cfg: LossConfig,
    prefix: str,
) -> dict[str, Tensor]:
    cl, mo, ge = (outputs[prefix + k] for k in ("class_logits", "momentum", "group_embed"))
    E, Q, C = cl.shape
    dev = cl.device
    offsets = np.cumsum([0] + [t.num_particles for t in targets])
    all_cls = torch.cat([t.cls for t in targets])
    all_mom = torch.cat([t.momentum for t in targets])
    e_idx = torch.cat([torch.full_like(q, e) for e, (q, _) in enumerate(matches)])
    q_idx = torch.cat([q for q, _ in matches])
    t_idx = torch.cat([p + int(offsets[e]) for e, (_, p) in enumerate(matches)])

    tgt_cls = torch.zeros(E, Q, dtype=torch.long, device=dev)
    tgt_cls[e_idx, q_idx] = all_cls[t_idx]
    losses = {"class": weighted_cross_entropy(cl, tgt_cls, loss_cfg)}

    if q_idx.numel() == 0:  # nothing matched: zero, but keep the graph connected (DDP)
        zero = (mo.float().sum() + ge.float().sum() + outputs["hit_embed"].float().sum()) * 0.0
        losses.update(momentum=zero, group_bce=zero, group_dice=zero)
        return losses
    l1 = (mo[e_idx, q_idx].float() - all_mom[t_idx]).abs().mean(-1)
    losses["momentum"] = event_mean(l1, e_idx, E)
    bce, dice = matched_group_losses(
        ge,
        outputs["hit_embed"],
        layout_of(batch).spans,
        q_idx,
        torch.cat([p for _, p in matches]),
        [t.membership for t in targets],
        [int(q.shape[0]) for q, _ in matches],
        loss_cfg.group_loss,
    )
    losses["group_bce"] = event_mean(bce, e_idx, E)
    losses["group_dice"] = event_mean(dice, e_idx, E)
    return losses


def hit_losses(
    outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    loss_cfg: LossConfig,
) -> dict[str, Tensor]:
    """Losses of the final and every auxiliary layer, each matched on its own, and "total"."""
    stand = stand_ins.active()  # a fake-tensor step: no host copy, targets built beforehand
    targets = stand.targets if stand and stand.targets is not None else targets_from_batch(batch)
    matcher = stand.match if stand and stand.match is not None else match
    with _no_autocast(batch["mask"].device):
        result: dict[str, Tensor] = {}
        total, prefix, aux = None, "", 0
        while prefix == "" or prefix + "class_logits" in outputs:  # the last layer, then aux0_...
            matches = matcher(outputs, batch, targets, loss_cfg, prefix)
            layer = _layer_losses(outputs, batch, targets, matches, loss_cfg, prefix)
            result.update({prefix + k: v for k, v in layer.items()})
            w = 1.0 if prefix == "" else loss_cfg.aux_weight
            total = w * (
                loss_cfg.class_weight * layer["class"]
                + loss_cfg.momentum_weight * layer["momentum"]
                + loss_cfg.group_bce_weight * layer["group_bce"]
                + loss_cfg.group_dice_weight * layer["group_dice"]
            ) + (0.0 if total is None else total)
            prefix, aux = f"aux{aux}_", aux + 1
        result["total"] = total
    return result


def element_losses(
    outputs: Mapping[str, Tensor], batch: Mapping[str, Tensor], loss_cfg: LossConfig
) -> dict[str, Tensor]:
    """Track/cluster model: class cross-entropy over valid elements, momentum L1 where class > 0."""
    y, mask = batch["ytarget"], batch["mask"].bool()
    with _no_autocast(mask.device):
        cls = torch.where(mask, y[..., COL_CLASS].round().long(), 0)
        mom = outputs["momentum"]
        if int(cls.min()) < 0 or int(cls.max()) >= NUM_CLASSES:
            _check_classes(cls[mask].cpu().numpy(), "element_losses")
        losses = {
            "class": weighted_cross_entropy(outputs["class_logits"], cls, loss_cfg, valid=mask)
        }
        has = mask & (cls > 0)
        if bool(has.any()):
            l1 = (mom[has].float() - momentum_targets(y[..., MOMENTUM_COLUMNS][has])).abs().mean(-1)
            event = torch.nonzero(has, as_tuple=True)[0]
            losses["momentum"] = event_mean(l1, event, mask.shape[0])
        else:
            losses["momentum"] = mom.float().sum() * 0.0
        losses["total"] = (
            loss_cfg.class_weight * losses["class"] + loss_cfg.momentum_weight * losses["momentum"]
        )
    return losses


def compute_losses(
    variant: str,
    outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    loss_cfg: LossConfig,
) -> dict[str, Tensor]:
    if variant == HIT_VARIANT:
        return hit_losses(outputs, batch, loss_cfg)
    if variant == TRACK_CLUSTER_VARIANT:
        return element_losses(outputs, batch, loss_cfg)
    raise ConfigError(
        f"model.variant={variant!r} has no loss; use {HIT_VARIANT!r} or {TRACK_CLUSTER_VARIANT!r}"
    )
