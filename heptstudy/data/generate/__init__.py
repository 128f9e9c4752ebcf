"""Synthetic CLD-like e+e- -> ttbar events at 365 GeV, written as the real TFDS data sets.

One simulation per event feeds both data sets: ``cld_edm_ttbar_hits`` (one row per tracker or
calorimeter hit) and ``cld_edm_ttbar_pf`` (one row per track or calorimeter cluster). The model
of the event is deliberately simple but keeps what matters for memory and time measurements: the
number of hits per event and its spread (calibration: ``detector``).

``occupancy_scale`` multiplies the shower and background hit counts; below 1 it also thins the
tracker and MIP hits with that probability (tests use ~0.03 for a few hundred hits per event).
Conventions of the stored features: ``data/README.md``.
"""

from heptstudy.data.generate.writer import generate_datasets as generate_datasets
