"""Measurements: memory meters (``memory``), step timing (``timing``), the report schema
(``report``); the benchmark runner builds on them."""
