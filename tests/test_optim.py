"""LAMB optimizer and cosine schedule."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from pytorch_optimizer import Lamb

from heptstudy.config import TrainConfig
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
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(
        p.ndim == 1 for p in no_decay["params"]
    )
    assert all(g["lr"] == 1e-2 for g in opt.param_groups)
    _step(model, opt, 0)
    for k, v in model.state_dict().items():
        assert not torch.equal(v, before[k]), k
        assert torch.isfinite(v).all()


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
