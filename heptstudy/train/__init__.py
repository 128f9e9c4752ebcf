"""Training: losses (matching, auxiliary, grouping), LAMB with the cosine schedule, the trainer
and its distributed helpers, each imported from its own module."""
