"""Training: losses (matching, auxiliary, grouping), LAMB with the cosine schedule, trainer.

``heptstudy.train.losses`` and ``heptstudy.train.optim`` are imported here; the trainer and
the distributed helpers are imported from their own modules.
"""

from heptstudy.train.losses import compute_losses, element_losses, hit_losses, targets_from_batch
from heptstudy.train.optim import build_optimizer, build_scheduler

__all__ = [
    "build_optimizer",
    "build_scheduler",
    "compute_losses",
    "element_losses",
    "hit_losses",
    "targets_from_batch",
]
