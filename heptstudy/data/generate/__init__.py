"""Synthetic CLD-like e+e- -> ttbar events at 365 GeV, one simulation feeding both TFDS data
sets (hits and pf). Simple, but keeps what memory and time depend on: hits per event and their
spread. ``occupancy_scale`` < 1 thins the hits (tests use ~0.03). Conventions: ``data/README.md``.
"""

from heptstudy.data.generate.writer import generate_datasets as generate_datasets
