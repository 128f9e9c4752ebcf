"""The resolved measurement and what runs it: request, bench, parity, backbone, the report
schema."""
