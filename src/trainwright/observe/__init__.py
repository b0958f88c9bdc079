"""Measuring a run: exact peak memory, FLOP counting, metrics records and files."""
