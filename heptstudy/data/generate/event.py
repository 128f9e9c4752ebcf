"""One simulated event -> the ``hits`` and ``pf`` examples (TFDS feature dicts), with truth
targets per particle that left a hit. ``pf``: tracks then clusters (calorimeter hits grouped by
particle). Jets: fastjet ee_genkt (R=0.4, p=-1) above 5 GeV pT, none without fastjet."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

from heptstudy.data.generate.calorimeter import calo_hits
from heptstudy.data.generate.detector import B_FIELD
from heptstudy.data.generate.particles import generate_particles
from heptstudy.data.generate.tracker import tracker_background, tracker_hits
from heptstudy.data.tfds import PF_NAME, X_WIDTH, Y_WIDTH

MIN_TRACK_HITS = 4  # pf data set: a charged particle with this many tracker hits has a track
JET_R = 0.4
JET_PTMIN = 5.0  # GeV


def particle_targets(
    parts: dict[str, np.ndarray], n_trk: np.ndarray, n_cal: np.ndarray, jet_idx: np.ndarray
) -> np.ndarray:
    """Target rows [n_particles, Y_WIDTH]; those with a hit numbered 1..P (column 13, else 0)."""
    has_hit = (n_trk + n_cal) > 0
    number = np.zeros(len(has_hit), dtype=np.int64)
    number[has_hit] = np.arange(1, has_hit.sum() + 1)
    props = np.zeros((len(has_hit), Y_WIDTH))
    props[:, 0] = parts["cls"]
    props[:, 1] = parts["charge"]
    props[:, 2] = parts["pt"]
    props[:, 3] = parts["eta"]
    props[:, 4] = np.sin(parts["phi"])
    props[:, 5] = np.cos(parts["phi"])
    props[:, 6] = parts["energy"]
    props[:, 7] = 0.0  # ispu
    props[:, 8] = 1.0  # generatorStatus: final state
    props[:, 9] = (n_trk > 0) * 1 + (n_cal > 0) * 2  # simulatorStatus (synthetic bitmask)
    props[:, 10] = n_trk >= MIN_TRACK_HITS
    props[:, 11] = n_cal > 0
    props[:, 12] = jet_idx
    props[:, 13] = number
    return props


def hit_targets(
    X: np.ndarray, owner: np.ndarray, is_trk: np.ndarray, props: np.ndarray
) -> np.ndarray:
    """Target rows [n_hits, Y_WIDTH]: particle_number, all properties on one hit per particle."""
    n_hits = len(X)
    ytarget = np.zeros((n_hits, props.shape[1]))
    ok = owner >= 0
    ytarget[ok, 13] = props[owner[ok], 13]
    rep = np.full(len(props), -1, dtype=np.int64)
    hit_idx = np.arange(n_hits)
    # innermost tracker hits first, then the most energetic calorimeter hits of the rest
    for sel, key in ((ok & is_trk, np.hypot(X[:, 6], X[:, 7])), (ok & ~is_trk, -X[:, 5])):
        if sel.any():
            order = np.lexsort((key[sel], owner[sel]))
            ow, hi = owner[sel][order], hit_idx[sel][order]
            first = np.r_[True, ow[1:] != ow[:-1]]
            need = rep[ow[first]] < 0
            rep[ow[first][need]] = hi[first][need]
    reps = np.flatnonzero(rep >= 0)
    ytarget[rep[reps]] = props[reps]
    return ytarget


def simulate_event(
    rng: np.random.Generator, occupancy_scale: float = 1.0
) -> dict[str, dict[str, np.ndarray]]:
    """Simulate one event; return the ``hits`` and ``pf`` examples (TFDS feature dicts)."""
    parts = generate_particles(rng)
    n_part = len(parts["pid"])
    trk, trk_owner = tracker_hits(rng, parts, occupancy_scale)
    bkg_t = tracker_background(rng, occupancy_scale)
    cal, cal_owner = calo_hits(rng, parts, occupancy_scale)
    # order: tracker hits (by system, layer), then calorimeter hits (by subdetector, system, layer)
    trk_all = np.concatenate([trk, bkg_t])
    trk_own = np.concatenate([trk_owner, np.full(len(bkg_t), -1)])
    o = np.lexsort((trk_all[:, 14], trk_all[:, 12]))
    trk_all, trk_own = trk_all[o], trk_own[o]
    o = np.lexsort((cal[:, 14], cal[:, 12], cal[:, 10]))
    cal, cal_owner = cal[o], cal_owner[o]
    X = np.concatenate([trk_all, cal])
    owner = np.concatenate([trk_own, cal_owner]).astype(np.int64)
    is_trk = np.zeros(len(X), bool)
    is_trk[: len(trk_all)] = True

    # jets of all particles and of the target particles (those with at least one hit)
    n_trk = np.bincount(trk_own[trk_own >= 0], minlength=n_part)
    n_cal = np.bincount(cal_owner[cal_owner >= 0], minlength=n_part)
    has_hit = (n_trk + n_cal) > 0
    p4 = np.concatenate([parts["energy"][:, None], parts["mom"]], axis=1)
    genjets, _ = cluster_jets(p4)
    targetjets, tj_assign_t = cluster_jets(p4[has_hit])
    jet_idx = np.zeros(n_part, dtype=np.int64)
    jet_idx[has_hit] = tj_assign_t

    props = particle_targets(parts, n_trk, n_cal, jet_idx)
    genmet = np.float32(parts["genmet"])
    hits_ex = {
        "X": X.astype(np.float32),
        "ytarget": hit_targets(X, owner, is_trk, props).astype(np.float32),
        "ycand": np.zeros((len(X), Y_WIDTH), np.float32),
        "genmet": genmet,
        "genjets": genjets,
        "targetjets": targetjets,
    }
    pf_ex = pf_elements(rng, parts, props, X, owner, is_trk, n_trk)
    pf_ex.update(genmet=genmet, genjets=genjets, targetjets=targetjets)
    return {"hits": hits_ex, "pf": pf_ex}


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
    cl_y = y[len(trk_ids) :]  # a view: the cluster rows
    cl_y[:, 13] = props[cl_ids, 13]
    full = ~has_track[cl_ids]
    cl_y[full] = props[cl_ids[full]]
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
    sq = [
        np.bincount(ow, weights=w * (Xc[:, 6 + k] - mean[ow, k]) ** 2, minlength=n_part)
        for k in range(3)
    ]
    var = np.stack(sq, 1) / np.maximum(esum, 1e-12)[:, None]
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
    clusters[:, 10:13] = np.stack(e_sub, 1)[cl_ids]
    clusters[:, 13] = cnt[cl_ids]
    clusters[:, 14:17] = np.sqrt(var[cl_ids])
    return cl_ids, clusters


def cluster_jets(p4: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Jets [J, 4] (pt, eta, phi, energy), sorted by energy, of four-vectors (E, px, py, pz)
    [n, 4], and each input's jet index (1-based; 0 = in no jet)."""
    assign = np.zeros(len(p4), dtype=np.int64)
    fj = fastjet_module()
    if fj is None or len(p4) == 0:
        return np.zeros((0, 4), np.float32), assign
    pjs = []
    for i, (e, px, py, pz) in enumerate(p4):
        pj = fj.PseudoJet(float(px), float(py), float(pz), float(e))
        pj.set_user_index(i)
        pjs.append(pj)
    cs = fj.ClusterSequence(pjs, fj.JetDefinition(fj.ee_genkt_algorithm, JET_R, -1.0))
    jets = fj.sorted_by_E(cs.inclusive_jets(JET_PTMIN))
    out = np.zeros((len(jets), 4), np.float32)
    for j, jet in enumerate(jets):
        out[j] = (jet.pt(), jet.eta(), jet.phi_std(), jet.E())
        for c in jet.constituents():
            assign[c.user_index()] = j + 1
    return out, assign


@functools.cache
def fastjet_module():
    """The fastjet module, or None; its banner (printed by C++ on first use) is swallowed."""
    try:
        import fastjet
    except ImportError:
        return None
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            jd = fastjet.JetDefinition(fastjet.ee_genkt_algorithm, JET_R, -1.0)
            fastjet.ClusterSequence([fastjet.PseudoJet(1.0, 0.0, 0.0, 1.0)], jd).inclusive_jets(0.0)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return fastjet
