"""Training: losses, LAMB and its schedule, the trainer and its helpers (each in its module)."""
