"""Meters of a step: they measure and decide nothing (storage tracker and its allocation trace,
clocks, host usage, the host allocator's settings)."""
