"""Data: synthetic CLD-like events as TFDS ArrayRecord data sets, the reader (also of the real
data sets), interleaved-shard sampling, padding and tracker-neighbourhood features."""
