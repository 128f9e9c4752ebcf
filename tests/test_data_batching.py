"""Padding, masks, the batch loader and its resume, fixed evaluation events, neighbourhood
features against brute force (also near phi = +-pi)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heptstudy.config import load_config
from heptstudy.data.batching import BatchLoader, collate, load_events, validation_batches
from heptstudy.data.features import (
    NEAREST_CAP,
    POS_X,
    POS_Y,
    TRACKER,
    tracker_neighbourhood,
)
from heptstudy.data.generate import generate_datasets
from heptstudy.data.schema import COS_PHI, ETA, SIN_PHI
from heptstudy.data.tfds import open_dataset

RADII = [0.05, 0.2]


def brute_force_neighbourhood(X: np.ndarray, radii) -> np.ndarray:
    """Reference O(N^2) implementation of :func:`tracker_neighbourhood` (for tests)."""
    X = np.asarray(X, dtype=np.float64)
    n, k = len(X), len(radii)
    out = np.zeros((n, k + 3))
    out[:, -1] = NEAREST_CAP
    trk = np.flatnonzero(X[:, 0] == TRACKER)
    phi = np.arctan2(X[:, SIN_PHI], X[:, COS_PHI])
    rad = np.hypot(X[:, POS_X], X[:, POS_Y]) / 1000.0
    for a in range(n):
        others = trk[trk != a]
        if len(others) == 0:
            continue
        deta = X[others, ETA] - X[a, ETA]
        dphi = np.angle(np.exp(1j * (phi[others] - phi[a])))
        d = np.hypot(deta, dphi)
        for c, r in enumerate(radii):
            out[a, c] = (d <= r).sum()
        sel = d <= max(radii)
        if sel.any():
            out[a, k] = rad[others[sel]].mean()
            out[a, k + 1] = rad[others[sel]].std() if sel.sum() > 1 else 0.0
        out[a, -1] = min(d.min(), NEAREST_CAP)
    return out.astype(np.float32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfds")
    generate_datasets(d, 9, 6, seed=11, configs=("1", "2"), occupancy_scale=0.03, progress=False)
    return d


def _config(tiny, *extra):
    return load_config(
        overrides=[
            f"data.data_dir={tiny}",
            'data.configs=["1","2"]',
            "data.pad_to_multiple=32",
            "data.nvalid=3",
            "data.ntest=2",
            "train.global_batch_size=4",
            *extra,
        ]
    )


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_collate_padding_and_mask(tiny):
    ds = open_dataset(tiny, "cld_edm_ttbar_hits:3.2.1", ["1", "2"], "train")
    evs = [ds[i] for i in (0, 10, 4)]
    assert "neighbourhood" not in collate(evs, 32)
    for ev in evs:
        ev["neighbourhood"] = tracker_neighbourhood(ev["X"], RADII)
    b = collate(evs, 32)
    lengths = [len(e["X"]) for e in evs]
    padded = [-(-n // 32) * 32 for n in lengths]
    S = max(padded)
    assert b["X"].shape == (3, S, 15) and b["X"].dtype == torch.float32
    assert b["ytarget"].shape == (3, S, 14)
    assert b["mask"].dtype == torch.bool and b["mask"].shape == (3, S)
    assert b["neighbourhood"].shape == (3, S, len(RADII) + 3)
    assert b["event_index"].tolist() == [0, 10, 4] and b["event_index"].dtype == torch.int64
    assert b["length"].tolist() == lengths and b["padded_length"].tolist() == padded
    for k, ev in enumerate(evs):
        n = lengths[k]
        assert b["mask"][k, :n].all() and not b["mask"][k, n:].any()
        np.testing.assert_array_equal(b["X"][k, :n].numpy(), ev["X"])
        np.testing.assert_array_equal(b["ytarget"][k, :n].numpy(), ev["ytarget"])
        assert not b["X"][k, n:].any() and not b["ytarget"][k, n:].any()
        assert not b["neighbourhood"][k, n:].any()
        np.testing.assert_allclose(
            b["neighbourhood"][k, :n].numpy(), tracker_neighbourhood(ev["X"], RADII)
        )


def test_collate_exact_multiple_and_pf(tiny):
    ev = {"X": np.ones((64, 15), np.float32), "ytarget": np.ones((64, 14), np.float32)}
    b = collate([ev], 32)
    assert b["X"].shape[1] == 64 and b["padded_length"].tolist() == [64]
    pf = open_dataset(tiny, "cld_edm_ttbar_pf:3.2.1", ["1"], "test")
    b = collate([pf[0], pf[1]], 16)
    assert b["X"].shape[2] == 17 and set(b) == {
        "X",
        "layout",
        "mask",
        "ytarget",
        "event_index",
        "length",
        "padded_length",
    }


def test_neighbourhood_matches_brute_force_on_events(tiny):
    ds = open_dataset(tiny, "cld_edm_ttbar_hits:3.2.1", ["1"], "train")
    for i in range(3):
        X = ds[i]["X"]
        np.testing.assert_allclose(
            tracker_neighbourhood(X, RADII), brute_force_neighbourhood(X, RADII), atol=1e-5
        )


@pytest.mark.parametrize("radii", [[0.02, 0.05], [0.05, 0.2], [0.3, 1.0]])
def test_neighbourhood_brute_force_full_phi_range(radii):
    # sparse hits all around phi: nearest-hit distances up to the cap cross the seam
    rng = np.random.default_rng(11)
    n = 300
    X = np.zeros((n, 15), np.float32)
    X[:, 0] = rng.choice([1, 2], n, p=[0.3, 0.7])
    X[:, 2] = rng.normal(0, 1.0, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    X[:, 3], X[:, 4] = np.sin(phi), np.cos(phi)
    X[:, 6], X[:, 7] = rng.uniform(-2000, 2000, n), rng.uniform(-2000, 2000, n)
    got = tracker_neighbourhood(X, radii)
    np.testing.assert_allclose(got, brute_force_neighbourhood(X, radii), atol=1e-5)
    assert (got[:, -1] < 1.0).any() and (got[:, 0] > 0).any()


def test_neighbourhood_brute_force_near_phi_wrap():
    rng = np.random.default_rng(4)
    n = 400
    X = np.zeros((n, 15), np.float32)
    X[:, 0] = rng.choice([1, 2], n)
    X[:, 2] = rng.normal(0, 0.1, n)
    side = rng.random(n) < 0.5
    phi = np.where(side, rng.uniform(np.pi - 0.12, np.pi, n), rng.uniform(-np.pi, -np.pi + 0.12, n))
    phi[:3] = [np.pi, -np.pi, np.pi - 1e-7]  # exactly on the seam
    scale = rng.uniform(0.2, 3.0, n)  # common positive factor, as in the real hit data
    X[:, 3] = np.sin(phi) * scale
    X[:, 4] = np.cos(phi) * scale
    X[:, 6] = rng.uniform(10, 2000, n)
    X[:, 7] = rng.uniform(-50, 50, n)
    got = tracker_neighbourhood(X, RADII)
    want = brute_force_neighbourhood(X, RADII)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # across the seam: neighbours on the other side are counted
    trk = X[:, 0] == 1
    assert got[trk & side, 1].mean() > 0.8 * trk.sum() * 0.5
    # a duplicated hit is another hit at distance 0; a lone tracker hit has none
    X2 = np.zeros((3, 15), np.float32)
    X2[:, 0] = [1, 1, 2]
    X2[:, 4] = 1.0
    np.testing.assert_allclose(
        tracker_neighbourhood(X2, RADII), brute_force_neighbourhood(X2, RADII)
    )
    assert tracker_neighbourhood(X2[:1], RADII)[0, -1] == 1.0


def test_batch_loader_resume_and_epochs(tiny):
    cfg = _config(tiny)
    a = BatchLoader(cfg, per_device_batch=4)
    assert a.batch_size == 4 and len(a.dataset) == 18
    for _ in range(3):
        next(a)
    state = a.state_dict()
    want = [next(a) for _ in range(6)]  # runs into the next epochs
    b = BatchLoader(cfg, per_device_batch=4)
    b.load_state_dict(state)
    for w in want:
        g = next(b)
        assert set(g) == set(w)
        for k in w:
            assert _same(g[k], w[k]), k
    assert "neighbourhood" in want[0]
    # every event once per epoch: the first 4 batches + 2 events cover the 18 events
    c = BatchLoader(cfg, per_device_batch=4)
    seen = torch.cat([next(c)["event_index"] for _ in range(5)]).tolist()
    assert sorted(seen[:18]) == list(range(18))


def test_batch_loader_ranks_disjoint(tiny):
    cfg = _config(tiny, "data.sampler=interleaved_shards")
    r0 = BatchLoader(cfg, rank=0, world_size=2, per_device_batch=2)
    r1 = BatchLoader(cfg, rank=1, world_size=2, per_device_batch=2)
    assert r0.batch_size == 2
    e0 = torch.cat([next(r0)["event_index"] for _ in range(4)]).tolist()
    e1 = torch.cat([next(r1)["event_index"] for _ in range(4)]).tolist()
    assert not set(e0) & set(e1)


def test_tracker_features_switch_and_pf(tiny):
    off = BatchLoader(_config(tiny, "model.tracker_features.enabled=false"), per_device_batch=4)
    assert "neighbourhood" not in next(off)
    pf = BatchLoader(
        _config(tiny, "model.variant=track_cluster_mlpf", "data.dataset=cld_edm_ttbar_pf:3.2.1"),
        per_device_batch=4,
    )
    b = next(pf)
    assert "neighbourhood" not in b and b["X"].shape[2] == 17


def test_load_events_and_fixed_evaluation_events(tiny):
    cfg = _config(tiny)
    b = load_events(cfg, [5, 1, 16], "train")
    assert b["event_index"].tolist() == [5, 1, 16]
    ds = open_dataset(tiny, "cld_edm_ttbar_hits:3.2.1", ["1", "2"], "train")
    radii = cfg.model.tracker_features.radii
    for k, i in enumerate([5, 1, 16]):  # the batch carries each event's tracker neighbourhood
        n = len(ds[i]["X"])
        want = tracker_neighbourhood(ds[i]["X"], radii)
        np.testing.assert_array_equal(b["neighbourhood"][k, :n].numpy(), want)
    b2 = load_events(cfg, [5, 1, 16], "train")
    assert all(_same(b[k], b2[k]) for k in b)
    val = validation_batches(cfg, 2)
    assert [x["event_index"].tolist() for x in val] == [[0, 1], [2]]
    too_many = _config(tiny, "data.nvalid=10", "data.ntest=5")
    from heptstudy.errors import DataError

    with pytest.raises(DataError, match="nvalid.*test split"):
        validation_batches(too_many, 2)
