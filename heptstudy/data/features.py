"""Tracker-neighbourhood features: summaries of the tracker hits around every hit in (eta, phi).

For each hit (tracker or calorimeter) and radii ``r_1 < ... < r_K`` the block holds
``K + 3`` columns:

* ``count_k``: number of *other* tracker hits within distance ``r_k``;
* ``mean_radius``: mean transverse radius (metres) of the other tracker hits within the largest
  radius (0 when there are none);
* ``radius_spread``: their standard deviation (metres; 0 when fewer than two);
* ``nearest``: distance to the nearest other tracker hit, capped at ``NEAREST_CAP``.

The distance is ``sqrt(deta^2 + dphi^2)`` with ``dphi`` wrapped into ``[-pi, pi]`` (a periodic
k-d tree, ``scipy.spatial.cKDTree(boxsize=...)``), phi read as ``atan2(sin_phi, cos_phi)`` so a
common positive factor on the two columns does not matter.  Cost O(N log N + pairs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.spatial import cKDTree

#: Nearest-tracker-hit distances at or above this are reported as this value.
NEAREST_CAP = 1.0
TRACKER = 1  # elemtype of tracker hits
ETA, SIN_PHI, COS_PHI, POS_X, POS_Y = 2, 3, 4, 6, 7


def hit_phi(X: np.ndarray) -> np.ndarray:
    """phi of every row, ``atan2(sin_phi, cos_phi)``: invariant to a common positive factor."""
    return np.arctan2(X[:, SIN_PHI], X[:, COS_PHI])


def feature_names(radii: Sequence[float]) -> list[str]:
    return [f"count_r{r:g}" for r in radii] + ["mean_radius", "radius_spread", "nearest"]


def tracker_neighbourhood(X: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    """The ``[N, len(radii) + 3]`` float32 neighbourhood block of the hits ``X [N, 15]``."""
    radii = [float(r) for r in radii]
    if not radii or min(radii) <= 0:
        raise ValueError(f"radii must be positive, got {radii}")
    X = np.asarray(X)
    n, k = len(X), len(radii)
    out = np.zeros((n, k + 3), dtype=np.float32)
    if n == 0:
        return out
    out[:, -1] = NEAREST_CAP
    is_trk = X[:, 0] == TRACKER
    trk = np.flatnonzero(is_trk)
    if len(trk) == 0:
        return out
    eta = X[:, ETA].astype(np.float64)
    phi = np.mod(hit_phi(X).astype(np.float64), 2 * np.pi)
    phi[phi >= 2 * np.pi] = 0.0  # mod can round up to exactly 2 pi
    rmax = max(max(radii), NEAREST_CAP)
    eta0 = eta.min()
    box_eta = (eta.max() - eta0) + 2 * rmax + 1.0  # wider than any query: no wrap in eta
    pts = np.stack([eta - eta0, phi], axis=1)
    box = np.array([box_eta, 2 * np.pi])
    fast = {"balanced_tree": False, "compact_nodes": False}  # quicker to build, same answers
    tree_all = cKDTree(pts, boxsize=box, **fast)
    tree_trk = cKDTree(pts[trk], boxsize=box, **fast)

    # all (hit, tracker hit) pairs within the largest radius, zero distances (and so each tracker
    # hit with itself) included; self pairs are taken out below by subtraction
    pairs = tree_all.sparse_distance_matrix(tree_trk, max(radii), output_type="ndarray")
    i, jt, d = pairs["i"], pairs["j"], pairs["v"]
    rad_trk = np.hypot(X[trk, POS_X], X[trk, POS_Y]).astype(np.float64) / 1000.0
    self_count = np.zeros(n)
    self_count[trk] = 1.0
    for c, r in enumerate(radii):
        out[:, c] = np.bincount(i, weights=d <= r, minlength=n) - self_count
    rad = rad_trk[jt]
    cnt = np.bincount(i, minlength=n) - self_count
    s1 = np.bincount(i, weights=rad, minlength=n)
    s2 = np.bincount(i, weights=rad * rad, minlength=n)
    s1[trk] -= rad_trk
    s2[trk] -= rad_trk**2
    has = cnt > 0
    mean = np.divide(s1, cnt, out=np.zeros(n), where=has)
    var = np.divide(s2, cnt, out=np.zeros(n), where=has) - mean**2
    out[:, k] = mean
    out[:, k + 1] = np.sqrt(np.clip(var, 0.0, None)) * (cnt > 1)

    # nearest other tracker hit: from the pairs where there are any, else a capped tree query
    nearest = np.full(n, np.inf)
    np.minimum.at(nearest, i, np.where(trk[jt] == i, np.inf, d))
    rest = np.flatnonzero(~np.isfinite(nearest))
    if len(rest):
        kq = 2 if len(trk) > 1 else 1
        dist, idx = tree_trk.query(pts[rest], k=kq, distance_upper_bound=NEAREST_CAP)
        dist = dist.reshape(len(rest), kq)
        idx = idx.reshape(len(rest), kq)
        own = np.full(n, -1)
        own[trk] = np.arange(len(trk))
        first_is_self = idx[:, 0] == own[rest]
        nearest[rest] = np.where(first_is_self, dist[:, -1] if kq == 2 else np.inf, dist[:, 0])
    out[:, -1] = np.minimum(nearest, NEAREST_CAP)
    return out


def brute_force_neighbourhood(X: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    """Reference O(N^2) implementation of :func:`tracker_neighbourhood` (for tests)."""
    X = np.asarray(X, dtype=np.float64)
    n, k = len(X), len(radii)
    out = np.zeros((n, k + 3))
    out[:, -1] = NEAREST_CAP
    trk = np.flatnonzero(X[:, 0] == TRACKER)
    phi = hit_phi(X)
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
