"""Synthetic CLD-like e+e- -> ttbar events at 365 GeV, one simulation feeding both TFDS data
sets (hits, pf): simple, but with the hits per event and spread that memory and time follow.
``occupancy_scale`` < 1 thins the hits (tests use ~0.03). Conventions: ``data/README.md``."""

from heptstudy.data.generate.writer import generate_datasets as generate_datasets
