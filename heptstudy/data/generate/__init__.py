"""Synthetic CLD-like e+e- -> ttbar events at 365 GeV, written as the real TFDS data sets.

One simulation per event feeds both data sets: ``cld_edm_ttbar_hits`` (one row per tracker or
calorimeter hit) and ``cld_edm_ttbar_pf`` (one row per track or calorimeter cluster). The model
of the event is deliberately simple but keeps what matters for memory and time measurements: the
number of hits per event and its spread. The submodules follow the simulation: particles
(tt̄ decays, jets of the five target classes), detector (CLD-like geometry), tracker (helices
through barrel layers and endcap disks), calorimeter and cells (ECAL/HCAL showers, MIP hits,
background, merged cells), targets, pf (tracks and clusters), jets, event and writer.

``occupancy_scale`` multiplies the shower and background hit counts; below 1 it also thins the
tracker and MIP hits with that probability (tests use ~0.03 for a few hundred hits per event).
At ``occupancy_scale=1`` the median event has about 900 tracker hits and 8,500 calorimeter hits
with a tail past 13,000 hits. Conventions of the stored features: ``data/README.md``.
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
