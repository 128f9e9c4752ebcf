"""GPU memory without the hardware: the target-faithful fake step, the caching-allocator
simulator and bench-process replay, memory models, auto's plan predictor, the validation
against measured reports and the blind predictions."""
