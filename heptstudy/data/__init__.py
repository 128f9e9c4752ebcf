"""Data: synthetic CLD-like TFDS data sets, their (and the real ones') reader, sampling, batches."""
