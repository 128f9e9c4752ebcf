"""Models of the study: ``build_model(config)`` and ``example_batch(...)``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from heptstudy.config import HIT_VARIANT, TRACK_CLUSTER_VARIANT, Config
from heptstudy.data.schema import HIT_FEATURES, PF_FEATURES, TARGET_COLUMNS


def build_model(config: Config) -> nn.Module:
    """The configured model, initialised from the global RNG (seed it first), with its
    checkpointing plan applied (:mod:`heptstudy.model.checkpoint_plan`)."""
    if config.model.variant == HIT_VARIANT:
        from heptstudy.model.checkpoint_plan import apply_plan, plan_of
        from heptstudy.model.hit_model import HitModel

        return apply_plan(HitModel(config), plan_of(config))
    if config.model.variant == TRACK_CLUSTER_VARIANT:
        from heptstudy.model.track_cluster import TrackClusterModel

        return TrackClusterModel(config)
    raise ValueError(f"unknown model.variant {config.model.variant!r}")


def example_batch(
    config: Config,
    batch_size: int,
    hits_per_event: int | Sequence[int],
    seed: int = 0,
    batching: str | None = None,
) -> dict[str, torch.Tensor]:
    """A random, well-formed batch laid out like real ones (tests and quick checks);
    ``batching`` None: ``config.data.batching``."""
    lengths = (
        [int(hits_per_event)] * batch_size
        if isinstance(hits_per_event, int)
        else [int(n) for n in hits_per_event]
    )
    if len(lengths) != batch_size or min(lengths) < 1:
        raise ValueError(f"hits_per_event must give {batch_size} positive lengths, got {lengths}")
    from heptstudy.data.batching import collate

    rng = np.random.default_rng(seed)
    hits = config.model.variant == HIT_VARIANT
    nfeat = len(HIT_FEATURES) if hits else len(PF_FEATURES)
    events = [_random_event(rng, n, nfeat) for n in lengths]
    width = config.model.tracker_features.num_features
    if hits and width:
        for ev in events:
            ev["neighbourhood"] = rng.random((len(ev["X"]), width), dtype=np.float32)
    return collate(events, config.data.pad_to_multiple, batching=batching or config.data.batching)


#: Columns of the raw features that ``example_batch`` fills; the hit and the track/cluster
#: layouts share these positions ("et" is "pt/et", "energy" is "p/energy" in the latter).
_X = {name: HIT_FEATURES.index(name) for name in ("elemtype", "et", "eta", "sin_phi", "cos_phi")}
_X_ENERGY = HIT_FEATURES.index("energy")
_Y = {name: TARGET_COLUMNS.index(name) for name in TARGET_COLUMNS}


def _random_event(rng: np.random.Generator, n: int, nfeat: int):
    n_tracker = max(1, n // 10)
    eta = rng.normal(0.0, 1.5, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    scale = rng.uniform(0.5, 2.0)  # real hit data carry a common factor on (sin, cos)
    X = np.zeros((n, nfeat), np.float32)
    X[:, _X["elemtype"]] = np.where(np.arange(n) < n_tracker, 1, 2)
    X[:, _X["et"]] = rng.exponential(0.5, n)
    X[:, _X["eta"]] = eta
    X[:, _X["sin_phi"]], X[:, _X["cos_phi"]] = scale * np.sin(phi), scale * np.cos(phi)
    X[:, _X_ENERGY] = X[:, _X["et"]] * np.cosh(eta)
    detector = [i for i in range(nfeat) if i not in (*_X.values(), _X_ENERGY)]
    X[:, detector] = rng.normal(0.0, 100.0, (n, len(detector)))
    n_particles = max(1, n // 30)
    owner = rng.integers(0, n_particles + 1, n)  # 0: hit of no particle
    y = np.zeros((n, len(TARGET_COLUMNS)), np.float32)
    y[:, _Y["particle_number"]] = owner
    for p in range(1, n_particles + 1):
        idx = np.flatnonzero(owner == p)
        if idx.size == 0:
            continue
        r = idx[0]
        cls = rng.integers(1, 6)
        pt = rng.exponential(3.0) + 0.1
        y[r, _Y["PDG"]] = cls  # the class index
        y[r, _Y["charge"]] = (cls in (1, 4, 5)) * rng.choice([-1, 1])
        y[r, _Y["pt"]], y[r, _Y["eta"]] = pt, eta[r]
        y[r, _Y["sin_phi"]], y[r, _Y["cos_phi"]] = np.sin(phi[r]), np.cos(phi[r])
        y[r, _Y["energy"]] = pt * np.cosh(eta[r])
    return {"X": X, "ytarget": y}
