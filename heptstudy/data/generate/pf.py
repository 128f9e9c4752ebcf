"""The ``cld_edm_ttbar_pf`` example of an event: tracks (charged particles with a track) then
clusters (calorimeter hits grouped by particle), with element-wise targets."""

from __future__ import annotations

import numpy as np

from heptstudy.data.generate.detector import B_FIELD
from heptstudy.data.tfds import PF_NAME, X_WIDTH, Y_WIDTH


def pf_elements(rng, parts, props, X, owner, is_trk, n_trk) -> dict[str, np.ndarray]:
    """Tracks then clusters of one event; a particle's properties go on its track if it has one
    (``props`` column 10), else on its cluster; its other elements carry only particle_number."""
    has_track = props[:, 10] > 0
    trk_ids = np.flatnonzero(has_track)
    tracks = _tracks(rng, parts, trk_ids, X, owner, is_trk, n_trk)
    cal = (owner >= 0) & ~is_trk
    cl_ids, clusters = _clusters(X[cal], owner[cal], len(props))
    Xpf = np.concatenate([tracks, clusters]).astype(np.float32)
    y = np.zeros((len(Xpf), Y_WIDTH))
    y[: len(trk_ids)] = props[trk_ids]
    cl_props = np.zeros((len(cl_ids), Y_WIDTH))
    cl_props[:, 13] = props[cl_ids, 13]
    full = ~has_track[cl_ids]
    cl_props[full] = props[cl_ids[full]]
    y[len(trk_ids) :] = cl_props
    return {
        "X": Xpf,
        "ytarget": y.astype(np.float32),
        "ycand": np.zeros((len(Xpf), Y_WIDTH), np.float32),
    }


def _tracks(rng, parts, trk_ids, X, owner, is_trk, n_trk) -> np.ndarray:
    """Track rows: smeared kinematics, chi2/ndf, dE/dx from the hits, innermost radius."""
    n_part = len(parts["pid"])
    tracks = np.zeros((len(trk_ids), X_WIDTH[PF_NAME]))
    if not len(trk_ids):
        return tracks
    pt = parts["pt"][trk_ids] * (1 + rng.normal(0, 2e-5 * parts["pt"][trk_ids] + 1e-3))
    eta = parts["eta"][trk_ids] + rng.normal(0, 1e-4, len(trk_ids))
    phi = parts["phi"][trk_ids] + rng.normal(0, 1e-4, len(trk_ids))
    q = parts["charge"][trk_ids]
    nh = n_trk[trk_ids]
    sel = (owner >= 0) & is_trk
    rt = np.hypot(X[sel, 6], X[sel, 7])
    rmin = np.full(n_part, np.inf)
    np.minimum.at(rmin, owner[sel], rt)
    dedx_sum = np.bincount(owner[sel], weights=X[sel, 5], minlength=n_part)
    tracks[:, 0] = 1
    tracks[:, 1] = pt
    tracks[:, 2] = eta
    tracks[:, 3] = np.sin(phi)
    tracks[:, 4] = np.cos(phi)
    tracks[:, 5] = pt * np.cosh(eta)
    ndf = 2 * nh - 5
    tracks[:, 6] = rng.chisquare(np.maximum(ndf, 1))
    tracks[:, 7] = ndf
    tracks[:, 8] = dedx_sum[trk_ids] / nh
    tracks[:, 9] = 0.1 * tracks[:, 8]
    tracks[:, 10] = rmin[trk_ids]
    tracks[:, 11] = np.sinh(eta)
    tracks[:, 12] = rng.normal(0, 0.01, len(trk_ids))
    tracks[:, 13] = q * 0.3 * B_FIELD / pt * 1e-3
    tracks[:, 14] = rng.normal(0, 0.02, len(trk_ids))
    tracks[:, 15] = rng.normal(0, 0.03, len(trk_ids))
    return tracks


def _clusters(Xc: np.ndarray, ow: np.ndarray, n_part: int) -> tuple[np.ndarray, np.ndarray]:
    """Particle ids and rows of the clusters of each particle's calorimeter hits ``Xc``."""
    cl_ids = np.unique(ow)
    clusters = np.zeros((len(cl_ids), X_WIDTH[PF_NAME]))
    if not len(cl_ids):
        return cl_ids, clusters
    w = Xc[:, 5]
    esum = np.bincount(ow, weights=w, minlength=n_part)
    cnt = np.bincount(ow, minlength=n_part)
    mean = np.stack(
        [np.bincount(ow, weights=w * Xc[:, 6 + k], minlength=n_part) for k in range(3)], 1
    )
    mean /= np.maximum(esum, 1e-12)[:, None]
    var = (
        np.stack(
            [
                np.bincount(ow, weights=w * (Xc[:, 6 + k] - mean[ow, k]) ** 2, minlength=n_part)
                for k in range(3)
            ],
            1,
        )
        / np.maximum(esum, 1e-12)[:, None]
    )
    e_sub = [np.bincount(ow, weights=w * (Xc[:, 10] == s), minlength=n_part) for s in (1, 2, 3)]
    m = mean[cl_ids]
    rt = np.hypot(m[:, 0], m[:, 1])
    r3 = np.linalg.norm(m, axis=1)
    e = esum[cl_ids]
    clusters[:, 0] = 2
    clusters[:, 1] = e * rt / np.maximum(r3, 1e-6)
    clusters[:, 2] = np.arcsinh(m[:, 2] / np.maximum(rt, 1e-6))
    clusters[:, 3] = m[:, 1] / np.maximum(rt, 1e-6)
    clusters[:, 4] = m[:, 0] / np.maximum(rt, 1e-6)
    clusters[:, 5] = e
    clusters[:, 6:9] = m
    clusters[:, 9] = np.arctan2(rt, m[:, 2])
    clusters[:, 10] = e_sub[0][cl_ids]
    clusters[:, 11] = e_sub[1][cl_ids]
    clusters[:, 12] = e_sub[2][cl_ids]
    clusters[:, 13] = cnt[cl_ids]
    clusters[:, 14:17] = np.sqrt(var[cl_ids])
    return cl_ids, clusters
