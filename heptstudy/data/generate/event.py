"""One simulated event -> the ``hits`` and ``pf`` examples (TFDS feature dicts)."""

from __future__ import annotations

import numpy as np

from heptstudy.data.generate.calorimeter import calo_hits
from heptstudy.data.generate.jets import cluster_jets
from heptstudy.data.generate.particles import generate_particles
from heptstudy.data.generate.pf import pf_elements
from heptstudy.data.generate.targets import hit_targets, particle_targets
from heptstudy.data.generate.tracker import tracker_background, tracker_hits
from heptstudy.data.tfds import Y_WIDTH


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
