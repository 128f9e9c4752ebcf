"""The run-time estimate without the hardware: fake step, caching-allocator simulator, memory
models."""
