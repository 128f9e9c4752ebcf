"""Losses: targets, Hungarian matching, each component, aux layers, element-wise losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, LossConfig
from heptstudy.errors import ConfigError, DataError
from heptstudy.train import losses as L

S, Q, NL = 12, 6, 3  # hits per event (padded), queries, decoder layers (2 aux)


def _hit_batch() -> dict[str, torch.Tensor]:
    """Two events. Event 0: particles 1, 2, 3 on 9 valid hits, 3 padded hits. Event 1:
    particles 1 and 5 on 8 valid hits, plus particle 7 which has no representative hit."""
    g = torch.Generator().manual_seed(0)
    y = torch.zeros(2, S, 14)
    mask = torch.zeros(2, S, dtype=torch.bool)
    # (event, hit, particle, class or 0 for a non-representative hit)
    hits = [
        (0, 0, 1, 1), (0, 1, 1, 0), (0, 2, 2, 3), (0, 3, 2, 0), (0, 4, 2, 0),
        (0, 5, 3, 5), (0, 6, 0, 0), (0, 7, 3, 0), (0, 8, 1, 0),
        (1, 0, 5, 0), (1, 1, 5, 2), (1, 2, 1, 4), (1, 3, 0, 0), (1, 4, 7, 0),
        (1, 5, 7, 0), (1, 6, 1, 0), (1, 7, 5, 0),
    ]  # fmt: skip
    for b, s, p, c in hits:
        mask[b, s] = True
        y[b, s, 13] = p
        if c:
            y[b, s, 0] = c
            y[b, s, 1] = 1.0
            y[b, s, 2] = 0.5 + 10 * torch.rand(1, generator=g)  # pt
            y[b, s, 3] = torch.randn(1, generator=g)  # eta
            phi = torch.rand(1, generator=g) * 6.28
            y[b, s, 4], y[b, s, 5] = phi.sin(), phi.cos()
            y[b, s, 6] = y[b, s, 2] * 2  # energy
    # padded hits hold zeros except a stray particle number that must be ignored
    y[0, 10, 13] = 2
    return {"X": torch.randn(2, S, 15, generator=g), "mask": mask, "ytarget": y}


def _identity_hits(dtype=torch.float32) -> torch.Tensor:
    """Hit embeddings that make an event's grouping logits its query embeddings' first columns."""
    return torch.eye(S, dtype=dtype).expand(2, S, S).clone().requires_grad_()


def _random_outputs(seed: int = 1, num_layers: int = NL) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {"hit_embed": _identity_hits()}
    for prefix in ["", *[f"aux{i}_" for i in range(num_layers - 1)]]:
        out[prefix + "class_logits"] = torch.randn(2, Q, 6, generator=g).requires_grad_()
        out[prefix + "momentum"] = torch.randn(2, Q, 5, generator=g).requires_grad_()
        out[prefix + "group_embed"] = torch.randn(2, Q, S, generator=g).requires_grad_()
    return out


PERMS = [np.array([4, 0, 2]), np.array([5, 1])]  # query holding target particle j


def _perfect_outputs(batch) -> dict[str, torch.Tensor]:
    """A permuted copy of the targets; other queries say "no particle"; padded hits get
    arbitrary logits (they must be ignored)."""
    targets = L.targets_from_batch(batch)
    cls = torch.zeros(2, Q, 6)
    cls[:, :, 0] = 30.0
    mom = torch.randn(2, Q, 5)
    grp = torch.full((2, Q, S), 7.0)
    for b, t in enumerate(targets):
        hits = t.membership.shape[1]
        grp[b, :, :hits] = -30.0
        for j, q in enumerate(PERMS[b]):
            cls[b, q] = 0.0
            cls[b, q, t.cls[j]] = 30.0
            mom[b, q] = t.momentum[j]
            grp[b, q, :hits] = torch.where(t.membership[j], 30.0, -30.0)
    return {
        "class_logits": cls,
        "momentum": mom,
        "group_embed": grp,
        "hit_embed": torch.eye(S).expand(2, S, S),
    }


def test_targets_grouped_by_particle_number():
    batch = _hit_batch()
    t0, t1 = L.targets_from_batch(batch)
    assert t0.particle_number.tolist() == [1, 2, 3]
    assert t0.cls.tolist() == [1, 3, 5]
    assert t0.membership.sum(1).tolist() == [3, 3, 2]  # padded hit 10 (particle 2) ignored
    assert t0.membership.shape == (3, 9)  # over the event's hits only
    # particle 7 has no representative hit: not a target
    assert t1.particle_number.tolist() == [1, 5]
    assert t1.cls.tolist() == [4, 2]
    assert t1.membership.sum(1).tolist() == [2, 3]
    y = batch["ytarget"]
    assert torch.allclose(t0.momentum[1, 0], y[0, 2, 2].log())
    assert torch.allclose(t0.momentum[1, 4], y[0, 2, 6].log())
    assert torch.equal(t0.momentum[1, 1:4], y[0, 2, 3:6])
    phys = L.momentum_to_physical(t0.momentum)
    assert torch.allclose(phys[1], y[0, 2, 2:7], rtol=1e-5)


def test_bad_class_index_refused():
    batch = _hit_batch()
    batch["ytarget"][0, 0, 0] = 9
    with pytest.raises(DataError, match="class index 9"):
        L.targets_from_batch(batch)


def test_permuted_targets_cost_zero_and_are_matched_back():
    batch, cfg = _hit_batch(), LossConfig()
    out = _perfect_outputs(batch)
    targets = L.targets_from_batch(batch)
    matches = L.match(out, batch, targets, cfg)
    for b, (q, p) in enumerate(matches):
        assert q.tolist() == sorted(PERMS[b].tolist())
        assert np.array_equal(PERMS[b][p.numpy()], q.numpy())  # matched back
        hits = targets[b].membership.shape[1]
        cost = L.cost_matrix(
            out["class_logits"][b], out["momentum"][b], out["group_embed"][b, :, :hits],
            targets[b], cfg,
        )  # fmt: skip
        assert cost.shape == (Q, targets[b].num_particles)
        assert cost[q, p].abs().max() < 1e-6
    losses = L.hit_losses(out, batch, cfg)
    for k in ("class", "momentum", "group_bce", "group_dice", "total"):
        assert losses[k].item() < 1e-6, (k, losses[k])


def test_match_event_hand_made_cost():
    cost = np.array([[5.0, 1.0], [0.0, 5.0], [3.0, 3.0]], dtype=np.float32)
    rows, cols = L.match_event(cost)
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0]
    rows, cols = L.match_event(np.zeros((4, 0), np.float32))
    assert rows.size == 0 and cols.size == 0


def test_unmatched_queries_pushed_to_no_particle():
    batch, cfg = _hit_batch(), LossConfig()
    out = _random_outputs(num_layers=1)
    matches = L.match(out, batch, L.targets_from_batch(batch), cfg)
    L.hit_losses(out, batch, cfg)["class"].backward()
    grad = out["class_logits"].grad
    for b, (q, _) in enumerate(matches):
        unmatched = sorted(set(range(Q)) - set(q.tolist()))
        assert unmatched
        assert (grad[b, unmatched, 0] < 0).all()  # raising "no particle" lowers the loss
        assert (grad[b, unmatched, 1:] > 0).all()
    # a few plain gradient steps on the class logits turn unmatched queries into "no particle"
    logits = out["class_logits"].detach().clone().requires_grad_()
    for _ in range(200):
        o = dict(out, class_logits=logits)
        loss = L.hit_losses(o, batch, cfg)["class"]
        (g,) = torch.autograd.grad(loss, logits)
        logits = (logits - 20.0 * g).detach().requires_grad_()
    matches = L.match(dict(out, class_logits=logits), batch, L.targets_from_batch(batch), cfg)
    pred = logits.argmax(-1)
    for b, (q, _) in enumerate(matches):
        unmatched = sorted(set(range(Q)) - set(q.tolist()))
        assert (pred[b, unmatched] == 0).all()


def test_components_positive_with_gradients_and_padding_ignored():
    batch, cfg = _hit_batch(), LossConfig()
    out = _random_outputs()
    losses = L.hit_losses(out, batch, cfg)
    names = ["class", "momentum", "group_bce", "group_dice"]
    expected = set(names) | {f"aux{i}_{n}" for i in range(NL - 1) for n in names} | {"total"}
    assert set(losses) == expected
    for k, v in losses.items():
        assert v.dtype == torch.float32 and v.ndim == 0 and torch.isfinite(v) and v > 0, k
    recomputed = sum(
        w * (cfg.class_weight * losses[p + "class"] + cfg.momentum_weight * losses[p + "momentum"]
             + cfg.group_bce_weight * losses[p + "group_bce"] + cfg.group_dice_weight * losses[p + "group_dice"])
        for p, w in [("", 1.0), ("aux0_", cfg.aux_weight), ("aux1_", cfg.aux_weight)]
    )  # fmt: skip
    assert torch.allclose(losses["total"], recomputed)
    losses["total"].backward()
    for k, v in out.items():
        assert v.grad is not None and v.grad.abs().sum() > 0, k
    pad = ~batch["mask"]
    for k in ("group_embed", "aux0_group_embed"):
        assert (out[k].grad.permute(0, 2, 1)[pad] == 0).all()
    # changing padded hits' logits changes nothing
    out2 = {k: v.detach().clone() for k, v in out.items()}
    out2["group_embed"][pad[:, None, :].expand(-1, Q, -1)] = 100.0
    assert torch.equal(L.hit_losses(out2, batch, cfg)["total"], losses["total"].detach())


def test_each_component_responds_to_its_output_only():
    batch, cfg = _hit_batch(), LossConfig()
    out = {k: v.detach() for k, v in _random_outputs(num_layers=1).items()}
    base = L.hit_losses(out, batch, cfg)
    perfect = _perfect_outputs(batch)
    # with the perfect class and grouping, only momentum remains
    o = dict(perfect, momentum=out["momentum"])
    ls = L.hit_losses(o, batch, cfg)
    assert ls["momentum"] > 0.1 and ls["class"] < 1e-6 and ls["group_bce"] < 1e-6
    # perfect grouping: grouping losses vanish, the rest stays
    o = dict(perfect, class_logits=out["class_logits"])
    ls = L.hit_losses(o, batch, cfg)
    assert ls["class"] > 0.1 and ls["group_dice"] < 1e-6
    # weights: a zero weight removes the component from the total
    cfg0 = LossConfig(
        momentum_weight=0.0, group_bce_weight=0.0, group_dice_weight=0.0, aux_weight=0.0
    )
    assert torch.allclose(L.hit_losses(out, batch, cfg0)["total"], base["class"])


def test_focal_grouping_loss():
    batch = _hit_batch()
    out = {k: v.detach() for k, v in _random_outputs(num_layers=1).items()}
    bce = L.hit_losses(out, batch, LossConfig())
    focal = L.hit_losses(out, batch, LossConfig(group_loss="focal"))
    assert 0 < focal["group_bce"] < bce["group_bce"]
    assert torch.equal(focal["group_dice"], bce["group_dice"])
    assert (
        L.hit_losses(_perfect_outputs(batch), batch, LossConfig(group_loss="focal"))["group_bce"]
        < 1e-9
    )


def test_event_without_particles_and_determinism():
    batch, cfg = _hit_batch(), LossConfig()
    batch["ytarget"][1] = 0.0  # event 1: hits, no particles
    out = _random_outputs()
    a = L.hit_losses(out, batch, cfg)
    b = L.hit_losses(out, batch, cfg)
    for k in a:
        assert torch.equal(a[k], b[k]) and torch.isfinite(a[k]), k
    # no particle at all: class loss only, other components zero but connected to the graph
    batch["ytarget"][:] = 0.0
    c = L.hit_losses(out, batch, cfg)
    assert c["momentum"] == 0 and c["group_bce"] == 0 and c["class"] > 0
    c["total"].backward()
    assert out["momentum"].grad is not None


def test_bf16_autocast_losses_are_float32():
    batch, cfg = _hit_batch(), LossConfig()
    out = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in _random_outputs().items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ls = L.hit_losses(out, batch, cfg)
    ref = L.hit_losses({k: v.float() for k, v in out.items()}, batch, cfg)
    for k in ref:
        assert ls[k].dtype == torch.float32
        assert torch.allclose(ls[k], ref[k], rtol=1e-5, atol=1e-6), k
    ls["total"].backward()
    assert out["group_embed"].grad.dtype == torch.bfloat16


def _element_batch():
    g = torch.Generator().manual_seed(3)
    y = torch.zeros(2, 5, 14)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    y[0, 0, 0], y[0, 2, 0], y[1, 1, 0] = 1, 3, 5
    for b, s in [(0, 0), (0, 2), (1, 1)]:
        y[b, s, 2] = 1 + torch.rand(1, generator=g)
        y[b, s, 3] = torch.randn(1, generator=g)
        y[b, s, 4], y[b, s, 5] = 0.6, 0.8
        y[b, s, 6] = 3.0
    return {"X": torch.randn(2, 5, 15, generator=g), "mask": mask, "ytarget": y}


def test_element_losses():
    batch, cfg = _element_batch(), LossConfig()
    g = torch.Generator().manual_seed(4)
    out = {
        "class_logits": torch.randn(2, 5, 6, generator=g).requires_grad_(),
        "momentum": torch.randn(2, 5, 5, generator=g).requires_grad_(),
    }
    ls = L.compute_losses(TRACK_CLUSTER_VARIANT, out, batch, cfg)
    assert set(ls) == {"class", "momentum", "total"} and ls["class"] > 0 and ls["momentum"] > 0
    ls["total"].backward()
    has = batch["mask"] & (batch["ytarget"][..., 0] > 0)
    assert (out["momentum"].grad[~has] == 0).all() and (out["momentum"].grad[has] != 0).any()
    assert (out["class_logits"].grad[~batch["mask"]] == 0).all()
    # perfect predictions cost zero
    y = batch["ytarget"]
    perfect = {
        "class_logits": torch.nn.functional.one_hot(y[..., 0].long(), 6).float() * 40.0,
        "momentum": L.momentum_targets(y[..., 2:7]),
    }
    ls = L.element_losses(perfect, batch, cfg)
    assert ls["total"] < 1e-9


def test_compute_losses_dispatch():
    batch, cfg = _hit_batch(), LossConfig()
    out = {k: v.detach() for k, v in _random_outputs().items()}
    assert torch.equal(
        L.compute_losses(HIT_VARIANT, out, batch, cfg)["total"],
        L.hit_losses(out, batch, cfg)["total"],
    )
    with pytest.raises(ConfigError, match="model.variant"):
        L.compute_losses("nope", out, batch, cfg)


def test_batch_loss_is_mean_of_half_batch_losses_as_ddp_needs():
    """Under DDP each rank's loss is averaged: that equals the global-batch loss only if every
    event weighs the same, whatever its size or number of particles."""
    import torch

    from heptstudy.config import load_config
    from heptstudy.model import build_model, example_batch
    from heptstudy.train.losses import compute_losses

    for variant, dataset in (
        ("hit_heptv2_grouped_tracker_features", "cld_edm_ttbar_hits:3.2.1"),
        ("track_cluster_mlpf", "cld_edm_ttbar_pf:3.2.1"),
    ):
        cfg = load_config(
            overrides=[
                f"model.variant={variant}",
                f"data.dataset={dataset}",
                "model.heptv2.embedding_dim=16",
                "model.heptv2.num_heads=2",
                "model.heptv2.width=32",
                "model.heptv2.num_convs=1",
                "model.heptv2.block_size=16",
                "model.decoder.num_layers=2",
                "model.decoder.num_queries=10",
                "model.track_cluster.num_layers=1",
                "data.pad_to_multiple=16",
            ]
        )
        torch.manual_seed(0)
        model = build_model(cfg).eval()
        batch = example_batch(cfg, 4, [90, 40, 64, 17], seed=3)
        halves = [
            {k: v[s] for k, v in batch.items() if k != "layout"}  # read as padded rows
            for s in (slice(0, 2), slice(2, 4))
        ]
        with torch.no_grad():
            whole = compute_losses(variant, model(batch), batch, cfg.train.loss)
            parts = [compute_losses(variant, model(h), h, cfg.train.loss) for h in halves]
        for k in whole:
            torch.testing.assert_close(
                whole[k], (parts[0][k] + parts[1][k]) / 2, rtol=1e-5, atol=1e-6
            )


@pytest.mark.parametrize("kind", ["bce", "focal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliced_grouping_losses_equal_gathered_rows(monkeypatch, kind, dtype):
    """The slice-by-slice grouping losses from the heads' factors give the values and gradients
    of gathering every matched row of the full logits at once, up to rounding (the slices only
    bound the temporaries), on a packed layout: two events in one row."""
    from heptstudy.data.layout import EventLayout

    monkeypatch.setattr(L, "GROUP_SLICE_ELEMENTS", 2 * S)  # two pairs per slice
    g = torch.Generator().manual_seed(5)
    layout = EventLayout.packed([9, 7], [S, S - 2])
    D = 4
    group_embed = torch.randn(2, Q, D, generator=g).to(dtype)
    hit_embed = torch.randn(1, 2 * S - 2, D, generator=g).to(dtype)
    members = [torch.rand(3, 9, generator=g) > 0.6, torch.rand(2, 7, generator=g) > 0.6]
    pair_query = torch.tensor([4, 0, 2, 5, 1])
    pair_target = torch.tensor([0, 1, 2, 0, 1])
    weights = torch.rand(2, 5, generator=g)

    def run(fn):
        ge, he = group_embed.clone().requires_grad_(), hit_embed.clone().requires_grad_()
        bce, dice = fn(ge, he)
        ((weights[0] * bce).sum() + (weights[1] * dice).sum()).backward()
        return bce.detach(), dice.detach(), ge.grad, he.grad

    def gathered(ge, he):
        out = []
        for e, (span, sl) in enumerate(zip(layout.spans, (slice(0, 3), slice(3, 5)), strict=True)):
            rows = ge[e, pair_query[sl]] @ he[0, span.start : span.start + span.hits].t()
            t = members[e][pair_target[sl]]
            out.append((L.group_mask_loss(rows, t, kind), L.group_dice_loss(rows, t)))
        return tuple(torch.cat(parts) for parts in zip(*out, strict=True))

    def sliced(ge, he):
        return L.matched_group_losses(
            ge, he, layout.spans, pair_query, pair_target, members, [3, 2], kind
        )

    for a, b in zip(run(sliced), run(gathered), strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_unknown_grouping_loss_is_refused():
    x = torch.zeros(2, 3)
    with pytest.raises(ConfigError, match="group_loss='dice2'"):
        L.group_mask_loss(x, x > 0, "dice2")


def test_target_columns_come_from_the_schema():
    from heptstudy.data.schema import TARGET_COLUMNS

    assert TARGET_COLUMNS[L.COL_CLASS] == "PDG"
    assert TARGET_COLUMNS[L.COL_PARTICLE] == "particle_number"
    assert TARGET_COLUMNS[L.MOMENTUM_COLUMNS] == ("pt", "eta", "sin_phi", "cos_phi", "energy")
