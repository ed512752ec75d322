"""Judging runs: metrics, honest intervals, the comparison protocol, and tables."""
