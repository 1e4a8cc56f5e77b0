"""Benchmarks (run as scripts; see each module's docstring)."""
