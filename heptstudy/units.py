"""Byte units used by every report, table and figure (binary: MiB = 2**20 bytes)."""

KIB = 1024
MIB = 1024**2
GIB = 1024**3
