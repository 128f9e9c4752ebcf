"""Jets with fastjet: ee_genkt (R=0.4, p=-1) above 5 GeV pT; empty when fastjet is missing."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

JET_R = 0.4
JET_PTMIN = 5.0  # GeV


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
