"""Byte units used by every report, table and figure (binary: MiB = 2**20 bytes)."""

MIB = 1024**2
GIB = 1024**3
