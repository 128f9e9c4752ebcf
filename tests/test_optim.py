"""LAMB optimizer (as particleflow runs it) and cosine schedule."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from heptstudy.config import ConfigError, TrainConfig, load_config
from heptstudy.train.lamb import Lamb
from heptstudy.train.optim import build_optimizer, build_scheduler, cosine_factor


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


def _step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 4, generator=g)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_schedule_start_mid_end():
    cfg = TrainConfig(lr=1e-3, lr_final_fraction=0.1, num_steps=10)
    opt = build_optimizer(_model(), cfg)
    sched = build_scheduler(opt, cfg)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(cfg.num_steps + 3):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[0] == cfg.lr
    assert lrs[5] == pytest.approx(cfg.lr * 0.55, rel=1e-12)  # mid-way: (1 + f) / 2
    assert lrs[10] == cfg.lr * cfg.lr_final_fraction  # exactly 10 % at the last step
    assert lrs[13] == cfg.lr * cfg.lr_final_fraction  # and stays there
    assert all(a > b for a, b in zip(lrs[:10], lrs[1:11], strict=True))
    assert all(g["lr"] == lrs[-1] for g in opt.param_groups)
    assert cosine_factor(3, 10, 0.1) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(0.3 * math.pi))
    )


def test_schedule_state_dict_roundtrip():
    cfg = TrainConfig(num_steps=8)
    opt = build_optimizer(_model(), cfg)
    sched = build_scheduler(opt, cfg)
    for _ in range(3):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = build_optimizer(_model(), cfg)
    sched2 = build_scheduler(opt2, cfg)
    sched2.load_state_dict(state)
    opt2.load_state_dict(opt.state_dict())
    for s in (sched, sched2):
        s.optimizer.step()
        s.step()
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert sched2.last_epoch == 4


def test_lamb_from_config_updates_parameters():
    cfg = TrainConfig(lr=1e-2, weight_decay=0.05)
    model = _model()
    before = copy.deepcopy(model.state_dict())
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, Lamb)
    # particleflow's recipe: one group, every trainable parameter decayed, clipping at 1.0
    (group,) = opt.param_groups
    assert group["weight_decay"] == 0.05 and len(group["params"]) == len(list(model.parameters()))
    assert group["lr"] == 1e-2 and group["bias_correction"] is True
    assert opt.defaults["max_grad_norm"] == 1.0
    _step(model, opt, 0)
    for k, v in model.state_dict().items():
        assert not torch.equal(v, before[k]), k
        assert torch.isfinite(v).all()


def test_weight_decay_on_matrices_leaves_vectors_undecayed():
    cfg = TrainConfig(weight_decay=0.05, lamb={"weight_decay_on": "matrices"})
    decay, no_decay = build_optimizer(_model(), cfg).param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    assert all(p.ndim == 1 for p in no_decay["params"])


def test_lamb_settings_are_validated():
    for bad, fragment in (
        ("train.lamb.max_grad_norm=-1", "greater than or equal to 0"),
        ("train.lamb.bias_correction=1", "true or false"),
        ("train.lamb.weight_decay_on=biases", "'all' or 'matrices'"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config(overrides=[bad])
        assert bad.split("=")[0] in str(err.value) and fragment in str(err.value), str(err.value)


def _reference_lamb(params, grads, moments, step, *, lr, wd, bias_correction, max_norm):
    """LAMB written from its equations (float64), particleflow's variant: clip all gradients
    together to max_norm, Adam moments, optional bias correction, weight decay added to the
    update, trust ratio |p| / |update| where wd != 0."""
    b1, b2, eps = 0.9, 0.999, 1e-6
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    scale = max_norm / norm if max_norm and norm > max_norm else 1.0
    out = []
    for p, g, (m, v) in zip(params, grads, moments, strict=True):
        g = g * scale
        m.copy_(b1 * m + (1 - b1) * g)
        v.copy_(b2 * v + (1 - b2) * g * g)
        m_hat = m / (1 - b1**step) if bias_correction else m
        v_hat = v / (1 - b2**step) if bias_correction else v
        update = m_hat / (v_hat.sqrt() + eps) + wd * p
        if wd:
            w_norm, u_norm = float(p.norm()), float(update.norm())
            update = update * (w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0)
        out.append(p - lr * update)
    return out, norm


@pytest.mark.parametrize(
    "bias_correction,max_norm,wd", [(True, 1.0, 0.01), (False, 1.0, 0.01), (True, 0.0, 0.0)]
)
def test_steps_match_lamb_written_from_its_equations(bias_correction, max_norm, wd):
    model = _model()
    with torch.no_grad():
        model[0].bias.zero_()  # |p| = 0: the trust ratio falls back to 1
    cfg = TrainConfig(
        lr=0.01,
        weight_decay=wd,
        lamb={"bias_correction": bias_correction, "max_grad_norm": max_norm},
    )
    opt = build_optimizer(model, cfg)
    ref = [p.detach().double().clone() for p in model.parameters()]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ref]
    norms = []
    for step in (1, 2, 3):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        (100.0 * model(x).pow(2).mean()).backward()  # large enough for clipping to act
        grads = [p.grad.detach().double().clone() for p in model.parameters()]
        opt.step()
        ref, norm = _reference_lamb(
            ref,
            grads,
            moments,
            step,
            lr=0.01,
            wd=wd,
            bias_correction=bias_correction,
            max_norm=max_norm,
        )
        norms.append(norm)
        for p, r in zip(model.parameters(), ref, strict=True):
            torch.testing.assert_close(p.detach().double(), r, rtol=2e-5, atol=1e-7)
    assert min(norms) > 1.0  # clipping really took part where it is on


def test_frozen_parameters_left_out():
    model = _model()
    model[0].requires_grad_(False)
    opt = build_optimizer(model, TrainConfig())
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model[0].weight) not in ids and id(model[2].weight) in ids


def test_lamb_resume_bitwise():
    cfg = TrainConfig(num_steps=4)
    m1 = _model()
    o1 = build_optimizer(m1, cfg)
    s1 = build_scheduler(o1, cfg)
    for k in range(4):
        _step(m1, o1, k)
        s1.step()
    m2 = _model()
    o2 = build_optimizer(m2, cfg)
    s2 = build_scheduler(o2, cfg)
    for k in range(2):
        _step(m2, o2, k)
        s2.step()
    buf = io.BytesIO()
    torch.save({"model": m2.state_dict(), "opt": o2.state_dict(), "sched": s2.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # a checkpoint is data
    m3 = _model()
    o3 = build_optimizer(m3, cfg)
    s3 = build_scheduler(o3, cfg)
    m3.load_state_dict(state["model"])
    o3.load_state_dict(state["opt"])
    s3.load_state_dict(state["sched"])
    for k in range(2, 4):
        _step(m3, o3, k)
        s3.step()
    for (k, a), b in zip(m1.state_dict().items(), m3.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
