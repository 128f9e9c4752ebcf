"""One simulated event -> the ``hits`` and ``pf`` examples (TFDS feature dicts), with the truth
targets of the hits data set: the properties of each particle that left a hit (``ytarget`` row
layout), and which hit carries them."""

from __future__ import annotations

import numpy as np

from heptstudy.data.generate.calorimeter import calo_hits
from heptstudy.data.generate.jets import cluster_jets
from heptstudy.data.generate.particles import generate_particles
from heptstudy.data.generate.pf import pf_elements
from heptstudy.data.generate.tracker import tracker_background, tracker_hits
from heptstudy.data.tfds import Y_WIDTH

MIN_TRACK_HITS = 4  # pf data set: a charged particle with this many tracker hits has a track


def particle_targets(
    parts: dict[str, np.ndarray], n_trk: np.ndarray, n_cal: np.ndarray, jet_idx: np.ndarray
) -> np.ndarray:
    """Target row [n_particles, Y_WIDTH] of every particle; those with a hit are numbered 1..P
    in generator order (column 13, 0 for the others)."""
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
    """Target row [n_hits, Y_WIDTH] of every hit: a hit of a particle carries its
    particle_number; one representative hit per particle carries all its properties."""
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
