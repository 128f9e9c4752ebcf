"""Synthetic CLD-like e+e- -> ttbar events at 365 GeV, written as the real TFDS data sets.

One simulation per event feeds both data sets: ``cld_edm_ttbar_hits`` (one row per tracker or
calorimeter hit) and ``cld_edm_ttbar_pf`` (one row per track or calorimeter cluster).  The model
of the event is deliberately simple but keeps what matters for memory and time measurements: the
number of hits per event and its spread.

* :mod:`~heptstudy.data.generate.particles`: tt̄ decay mode (all-hadronic, semi-leptonic,
  di-leptonic), top -> b W, W -> q q' or l nu with two-body kinematics and Lorentz boosts
  (:mod:`~heptstudy.data.generate.kinematics`); each quark fragments into a jet of particles of
  the five target classes (charged hadron, neutral hadron, photon, electron, muon) with
  multiplicity growing with log(E) and Dirichlet energy sharing.  Masses and charges from
  ``particle``.
* :mod:`~heptstudy.data.generate.detector`: CLD-like geometry, subdetector codes and the hit-count
  calibration; :mod:`~heptstudy.data.generate.hits`: the hit row.
* :mod:`~heptstudy.data.generate.tracker`: charged particles follow helices in a 2 T field through
  barrel layers (vertex 13/35/57 mm, double-sided; inner 127/400/670 mm; outer
  1000/1568/2136 mm) and endcap disks; a hit where the helix crosses a layer inside its
  acceptance (97 % efficiency), plus beam-induced background hits.
* :mod:`~heptstudy.data.generate.calorimeter` and :mod:`~heptstudy.data.generate.cells`: 40-layer
  ECAL (barrel r 2150-2352 mm) and 44-layer HCAL (r 2400-3566 mm) with endcaps; electromagnetic
  showers for photons and electrons, hadronic showers (starting point exponential in interaction
  lengths) for hadrons, one MIP hit per layer for muons and for hadrons before they shower; hit
  counts grow with energy; low-energy background hits, mostly forward; contributions to the same
  cell (5 mm ECAL, 30 mm HCAL) merged into one hit.
* :mod:`~heptstudy.data.generate.targets`: particle and hit targets;
  :mod:`~heptstudy.data.generate.pf`: tracks and clusters; :mod:`~heptstudy.data.generate.jets`:
  fastjet jets; :mod:`~heptstudy.data.generate.event`: :func:`simulate_event`, one event -> both
  examples.
* :mod:`~heptstudy.data.generate.writer`: :func:`generate_datasets`, both data sets on disk.

``occupancy_scale`` multiplies the shower and background hit counts; below 1 it also thins the
tracker and MIP hits with that probability (tests use ~0.03 for a few hundred hits per event).
At ``occupancy_scale=1`` the median event has about 900 tracker hits and 8,500 calorimeter hits
with a tail past 13,000 hits.

Conventions of the stored features are documented in ``data/README.md``.
"""

from heptstudy.data.generate.event import simulate_event
from heptstudy.data.generate.jets import cluster_jets
from heptstudy.data.generate.particles import generate_particles
from heptstudy.data.generate.writer import GENERATOR_VERSION, generate_datasets
from heptstudy.data.generate.writer import _event_rng as _event_rng

__all__ = [
    "GENERATOR_VERSION",
    "cluster_jets",
    "generate_datasets",
    "generate_particles",
    "simulate_event",
]
